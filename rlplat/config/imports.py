"""``trainer.imports``: the user's own modules, imported before the config's registered names are checked.

A module listed there (``trainer.imports=[my_pkg.estimators]``) registers its estimators, policy losses,
aggregation modes, KL estimators or reward functions when it is imported, so they are selectable by name
without a copied entry point and without living in this repository: the module only has to be importable
(on ``PYTHONPATH``, installed, or under the directory the command runs from).

The controller imports the modules before validation; every Ray worker imports them too before it does
any work (policy losses run inside the workers), from the same ``sys.path`` entry the controller found
them under, so a module in the user's current directory works on a local cluster as well.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from rlplat.config.errors import ConfigError


def _path_entry(module) -> str | None:
    """The ``sys.path`` entry ``module`` was found under (None for built-in / namespace-less modules)."""
    origin = getattr(module, "__file__", None)
    if origin is None:
        return None
    origin = os.path.abspath(origin)
    for entry in sys.path:
        root = os.path.abspath(entry or os.getcwd())
        if origin.startswith(root + os.sep):
            return root
    return str(Path(origin).parent)


def import_user_modules(names: Iterable[str]) -> list[tuple[str, str | None]]:
    """Import each module of ``trainer.imports``; return ``(name, sys.path entry)`` pairs for the workers.

    A module that cannot be imported is a configuration error naming the module and the cause.
    """
    imported = []
    for name in names:
        if name.endswith(".py"):
            module_name = name.removesuffix(".py").replace(os.sep, ".").strip(".")
            raise ConfigError(f"trainer.imports: {name!r} is a file name; the list takes module names, as an "
                              f"import statement does: trainer.imports=[{module_name}] (the module must be on "
                              f"PYTHONPATH, installed, or under the directory the command runs from)")
        try:
            module = importlib.import_module(name)
        except Exception as err:  # a user's module can fail in any way; report it as one line
            missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
            hint = _did_you_mean(missing, name) if missing and f"{name}.".startswith(f"{missing}.") else ""
            raise ConfigError(f"trainer.imports: cannot import {name!r}: {type(err).__name__}: {err}{hint}") from None
        imported.append((name, _path_entry(module)))
    return imported


def _did_you_mean(missing: str, name: str) -> str:
    """``"; did you mean 'x'?"`` when an importable module is named like ``missing`` (the part of ``name``
    that does not exist: the siblings in its parent package, or the top-level modules on ``sys.path``),
    with the rest of ``name`` after it; else ``""``."""
    import difflib
    import pkgutil

    parent, _, leaf = missing.rpartition(".")
    try:
        where = importlib.import_module(parent).__path__ if parent else None
    except Exception:  # a broken parent: no sibling to offer
        return ""
    found = difflib.get_close_matches(leaf, [m.name for m in pkgutil.iter_modules(where)], n=1, cutoff=0.75)
    if not found:
        return ""
    return f"; did you mean {(f'{parent}.' if parent else '') + found[0] + name[len(missing):]!r}?"


def import_in_worker(modules: Iterable[tuple[str, str | None]]) -> None:
    """Worker side of :func:`import_user_modules`: make each module's path importable, then import it."""
    for name, entry in modules:
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
        importlib.import_module(name)


def load_callable(key: str, spec: str):
    """The function a config key names as ``"pkg.module:function"`` or ``"path/to/file.py:function"``;
    any failure is a :class:`ConfigError` naming the key and the cause."""
    from rlplat.utils.files import import_object

    try:
        fn = import_object(spec)
    except ValueError as err:
        raise ConfigError(f"{key}={spec!r}: cannot load it: {err}") from None
    if not callable(fn):
        raise ConfigError(f"{key}={spec!r} is not callable (it is a {type(fn).__name__})")
    return fn
