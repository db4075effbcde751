"""Running untrusted programs: a separate process with time, memory, output, process and network limits.

Used by the ``code`` reward (a response's program against a row's tests) and by the agent's Python tool.
:func:`run_python` runs a program's source, :func:`run_command` any command, each in a fresh temporary
working directory that is deleted afterwards::

    result = run_python("print(input()[::-1])", stdin="abc\\n", limits=SandboxLimits(timeout_s=5))
    result.status   # "ok" | "error" (exit code != 0) | "timeout" | "output_limit" | "killed" (a signal)
    result.stdout   # "cba\\n", at most limits.max_output_bytes of stdout and stderr together

What binds, and where:

* **Time**: ``timeout_s`` of wall-clock time, after which the program's whole process group is killed
  (``status="timeout"``); a CPU-time limit of the same length backs it up.
* **Memory**: ``RLIMIT_AS`` of ``memory_mb`` (address space: an allocation past it fails, so Python raises
  ``MemoryError``). Binds for every user.
* **Output**: stdout and stderr are read as they come; past ``max_output_bytes`` together the program is
  killed (``status="output_limit"``) and what was read is kept. Files it writes: ``RLIMIT_FSIZE``.
* **Processes and users**: run as root (CI machines and most containers), rlimits alone do not bind for the
  process count, so the program runs under its own unprivileged uid (``SANDBOX_UID_BASE`` + a slot held
  with a lock file, one per concurrent sandbox), where ``RLIMIT_NPROC`` bounds a fork bomb, it cannot
  write the trainer's files, and every process left with that uid afterwards (one that escaped the process
  group with ``setsid``) is killed. Run as an ordinary user, the program runs as that user: the time,
  memory and output limits bind, the process count does not (it would count all of the user's threads).
* **Network**: a new, empty network namespace (only a loopback that is down), as root or through an
  unprivileged user namespace where the kernel allows one; where neither works the program runs with the
  network and :func:`isolation_report` says so.
* The program gets a minimal environment (``PATH``, ``HOME`` = its working directory, UTF-8 I/O), no
  inherited file descriptors, and dies with its caller (``PR_SET_PDEATHSIG``).

It is a process sandbox, not a container: the program can read what every user may read. For untrusted
code at scale, run the reward workers in a container as well.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

#: the first uid of the unprivileged users sandboxes run as when started by root (one per slot)
SANDBOX_UID_BASE = 61000
SANDBOX_SLOTS = 256
_SLOT_DIR = os.path.join(tempfile.gettempdir(), "rlplat-sandbox-slots")
_ENOUGH_FOR_PYTHON_MB = 64  # an address-space limit below this fails at the interpreter's start


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall-clock seconds
    memory_mb: int = 512  # address space
    max_output_bytes: int = 64 * 1024  # stdout + stderr together
    max_processes: int = 64  # processes and threads (binds when started by root: own uid)
    max_file_mb: int = 16  # size of any file the program writes
    network: bool = False  # False = an empty network namespace

    def __post_init__(self):
        problems = [f"{key} must be > 0, got {getattr(self, key)}" for key in
                    ("timeout_s", "memory_mb", "max_output_bytes", "max_processes", "max_file_mb")
                    if not getattr(self, key) > 0]
        if self.memory_mb < _ENOUGH_FOR_PYTHON_MB:
            problems.append(f"memory_mb must be >= {_ENOUGH_FOR_PYTHON_MB} (a Python interpreter needs that much "
                            f"address space to start), got {self.memory_mb}")
        if problems:
            raise ValueError("sandbox limits: " + "; ".join(problems))


@dataclass
class SandboxResult:
    status: str  # ok | error | timeout | output_limit | killed
    exit_code: int | None  # the exit status; -N for a signal N; None when the sandbox killed it
    stdout: str
    stderr: str
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        """One line for a log or a tool result: what happened and how long it took."""
        what = {"ok": "exited with 0", "error": f"exited with {self.exit_code}", "timeout": "ran out of time",
                "output_limit": "wrote more output than allowed", "killed": f"was killed by signal {-(self.exit_code or 0)}"}
        return f"the program {what.get(self.status, self.status)} after {self.wall_s:.2f} s"


# The first program in the sandbox: it applies the limits to itself, then becomes the command (execve).
# It runs as `python -I -S -c BOOT <settings json> <command...>`, importing nothing from site-packages.
BOOT = r"""
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1]); argv = sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
if not cfg["network"]:
    NEWNET, NEWUSER = 0x40000000, 0x10000000
    if libc.unshare(NEWNET) != 0 and (cfg["uid"] is not None or libc.unshare(NEWUSER | NEWNET) != 0):
        if cfg["require_isolation"]:
            os.write(2, b"rlplat sandbox: no network namespace could be created\n"); os._exit(126)
