"""Importing user code a setting names (``pkg.module:function``), from the working directory as ``python -m`` does.

``python -m lit_entropy`` puts the working directory first on ``sys.path``; the ``lit-entropy`` console script
puts its own ``bin/`` directory there instead, so a ``my_rewards.py`` beside the data imported with one command
and not with the other. :func:`import_object` makes both behave as ``python -m`` does: when the module itself
is not found on ``sys.path``, the working directory is put in front (once) and the import tried again. A
module that is still missing is named with where it was looked for and how to make it importable.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from types import ModuleType
from typing import Any

__all__ = ["import_module_here", "import_object", "split_import_path"]


def split_import_path(spec: str) -> tuple[str, str]:
    """``("pkg.module", "attr.sub")`` of ``"pkg.module:attr.sub"`` or of ``"pkg.module.attr"`` (the last dot)."""
    if ":" in spec:
        module_name, _, attr_path = spec.partition(":")
    else:
        module_name, _, attr_path = spec.rpartition(".")
    return module_name, attr_path


def import_module_here(module_name: str, setting: str, spec: str) -> ModuleType:
    """Import ``module_name``, looking in the working directory too when ``sys.path`` does not hold it.

    Args:
        module_name: Dotted module name, e.g. ``"my_rewards"`` or ``"my_pkg.rewards"``.
        setting: The dotted setting the name came from, for messages.
        spec: The setting's value as given, for messages.

    Raises:
        ValueError: ``<setting>: ...`` naming the module, the working directory and the fix when the module
            is found nowhere; an error raised while the module runs is named with its type and text.
    """
    top = module_name.split(".")[0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if not _is_the_module_itself(err, module_name):
            raise ValueError(f"{setting}: cannot be imported ({type(err).__name__}: {err}), got {spec!r}") from err
        here = os.getcwd()
        if _on_sys_path(here):
            raise ValueError(_not_found(setting, module_name, top, here, spec)) from err
        sys.path.insert(0, here)  # python -m's place for it: the user's files win, as they do there
        importlib.invalidate_caches()
    except Exception as err:  # whatever the module raises while it runs
        raise ValueError(f"{setting}: cannot be imported ({type(err).__name__}: {err}), got {spec!r}") from err
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if _is_the_module_itself(err, module_name):
            raise ValueError(_not_found(setting, module_name, top, here, spec)) from err
        raise ValueError(f"{setting}: cannot be imported ({type(err).__name__}: {err}), got {spec!r}") from err
    except Exception as err:  # whatever the module raises while it runs
        raise ValueError(f"{setting}: cannot be imported ({type(err).__name__}: {err}), got {spec!r}") from err


def import_object(spec: str, setting: str, instantiate_classes: bool = False) -> Any:
    """The object ``spec`` names: ``"pkg.module:attr.sub"`` or ``"pkg.module.attr"``, imported by
    :func:`import_module_here` (the working directory counts as ``python -m`` counts it).

    Args:
        spec: The import path.
        setting: The dotted setting it came from, for messages.
        instantiate_classes: A class found at the path is instantiated without arguments.

    Raises:
        ValueError: ``<setting>: ..., got <spec>`` when the module or the attribute cannot be imported.
    """
    module_name, attr_path = split_import_path(spec)
    if not module_name or not attr_path:
        raise ValueError(f"{setting}: expected an import path 'package.module:function', got {spec!r}")
    target: Any = import_module_here(module_name, setting, spec)
    try:
        for attr in attr_path.split("."):
            target = getattr(target, attr)
        if instantiate_classes and inspect.isclass(target):
            target = target()
    except Exception as err:  # AttributeError, or whatever a constructor raises
        raise ValueError(f"{setting}: cannot be imported ({type(err).__name__}: {err}), got {spec!r}") from err
    return target


def _is_the_module_itself(err: ModuleNotFoundError, module_name: str) -> bool:
    """The missing module is ``module_name`` or a package above it (not something the module imports)."""
    return err.name is not None and (module_name == err.name or module_name.startswith(err.name + "."))


def _on_sys_path(directory: str) -> bool:
    """``directory`` is searched already (``""`` and ``"."`` stand for the working directory)."""
    real = os.path.realpath(directory)
    return any(os.path.realpath(entry or ".") == real for entry in sys.path if isinstance(entry, str))


def _not_found(setting: str, module_name: str, top: str, here: str, spec: str) -> str:
    return (
        f"{setting}: no module named {module_name!r}, neither on sys.path nor in the working directory {here}; "
        f"run lit-entropy from the directory that holds {top}.py (or the package {top}/), or add that directory "
        f"to PYTHONPATH, got {spec!r}"
    )
