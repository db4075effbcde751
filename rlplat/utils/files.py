"""File modes of what rlplat writes through a temporary name.

``tempfile.mkstemp``/``mkdtemp`` create private files and directories (0600/0700), and so does
``transformers``' ``save_pretrained`` for ``model.safetensors``. Renamed into place they would stay
private: colleagues on a shared filesystem could not read an exported model. :func:`plain_modes` gives
them the mode a plainly created file or directory gets under the process's umask.
"""

from __future__ import annotations

import os
from pathlib import Path


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