for name, value in cfg["limits"]:
    resource.setrlimit(getattr(resource, name), (value, value))
if cfg["uid"] is not None:
    os.setgroups([]); os.setgid(cfg["uid"]); os.setuid(cfg["uid"])
libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, after the uid change (which clears it)
if os.getppid() != cfg["parent"]:
    os._exit(126)
os.chdir(cfg["cwd"])
os.execve(argv[0], argv, cfg["env"])
"""


def _as_root() -> bool:
    return os.geteuid() == 0


def _runnable_by_others(path: str) -> bool:
    """Whether a user with no rights but "other"'s can run ``path``: every directory on the way searchable,
    the file readable and executable."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        if not os.stat(os.sep.join(parts[:i])).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o005 == 0o005)


def python_interpreter() -> str:
    """The Python the sandboxed program runs with: this process's interpreter when the sandbox's user can
    run it, else the system's ``python3`` (started by root, the sandbox's uid cannot enter e.g. ``/root``
    where pyenv puts interpreters); a :class:`RuntimeError` naming both when there is none."""
    if not _as_root() or _runnable_by_others(sys.executable):
        return sys.executable
    for directory in ("/usr/local/bin", "/usr/bin", "/bin"):
        candidate = os.path.join(directory, "python3")
        if os.path.exists(candidate) and _runnable_by_others(candidate):
            return candidate
    raise RuntimeError(f"the sandbox runs programs under an unprivileged user, who cannot run this process's "
                       f"interpreter {sys.executable} (a directory on its path is private) and no python3 in "
                       f"/usr/local/bin, /usr/bin or /bin is runnable by every user; install one")


