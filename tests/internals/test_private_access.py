"""Only lit_entropy.internals touches private state of other libraries' objects (an AST scan of the package).

Outside ``lit_entropy/internals/``, a ``_name`` attribute may be read or set only when the package itself
defines ``_name`` (an attribute it assigns on ``self``, a method, a class or module variable), and inside a
class only when none of its other-library base classes uses ``_name`` too: ``module._trainer``,
``self._trainer`` (inherited from Lightning), ``self._data_parallel_size = ...`` (a base's state),
``getattr(x, "_forward_cache")`` or ``from lightning... import _PATH`` anywhere else fail here, naming the
file, the line and the access.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import textwrap
from pathlib import Path

import lit_entropy

PACKAGE = Path(lit_entropy.__file__).parent
INTERNALS = PACKAGE / "internals"
ATTRIBUTE_FUNCTIONS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in {"self", "cls"}
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _sources() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _defined_names(trees: dict[Path, ast.Module]) -> set[str]:
    """Private names the package defines: on ``self``/``cls``, as functions or classes, in class or module bodies."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {name for name in names if _private(name)}


def _accesses(tree: ast.Module) -> list[tuple[int, ast.expr, str]]:
    """``(line, object, name)`` of every private attribute access, ``getattr``-style calls included."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            out.append((node.lineno, node.value, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ATTRIBUTE_FUNCTIONS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            out.append((node.lineno, node.args[0], node.args[1].value))
    return out


@functools.cache
def _names_used_by(base: type) -> frozenset[str]:
    """Private names a class of another library defines or uses on ``self``."""
    names = {name for name in vars(base) if _private(name)}
    try:
        source = textwrap.dedent(inspect.getsource(base))
    except (OSError, TypeError):  # a builtin or C extension class
        return frozenset(names)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _is_self(node.value) and _private(node.attr):
            names.add(node.attr)
    return frozenset(names)


def _foreign_names(path: Path, name: str) -> frozenset[str]:
    """Private names of the other-library base classes of class ``name`` of the package file ``path``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    try:
        module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    except ModuleNotFoundError:  # the scan's own test source
        return frozenset()
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        return frozenset()
    bases = [b for b in cls.__mro__[1:] if b is not object and not b.__module__.startswith("lit_entropy")]
    return frozenset().union(*(_names_used_by(b) for b in bases))


def _violations(trees: dict[Path, ast.Module]) -> list[str]:
    defined = _defined_names(trees)
    found = []
    for path, tree in trees.items():
        if INTERNALS in path.parents:
            continue
        where = path.relative_to(PACKAGE.parent)
        inherited = {}  # access node -> the foreign private names of its class
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            if cls.bases:
                names = _foreign_names(path, cls.name)
                inherited.update({id(node): names for node in ast.walk(cls)})
        for line, owner, name in _accesses(tree):
            foreign = _is_self(owner) and name in inherited.get(id(owner), ())
            if name not in defined or foreign:
                found.append(f"{where}:{line}: {ast.unparse(owner)}.{name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and not (node.module or "").startswith("lit_entropy")
            ):
                names = [a.name for a in node.names if _private(a.name)]
                found += [f"{where}:{node.lineno}: from {node.module} import {name}" for name in names]
    return found


def test_no_private_state_of_other_libraries_outside_internals() -> None:
    found = _violations(_sources())
    assert not found, (
        "private attributes of other libraries' objects are touched outside lit_entropy/internals/ (add or use an "
        "adapter there, pinned by a test in tests/internals/):\n" + "\n".join(found)
    )


def test_the_scan_catches_each_kind_of_access() -> None:
    """The scan itself: every form it must refuse is refused, the package's own private names are allowed."""
    source = """
from lightning.pytorch.utilities import _private_helper
class Mine(Base):
    _ours = 1
    def __init__(self):
        self._own = 0
    def hook(self, module, trainer):
        self._own += self._ours
        trainer._checkpoint_connector.hpc_save_path(".")
        getattr(module, "_trainer", None)
        return self._trainer, super()._results, other._own
"""
    tree = ast.parse(source)
    found = _violations({PACKAGE / "fake.py": tree, **_sources()})
    mine = sorted(v.split(": ", 1)[1] for v in found if v.startswith("lit_entropy/fake.py"))
    assert mine == [
        "from lightning.pytorch.utilities import _private_helper",
        "module._trainer",
        "self._trainer",
        "super()._results",
        "trainer._checkpoint_connector",
    ]


def test_the_scan_sees_a_base_classs_private_state() -> None:
    """Assigning a name on ``self`` does not make it the package's own when a base class of another library uses it."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    assert "_data_parallel_size" in _names_used_by(ModelParallelStrategy)
    fsdp2 = PACKAGE / "distributed" / "fsdp2.py"
    assert "_data_parallel_size" in _foreign_names(fsdp2, "FSDP2Strategy")
    source = "class FSDP2Strategy(ModelParallelStrategy):\n    def f(self):\n        self._data_parallel_size = 2\n"
    found = _violations({fsdp2: ast.parse(source)})
    assert found == ["lit_entropy/distributed/fsdp2.py:3: self._data_parallel_size"]
