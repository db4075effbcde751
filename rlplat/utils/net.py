"""Network helpers."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port no socket of this machine holds now (the kernel's pick; another process may take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
