"""A registry of functions chosen by name: the mechanism behind :data:`~lit_entropy.functional.registry.POLICY_LOSSES`
and :data:`~lit_entropy.functional.registry.ADVANTAGE_ESTIMATORS` (as verl's ``core_algos`` registries).

A :class:`Registry` maps names to functions, registered by a decorator or named by an import path
``pkg.module:function`` (:func:`is_import_path`), and checks each against the call the training step makes
(:class:`ExpectedCall`), so a function that cannot be called so is refused at setup with one line.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = [
    "IMPORT_PATH_FORM",
    "ExpectedCall",
    "Registry",
    "UnknownNameError",
    "import_path_object",
    "is_import_path",
]

F = TypeVar("F", bound=Callable[..., Any])


class UnknownNameError(KeyError, ValueError):
    """A name no function is registered under. A ``KeyError`` (lookup) and a ``ValueError`` (a bad setting)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


#: How the settings' messages name the second way to give a function.
IMPORT_PATH_FORM = "an import path 'pkg.module:function'"


def is_import_path(value: object) -> bool:
    """Whether ``value`` reads ``pkg.module:function`` (dotted identifiers, one colon), as a setting may name a
    function of a user's module instead of a registered name."""
    if not isinstance(value, str) or value.count(":") != 1:
        return False
    module, function = value.split(":")
    return all(part.isidentifier() for part in (*module.split("."), *function.split(".")))


def import_path_object(spec: str, setting: str) -> Any:
    """The object ``pkg.module:function`` names (:func:`importlib.import_module`, then the attributes).

    The settings pass their own importer to :meth:`Registry.check` (it also looks in the working directory, as
    ``python -m`` does); this plain one serves a lookup in a process that did not build the settings.

    Raises:
        ValueError: ``<setting>: cannot be imported (...), got <spec>``.
    """
    module_name, _, attr_path = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for attr in attr_path.split("."):
            target = getattr(target, attr)
    except Exception as err:  # ImportError, AttributeError, or whatever the module raises while it runs
        raise ValueError(f"{setting}: cannot be imported ({type(err).__name__}: {err}), got {spec!r}") from err
    return target


@dataclass(frozen=True)
class ExpectedCall:
    """How the training step calls every function of a registry: ``positional`` arguments, then ``keywords`` (plus
    ``keywords_when[attribute]`` for a function registered with that attribute true).

    A function fits when it accepts that call (:meth:`inspect.Signature.bind`): it may take ``**extra`` instead of the
    keywords it does not read.
    """

    positional: tuple[str, ...]
    keywords: tuple[str, ...]
    keywords_when: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def keywords_for(self, attributes: dict[str, Any]) -> tuple[str, ...]:
        """The keywords a function registered with ``attributes`` receives."""
        extra = (key for attribute, keys in self.keywords_when.items() if attributes.get(attribute) for key in keys)
        return (*self.keywords, *extra)

    def describe(self, attributes: dict[str, Any] | None = None) -> str:
        """The call as a signature: ``(a, b, *, c, d, **extra)``."""
        return f"({', '.join(self.positional)}, *, {', '.join(self.keywords_for(attributes or {}))}, **extra)"


