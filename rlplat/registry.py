"""One name -> object registry, shared by every plug-in kind of rlplat.

Advantage estimators, policy losses, loss-aggregation modes, KL estimators (and later reward functions
and engines) each own one :class:`Registry`. The rules are the same for all of them:

* ``@REG.register("name")`` adds the decorated object; a second object under a name already taken is
  refused unless ``replace=True`` is passed explicitly.
* ``REG.get("nmae")`` on a miss raises :class:`UnknownNameError` listing the known names and the closest
  match ("did you mean 'name'?").
* ``REG.names()`` is what config validation checks names against, so allowed values never drift from
  what is actually registered.
* ``with REG.temporary("name", obj):`` (or ``with REG.isolated():``) lets a test register without
  leaking the entry into other tests.
* ``REG.add_lazy("name", "package.module:Attr", requires=("pkg",), install="...")`` registers a plug-in
  whose module is imported only when ``get("name")`` asks for it, so an optional dependency (vLLM,
  SGLang) is imported only by the runs that choose it; :meth:`Registry.missing_requirements` tells
  config validation, without importing anything, that the package is absent and how to install it.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(ValueError):
    """Base class of registry errors."""


class UnknownNameError(RegistryError, KeyError):
    """A name that is not registered was asked for."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DuplicateNameError(RegistryError):
    """A name was registered twice without ``replace=True``."""


@dataclass(frozen=True)
class LazyEntry:
    """A plug-in not imported yet: ``target`` is ``"package.module:Attr"``."""

    target: str
    requires: tuple[str, ...] = ()  # top-level packages the module imports (checked before importing)
    install: str = ""  # the command that installs them, shown when one is missing


class Registry(Generic[T]):
    """A mapping from names to plug-ins of one kind (e.g. ``"advantage estimator"``)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str | None = None, *, replace: bool = False) -> Callable[[T], T]:
        """Decorator: register the object under ``name`` (default: its ``__name__``)."""

        def decorator(obj: T) -> T:
            self.add(name or obj.__name__, obj, replace=replace)
            return obj

        return decorator

    def add(self, name: str, obj: T, *, replace: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if name in self._entries and not replace and self._entries[name] is not obj:
            raise DuplicateNameError(
                f"{self.kind} {name!r} is already registered (by {_describe(self._entries[name])}); "
                f"pass replace=True to override it on purpose"
            )
        self._entries[name] = obj

    def add_lazy(
        self, name: str, target: str, *, requires: tuple[str, ...] = (), install: str = "", replace: bool = False
    ) -> None:
        """Register ``target`` (``"package.module:Attr"``) under ``name``, importing it on first :meth:`get`."""
        if ":" not in target:
            raise RegistryError(f"lazy {self.kind} {name!r}: target must be 'package.module:Attr', got {target!r}")
        self.add(name, LazyEntry(target, tuple(requires), install), replace=replace)

    def missing_requirements(self, name: str) -> str | None:
        """For a lazy entry whose required packages are not installed: one line saying which and how to
        install them; otherwise None. Imports nothing."""
        entry = self._entries.get(name)
        if not isinstance(entry, LazyEntry):
            return None
        missing = [pkg for pkg in entry.requires if importlib.util.find_spec(pkg) is None]
        if not missing:
            return None
        how = f"; install it with: {entry.install}" if entry.install else ""
        return f"{self.kind} {name!r} needs the package {', '.join(repr(m) for m in missing)}, which is not installed{how}"

    def _resolve(self, name: str, entry: LazyEntry, require_installed: bool = True) -> T:
        problem = self.missing_requirements(name)
        if problem and require_installed:
            raise RegistryError(problem)
        module_name, _, attr = entry.target.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise RegistryError(f"{self.kind} {name!r} could not be imported from {entry.target}: {err}") from err
        if not problem:  # a class imported without its package stays lazy: the next get still says what is missing
            self._entries[name] = obj
        return obj

    def remove(self, name: str) -> T:
        if name not in self._entries:
            raise self.unknown(name)
        return self._entries.pop(name)

    def get(self, name: str, *, require_installed: bool = True) -> T:
        """The object registered under ``name`` (a lazy entry imported now). ``require_installed=False`` imports
        a lazy entry whose required packages are missing, for what it can tell without them (an engine class
        whose module imports its package only when an engine is built)."""
        try:
            entry = self._entries[name]
        except (KeyError, TypeError):
            raise self.unknown(name) from None
        return self._resolve(name, entry, require_installed) if isinstance(entry, LazyEntry) else entry

    __getitem__ = get  # REGISTRY[name], as for a dict (an unknown name: UnknownNameError, a KeyError)

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))

    def suggestion(self, name: object, candidates: tuple[str, ...] | None = None) -> str:
        """The "did you mean ...? known: ..." tail of an error message about ``name``."""
        candidates = self.names() if candidates is None else candidates
        close = difflib.get_close_matches(str(name), candidates, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{hint}known: {', '.join(candidates) or '(none)'}"

    def unknown(self, name: object, candidates: tuple[str, ...] | None = None) -> UnknownNameError:
        return UnknownNameError(f"unknown {self.kind} {name!r}; {self.suggestion(name, candidates)}")

    @contextlib.contextmanager
    def temporary(self, name: str, obj: T, *, replace: bool = False) -> Iterator[T]:
        """Register ``obj`` for the duration of a ``with`` block, then restore the previous state."""
        with self.isolated():
            self.add(name, obj, replace=replace)
            yield obj

    @contextlib.contextmanager
    def isolated(self) -> Iterator[Registry[T]]:
        """Whatever is registered or removed inside the block is undone when it exits."""
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={list(self.names())})"


def _describe(obj: object) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(obj)