@contextlib.contextmanager
def _uid_slot() -> Iterator[int | None]:
    """An unprivileged uid no other sandbox on this machine uses now (started by root), else None."""
    if not _as_root():
        yield None
        return
    os.makedirs(_SLOT_DIR, mode=0o700, exist_ok=True)
    start = os.getpid() % SANDBOX_SLOTS  # concurrent callers start at different slots
    for k in range(SANDBOX_SLOTS):
        slot = (start + k) % SANDBOX_SLOTS
        fd = os.open(os.path.join(_SLOT_DIR, f"{slot}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            uid = SANDBOX_UID_BASE + slot
            _kill_uid(uid)  # left over by a caller that was killed itself
            yield uid
        finally:
            os.close(fd)  # releases the lock
        return
    raise RuntimeError(f"all {SANDBOX_SLOTS} sandbox slots are in use")


def _processes_of(uid: int) -> list[int]:
    """The pids whose real uid is ``uid`` (read from /proc; zombies included: they count for RLIMIT_NPROC)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as status:
                real_uid = next((line.split()[1] for line in status if line.startswith("Uid:")), None)
        except OSError:  # gone meanwhile
            continue
        if real_uid == str(uid):
            found.append(int(entry))
    return found


def _kill_uid(uid: int, wait_s: float = 5.0) -> None:
    """SIGKILL every process of ``uid`` and wait (up to ``wait_s``) until they are reaped, so that the next
    sandbox of this slot starts with its whole process allowance."""
    deadline = time.monotonic() + wait_s
    while (pids := _processes_of(uid)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_command(argv: Sequence[str], stdin: str = "", limits: SandboxLimits = SandboxLimits(),
                files: dict[str, str] | None = None, require_isolation: bool = False) -> SandboxResult:
    """Run ``argv`` in the sandbox with ``stdin`` as its input and ``files`` (name -> text) written into its
    fresh working directory first. ``require_isolation``: fail (exit 126) instead of running with the
    network when no network namespace can be made."""
    workdir = tempfile.mkdtemp(prefix="rlplat-sandbox-")
    try:
        with _uid_slot() as uid:
            for name, text in (files or {}).items():
                with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
                    f.write(text)
            if uid is not None:
                for path in (workdir, *(os.path.join(workdir, name) for name in files or {})):
                    os.chown(path, uid, uid)
            try:
                return _run(list(argv), stdin, limits, workdir, uid, require_isolation)
            finally:
                if uid is not None:
                    _kill_uid(uid)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_python(source: str, stdin: str = "", limits: SandboxLimits = SandboxLimits(),
               require_isolation: bool = False) -> SandboxResult:
    """Run the Python program ``source`` (as ``main.py`` in its working directory) in the sandbox."""
    return run_command([python_interpreter(), "-I", "main.py"], stdin, limits, {"main.py": source},
                       require_isolation)


def _settings(limits: SandboxLimits, workdir: str, uid: int | None, require_isolation: bool) -> str:
    rlimits = [("RLIMIT_AS", limits.memory_mb << 20), ("RLIMIT_CPU", int(limits.timeout_s) + 1),
               ("RLIMIT_FSIZE", limits.max_file_mb << 20), ("RLIMIT_NOFILE", 256), ("RLIMIT_CORE", 0)]
    if uid is not None:
        rlimits.append(("RLIMIT_NPROC", limits.max_processes))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}
    return json.dumps({"network": limits.network, "uid": uid, "limits": rlimits, "parent": os.getpid(),
                       "cwd": workdir, "env": env, "require_isolation": require_isolation})


class _Output:
    """What a program writes to its pipes (stdout, stderr), kept up to ``limit`` bytes in all."""

    def __init__(self, streams, limit: int):
        self.chunks: dict = {stream: [] for stream in streams}
        self.limit, self.total = limit, 0

    @property
    def over(self) -> bool:
        return self.total > self.limit

    def read(self, stream) -> bytes | None:
        """What ``stream`` has now (b"" at its end, None when nothing is there yet), kept up to the limit."""
        try:
            data = os.read(stream.fileno(), 65536)
        except BlockingIOError:
            return None
        self.chunks[stream].append(data[: max(0, self.limit - self.total)])
        self.total += len(data)
        return data

    def text(self, stream) -> str:
        return b"".join(self.chunks[stream]).decode("utf-8", errors="replace")


def _collect(output: _Output, exited: int, deadline: float) -> str | None:
    """Read the pipes until both end, the program's first process exits, the output limit or the deadline:
    ``"output_limit"``, ``"timeout"``, or None (it ended by itself)."""
    with selectors.DefaultSelector() as selector:
        open_streams = set(output.chunks)
        for stream in open_streams:
            os.set_blocking(stream.fileno(), False)
            selector.register(stream, selectors.EVENT_READ)
        selector.register(exited, selectors.EVENT_READ)
        while open_streams and not output.over:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            ready = [key.fileobj for key, _ in selector.select(remaining)]
            for stream in open_streams.intersection(ready):
                if output.read(stream) == b"":
                    selector.unregister(stream)
                    open_streams.discard(stream)
            if exited in ready:  # keep what is in the pipes now; children still writing are not waited for
                for stream in open_streams:
                    while not output.over and output.read(stream):
                        pass
                break
    return "output_limit" if output.over else None


def _run(argv: list[str], stdin: str, limits: SandboxLimits, workdir: str, uid: int | None,
         require_isolation: bool) -> SandboxResult:
    boot = [python_interpreter(), "-I", "-S", "-c", BOOT, _settings(limits, workdir, uid, require_isolation)]
    with tempfile.TemporaryFile() as stdin_file:
        stdin_file.write(stdin.encode("utf-8"))
        stdin_file.seek(0)
        start = time.monotonic()
        proc = subprocess.Popen(boot + argv, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                close_fds=True, start_new_session=True, cwd=workdir)
    output = _Output((proc.stdout, proc.stderr), limits.max_output_bytes)
    deadline = start + limits.timeout_s
    exited = os.pidfd_open(proc.pid)  # readable once the program's first process has exited
    try:
        status = _collect(output, exited, deadline)
    finally:
        os.close(exited)
    if status is None:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            status = "timeout"
    _kill_group(proc)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    wall = time.monotonic() - start
    code = proc.returncode
    if status is None:
        status = "ok" if code == 0 else "killed" if code < 0 else "error"
    else:
        code = None
    return SandboxResult(status, code, output.text(proc.stdout), output.text(proc.stderr), wall)


def isolation_report() -> dict[str, bool | str]:
    """What binds on this machine (for docs, ``plan`` and tests): the user programs run as, whether the
    process count is bounded and whether the network is cut."""
    probe = run_python("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
                       "except OSError as err:\n    print(type(err).__name__, err.errno)\n",
                       limits=SandboxLimits(timeout_s=20))
    as_root = _as_root()
    return {"user": f"own uid from {SANDBOX_UID_BASE}" if as_root else "the caller's",
            "process_limit": as_root, "interpreter": python_interpreter(),
            "network_cut": probe.ok and "OSError 101" in probe.stdout}  # ENETUNREACH: no route, loopback down