class Registry(Generic[F]):
    """Functions by name, in registration order.

    A function can also be named by its import path ``pkg.module:function`` without being registered: :meth:`check`
    imports it (once), checks it against the registry's :class:`ExpectedCall` and keeps it under the path, which
    then works wherever a name does; :meth:`names` lists the registered names only.

    Args:
        kind: what the functions are, for messages (``"policy loss"``).
        call: how the training step calls the functions; None = not checked.
    """

    def __init__(self, kind: str, call: ExpectedCall | None = None) -> None:
        self.kind = kind
        self.call = call
        self._functions: dict[str, F] = {}
        self._attributes: dict[str, dict[str, Any]] = {}
        self._imported: dict[str, F] = {}  # import path -> function, filled by check()

    def register(self, name: str, **attributes: Any) -> Callable[[F], F]:
        """Decorator registering a function under ``name`` (with optional ``attributes``); returns it unchanged.

        Raises:
            ValueError: ``name`` is not a non-empty string, or is already registered.
        """
        if not isinstance(name, str) or not name or name != name.strip():
            raise ValueError(f"a {self.kind} name must be a non-empty string without surrounding spaces, got {name!r}")
        if name in self._functions:
            taken = self._functions[name]
            raise ValueError(
                f"a {self.kind} named {name!r} is already registered ({taken.__module__}.{taken.__qualname__}); "
                "pick another name"
            )

        def decorator(function: F) -> F:
            if not callable(function):
                raise TypeError(f"only a callable can be registered as a {self.kind}, got {function!r}")
            if name in self._functions:  # registered between the call and the decoration
                raise ValueError(f"a {self.kind} named {name!r} is already registered")
            self._functions[name] = function
            self._attributes[name] = dict(attributes)
            return function

        return decorator

    def unregister(self, name: str) -> F:
        """Remove ``name`` (or a checked import path) and return its function (tests and notebooks that re-register or
        edit the module: the path is imported again by the next :meth:`check`)."""
        if name in self._imported:
            return self._imported.pop(name)
        function = self[name]
        del self._functions[name]
        del self._attributes[name]
        return function

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._functions)

    def attributes(self, name: str) -> dict[str, Any]:
        """The attributes ``name`` was registered with (a copy); an import path has those of the name its function is
        also registered under, else none."""
        return self._attributes_of(name, self[name])

    def _attributes_of(self, name: str, function: Any) -> dict[str, Any]:
        if name not in self._functions:  # an import path: the attributes of a name the same function has, if any
            name = next((known for known, f in self._functions.items() if f is function), name)
        return dict(self._attributes.get(name, {}))

    def check(self, setting: str, value: Any, *, importer: Callable[[str, str], Any] | None = None) -> str:
        """Return ``value`` if it names a function of this registry, else raise naming ``setting`` and the value.

        A registered name is checked against :attr:`call`; an import path ``pkg.module:function`` is imported the first
        time (by ``importer(value, setting)``, default :func:`import_path_object`) and checked too.

        Raises:
            UnknownNameError: ``value`` is neither a registered name nor an import path (the message lists the names).
            ValueError: the function cannot be imported, or cannot be called as the training step calls it.
        """
        if not isinstance(value, str) or (value not in self._functions and not is_import_path(value)):
            raise UnknownNameError(
                f"{setting} must be a registered {self.kind}, one of {self.names()}, or {IMPORT_PATH_FORM}, "
                f"got {value!r}{self._hint}"
            )
        if value in self._functions:
            self.check_call(setting, value)
        elif value not in self._imported:
            function = (importer or import_path_object)(value, setting)
            self._check_signature(setting, value, function)
            self._imported[value] = function
        return value

    def check_call(self, setting: str, name: str) -> None:
        """Refuse the function ``name`` (a registered name or a checked import path) if the training step cannot call
        it as :attr:`call` describes, with one line naming ``setting`` and ``name``."""
        self._check_signature(setting, name, self[name])

    def _check_signature(self, setting: str, value: str, function: Any) -> None:
        if not callable(function):
            raise ValueError(f"{setting}={value!r} must name a function, got {type(function).__name__} {function!r}")
        if self.call is None:
            return
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):  # a callable without a readable signature (a builtin): cannot be checked
            return
        attributes = self._attributes_of(value, function)
        try:
            signature.bind(*self.call.positional, **dict.fromkeys(self.call.keywords_for(attributes)))
        except TypeError as err:
            raise ValueError(
                f"{setting}={value!r} cannot take the {self.kind} call {self.call.describe(attributes)}: {err}"
            ) from None

    @property
    def _hint(self) -> str:
        return f" (add one with @lit_entropy.functional.register_{self.kind.replace(' ', '_')}(name))"

    def __getitem__(self, name: str) -> F:
        if name in self._functions:
            return self._functions[name]
        if name in self._imported:
            return self._imported[name]
        if is_import_path(name):  # settings checked in another process (a spawned worker): import it here too
            self.check(self.kind, name)
            return self._imported[name]
        raise UnknownNameError(
            f"no {self.kind} is registered as {name!r}; registered: {self.names()}, or give {IMPORT_PATH_FORM}"
            f"{self._hint}"
        )

    def __contains__(self, name: object) -> bool:
        return name in self._functions or name in self._imported

    def __iter__(self) -> Iterator[str]:
        return iter(self._functions)

    def __len__(self) -> int:
        return len(self._functions)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
