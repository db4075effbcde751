"""Files: the modes of what rlplat writes through a temporary name, and importing a user's Python code.

``tempfile.mkstemp``/``mkdtemp`` create private files and directories (0600/0700), and so does
``transformers``' ``save_pretrained`` for ``model.safetensors``. Renamed into place they would stay
private: colleagues on a shared filesystem could not read an exported model. :func:`plain_modes` gives
them the mode a plainly created file or directory gets under the process's umask.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from pathlib import Path
from types import ModuleType

_module_ids = itertools.count()


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def plain_modes(path: str | os.PathLike) -> None:
    """Set ``path`` (and, for a directory, everything under it) to 0666 for files and 0777 for
    directories, less the umask, as ``open``/``mkdir`` would have created them."""
    umask = current_umask()
    path = Path(path)
    entries = [path, *path.rglob("*")] if path.is_dir() else [path]
    for entry in entries:
        if entry.is_symlink():
            continue
        os.chmod(entry, (0o777 if entry.is_dir() else 0o666) & ~umask)


def import_file(file: str | os.PathLike, prefix: str) -> ModuleType:
    """Import the Python file ``file`` as a fresh module, under a unique name registered in
    ``sys.modules`` (so dataclasses and pickling inside it work), ``prefix`` naming what it is for. What
    the file raises while importing is raised as it is, after the module is unregistered."""
    import importlib.util

    file = Path(file)
    name = f"{prefix}_{re.sub(r'[^0-9a-zA-Z_]', '_', file.stem)}_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{file} is not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def import_object(spec: str, prefix: str = "rlplat_user") -> object:
    """The object ``name`` of ``"path/to/file.py:name"`` (the file imported as a fresh module, see
    :func:`import_file`) or of ``"package.module:name"`` (imported as usual). A ``ValueError`` whose message
    says what is wrong: the form, a missing file or module, an import that raised, a missing name."""
    import importlib

    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError("expected 'path/to/file.py:name' or 'package.module:name'")
    if target.endswith(".py"):
        file = Path(target)
        if not file.is_file():
            raise ValueError(f"no such file {file.resolve()}")
        where = str(file)
        load = lambda: import_file(file, prefix)  # noqa: E731
    else:
        where = f"module {target}"
        load = lambda: importlib.import_module(target)  # noqa: E731
    try:
        module = load()
    except ModuleNotFoundError as err:
        raise ValueError(f"no module {err.name!r} (not installed, not on PYTHONPATH; a file is named "
                         f"path/to/file.py)") from None
    except Exception as err:  # a user's module can fail in any way; report it as one line
        raise ValueError(f"{where} failed to import: {type(err).__name__}: {err}") from None
    if not hasattr(module, name):
        raise ValueError(f"{where} defines no {name!r}")
    return getattr(module, name)
