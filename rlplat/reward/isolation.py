"""Calling reward functions safely: result checking, and a worker process with a per-call timeout.

Reward functions are user code. Two things protect the run from them:

* :func:`~rlplat.reward.calls.check_result` turns what a function returned into a ``RewardValue`` and refuses
  anything that is not a finite number or a dict with a finite ``score`` (``None``, strings, NaN, ±inf,
  lists, tuples, ...), with a message naming the function, the sample and the value.
* :class:`RewardExecutor` is what the reward manager calls: ``run`` a function over a batch's rows (one
  outcome per row, each call's seconds), optionally giving up early by a :class:`StopRule`, and ``close``.
* :class:`ProcessExecutor` runs the functions in a separate worker process. The controller waits at most
  ``reward.timeout_s`` for each call; a call that hangs or a process that dies (segfault, ``os._exit``,
  out of memory) costs that one sample (scored 0 and counted as an error): the process is replaced and
  scoring goes on with the next sample. A worker process ends itself when the controller is gone (a
  kill -9 included): it watches its parent. :class:`InProcessExecutor` (``reward.isolation=inprocess``)
  calls the functions directly, without a timeout, for debugging.
* :class:`ProcessPool` (``reward.num_workers`` > 1) spreads a batch's calls over several such processes,
  one call at a time each, so that the calls run concurrently, each with its own deadline; it stops a
  batch early (:class:`RewardsFailing`) once so many calls failed that the step would stop anyway, or when
  the first call of every process timed out (a reward that hangs on everything).
"""

from __future__ import annotations

import os
import pickle
import pickletools
import signal
import subprocess
import sys
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlplat.reward.calls import CallOutcome, RewardFailure, Row, Timing, call_one, function_name, where
from rlplat.reward.errors import RewardConfigError, RewardsFailing, UnknownDataSourceError

# Generous because CI machines are shared (the worker itself starts in ~0.1 s).
STARTUP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class StopRule:
    """When a batch's calls may stop early (:class:`RewardsFailing`): once ``errors`` of them failed (None: never
    for that), or (``hung``) when the first call of every worker process timed out."""

    errors: int | None = None
    hung: bool = False


class RewardExecutor(ABC):
    """Runs a reward manager's functions (given when it is built, called by index) on a batch's rows."""

    @abstractmethod
    def run(self, fn_index: int, rows: Sequence[Row], first_index: int = 0, stop: StopRule | None = None,
            timings: list[Timing | None] | None = None) -> list[CallOutcome]:
        """One :data:`~rlplat.reward.calls.CallOutcome` per row of function ``fn_index`` (the rows are samples
        ``first_index``, ``first_index + 1``, ...); ``timings`` (one slot per row) gets each call's seconds and
        whether it timed out. The process pool honours ``stop`` (None: run every call); the in-process and
        single-process executors run every call, and :func:`rlplat.reward.batch.score_batch` applies
        ``reward.fail_fraction_to_stop`` to the finished batch. :class:`UnknownDataSourceError` propagates."""

    def close(self) -> None:
        """Stop the worker processes, if any."""


class InProcessExecutor(RewardExecutor):
    """Calls the functions in the controller process (no timeout, no crash isolation)."""

    def __init__(self, functions: Sequence[Callable], names: Sequence[str]):
        self.functions, self.names = list(functions), list(names)

    def run(self, fn_index: int, rows: Sequence[Row], first_index: int = 0, stop: StopRule | None = None,
            timings: list[Timing | None] | None = None) -> list[CallOutcome]:
        fn, name = self.functions[fn_index], self.names[fn_index]
        out = []
        for i, row in enumerate(rows):
            start = time.perf_counter()
            out.append(call_one(fn, name, first_index + i, row))
            if timings is not None:
                timings[i] = (time.perf_counter() - start, False)
        return out


def _spec(fn: Callable) -> tuple:
    """How the worker process gets ``fn``: a custom file is loaded again there, anything else pickled."""
    source = getattr(fn, "__rlplat_source__", None)
    if source is not None:
        return ("file", *source)
    try:
        return ("pickle", pickle.dumps(fn))
    except Exception as err:

        raise RewardConfigError(f"reward function {function_name(fn)!r} cannot be sent to the reward worker "
                                f"process ({err}); define it at module level or set reward.isolation=inprocess"
                                ) from None


def _names_main(pickled: bytes) -> bool:
    """Whether a pickle refers to something defined in the ``__main__`` module (a script's function)."""
    return any(arg == "__main__" for _, arg, _ in pickletools.genops(pickled))


def _main_preparation(specs: list[tuple]) -> dict:
    """How the worker process recreates the controller's ``__main__`` module, as multiprocessing's spawn
    does, when a pickled function lives there; empty otherwise (the worker then runs no script code)."""
    if not any(kind == "pickle" and _names_main(data) for kind, data, *_ in specs):
        return {}
    from multiprocessing import spawn

    data = spawn.get_preparation_data("rlplat-reward")
    return {key: data[key] for key in ("init_main_from_path", "init_main_from_name") if key in data}


def _exit_with_parent(interval_s: float = 0.5) -> None:
    """A daemon thread that ends this process once its parent is gone (the process is then re-parented):
    a reward call stuck in user code must not outlive a controller killed with SIGKILL."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="rlplat-parent-watch", daemon=True).start()


def serve(fd: int) -> None:
    """The worker process (started as ``python -c BOOT fd``): read the functions from the socket ``fd``,
    load them, then answer ``(fn_index, first_index, rows)`` requests with one
    :data:`~rlplat.reward.calls.CallOutcome` per row, in order, as each is computed (a ``config_error``
    failure where ``auto`` has no scorer for the row's data_source)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
    _exit_with_parent()
    from multiprocessing.connection import Connection

    from rlplat.reward.scorers import load_custom_function

    conn = Connection(fd)
    path, main, specs, names = conn.recv()
    sys.path[:0] = [p for p in path if p not in sys.path]
    try:
        if main:
            from multiprocessing import spawn

            spawn.prepare(main)
        functions = [load_custom_function(s[1], s[2]) if s[0] == "file" else pickle.loads(s[1]) for s in specs]
    except Exception as err:
        conn.send(("error", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        fn_index, first, rows = request
        for i, row in enumerate(rows):
            try:
                conn.send(call_one(functions[fn_index], names[fn_index], first + i, row))
            except UnknownDataSourceError as err:
                conn.send(RewardFailure("config_error", str(err)))


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()  # nothing when it has already exited
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


#: the worker process's command: ``python -c BOOT <socket fd>``
BOOT = "import sys; from rlplat.reward.isolation import serve; serve(int(sys.argv[1]))"
#: set in the worker process's environment
WORKER_ENV = "RLPLAT_REWARD_WORKER"


class ProcessExecutor(RewardExecutor):
    """Runs the functions in a worker process; each call gets at most ``timeout_s`` seconds.

    The worker is a fresh interpreter (``subprocess``, not ``fork``, which would copy Ray's and torch's
    threads) that imports only this module and the reward functions; nor multiprocessing's ``spawn``, which
    re-imports the controller's whole script and starts a resource-tracker process as well."""

    def __init__(self, functions: Sequence[Callable], names: Sequence[str], timeout_s: float):
        if os.environ.get(WORKER_ENV):

            raise RewardConfigError("the reward worker process runs the script that defines a reward function "
                                    "to load it, and the script started a run there: put the script's start "
                                    "under `if __name__ == \"__main__\":`")
        self.specs, self.names, self.timeout_s = [_spec(fn) for fn in functions], list(names), float(timeout_s)
        self._proc: subprocess.Popen | None = None
        self._conn = None
        self._finalizer = None

    def _start(self) -> None:
        from multiprocessing import Pipe

        import rlplat

        self._conn, child = Pipe()
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(rlplat.__file__)))
        env = {**os.environ, WORKER_ENV: "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        try:
            self._proc = subprocess.Popen([sys.executable, "-c", BOOT, str(child.fileno())], env=env,
                                          pass_fds=[child.fileno()], stdin=subprocess.DEVNULL,
                                          start_new_session=True)  # a Ctrl-C in the terminal is the controller's
        except BaseException:
            self._stop()
            raise
        finally:
            child.close()
        self._finalizer = weakref.finalize(self, _kill, self._proc)  # at exit too
        path = [os.path.abspath(p) for p in sys.path]  # "" is the working directory, which the worker shares
        try:
            self._conn.send((path, _main_preparation(self.specs), self.specs, self.names))
            if not self._conn.poll(STARTUP_TIMEOUT_S):
                kind, message = "error", f"it did not start within {STARTUP_TIMEOUT_S:.0f} s"
            else:
                kind, message = self._conn.recv()
        except (EOFError, OSError):
            kind, message = "error", f"it exited with code {self._exit_code()} while loading the functions"
        if kind != "ready":
            self._stop()
            raise RewardConfigError(f"the reward worker process could not load the reward functions: {message}")

    def _exit_code(self) -> int | None:
        try:
            return self._proc.wait(5)
        except subprocess.TimeoutExpired:
            return None

    def _stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # kills and reaps the process
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = self._finalizer = None

    def ensure_started(self) -> None:
        """Start the worker process if none is running (:meth:`run` does it too, when needed)."""
        if self._proc is None:
            self._start()

    def run(self, fn_index: int, rows: Sequence[Row], first_index: int = 0, stop: StopRule | None = None,
            timings: list[Timing | None] | None = None) -> list[CallOutcome]:
        """A call's seconds in ``timings`` run from the request (or the previous answer) to its answer, from a
        running worker process: starting or restarting one, ~2 s, is not the function's time. A call whose
        process died (killed from outside, say) is made once more in a fresh process; dying again, it is a
        failed call."""
        out: list[CallOutcome] = []
        retried = -1  # the row whose call is being made again
        while len(out) < len(rows):
            self.ensure_started()
            start = len(out)
            self._conn.send((fn_index, first_index + start, list(rows[start:])))
            clock = time.perf_counter()
            for i in range(start, len(rows)):
                failure = self._receive(fn_index, first_index + i, rows[i], out)
                now = time.perf_counter()
                if timings is not None:
                    timings[i] = (now - clock, failure is not None and failure.kind == "timeout")
                clock = now
                if failure is not None:  # the process is gone: restart it for the rest
                    self._stop()
                    if failure.kind == "crash" and retried != i:
                        retried = i  # once more, in the fresh process
                    else:
                        out.append(failure)
                    break
        for outcome in out:
            if isinstance(outcome, RewardFailure) and outcome.kind == "config_error":
                raise UnknownDataSourceError(outcome.message)
        return out

    def _receive(self, fn_index: int, index: int, row: Row, out: list) -> RewardFailure | None:
        """Append the next outcome to ``out``; or return the failure when the call timed out or the process
        died."""
        name = self.names[fn_index]
        if not self._conn.poll(self.timeout_s):
            return RewardFailure("timeout", f"{where(name, index, row)} did not return within "
                                            f"reward.timeout_s={self.timeout_s:g} s; the reward worker process "
                                            f"was restarted")
        try:
            out.append(self._conn.recv())
        except (EOFError, ConnectionError):
            return RewardFailure("crash", f"{where(name, index, row)} killed the reward worker process (exit code "
                                          f"{self._exit_code()}), and again when made once more in a fresh one")
        return None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
        self._stop()


class _PoolBatch:
    """One :meth:`ProcessPool.run`'s shared state: the next row to hand out, the outcomes, the errors, and the
    stop. The first round (each process's first call) decides whether a reward hangs on everything: a process
    whose first call timed out starts no second one until the others' first calls are in, so such a batch
    stops after one deadline, not two."""

    def __init__(self, rows: Sequence[Row], processes: int, stop: StopRule):
        self.rows, self.processes, self.stop_after_errors, self.give_up = rows, processes, stop.errors, stop.hung
        self.out: list[CallOutcome | None] = [None] * len(rows)
        self.next, self.errors, self.first_error, self.why = 0, 0, "", ""
        self.first_round: list[bool] = []  # whether each process's first call timed out
        self.round_size = processes  # the processes that have a first call in this batch
        self.lock, self.stop, self.first_round_in = threading.Lock(), threading.Event(), threading.Event()

    def take(self, first_call: bool) -> int | None:
        """The next row for a process to call, or None: all handed out, or stopped."""
        with self.lock:
            if self.stop.is_set() or self.next >= len(self.rows):
                if first_call:  # this process has no call in this batch
                    self.round_size -= 1
                    self._first_round_check()
                return None
            self.next += 1
            return self.next - 1

    def record(self, outcome: CallOutcome, timed_out: bool, first_call: bool) -> None:
        with self.lock:
            if first_call:
                self.first_round.append(timed_out)
                self._first_round_check()
            if isinstance(outcome, RewardFailure):
                self.errors += 1
                self.first_error = self.first_error or outcome.message.splitlines()[0]
            if self.stop_after_errors is not None and self.errors >= self.stop_after_errors:
                self.halt(f"{self.errors} failed calls")
            elif self.give_up and len(self.first_round) == self.processes and all(self.first_round):
                self.halt(f"the first call in each of the {self.processes} reward processes timed out")
        if self.give_up and first_call and timed_out:
            self.first_round_in.wait()

    def halt(self, why: str) -> None:
        """No call starts after this (so no process waits for the first round either)."""
        self.why = self.why or why
        self.stop.set()
        self.first_round_in.set()

    def _first_round_check(self) -> None:
        if len(self.first_round) >= self.round_size:
            self.first_round_in.set()


class ProcessPool(RewardExecutor):
    """``workers`` :class:`ProcessExecutor` processes; a batch's calls are handed out one at a time to
    whichever process is free (a thread waits on each), so they run concurrently and each keeps its own
    ``timeout_s``. Outcomes come back in the rows' order."""

    def __init__(self, functions: Sequence[Callable], names: Sequence[str], timeout_s: float, workers: int):
        from concurrent.futures import ThreadPoolExecutor

        self.workers = [ProcessExecutor(functions, names, timeout_s) for _ in range(workers)]
        self.names = list(names)
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlplat-reward")
        # one batch at a time: validation scores in the controller's thread while a rollout queue may score
        # a training batch in its own (the processes' pipes carry one call each)
        self._one_batch = threading.Lock()

    def run(self, fn_index: int, rows: Sequence[Row], first_index: int = 0, stop: StopRule | None = None,
            timings: list[Timing | None] | None = None) -> list[CallOutcome]:
        """Raises :class:`RewardsFailing` as soon as ``stop`` says so; the calls still running then end at their
        deadline. ``timings`` as :meth:`ProcessExecutor.run` measures them."""
        with self._one_batch:
            return self._run(fn_index, rows, first_index, stop or StopRule(), timings)

    def _run(self, fn_index: int, rows: Sequence[Row], first_index: int, stop: StopRule,
             timings: list[Timing | None] | None) -> list[CallOutcome]:
        batch = _PoolBatch(rows, len(self.workers), stop)

        def work(executor: ProcessExecutor) -> None:
            first_call, timing = True, [None]
            while (i := batch.take(first_call)) is not None:
                executor.ensure_started()
                batch.out[i] = executor.run(fn_index, [rows[i]], first_index + i, timings=timing)[0]
                if timings is not None:
                    timings[i] = timing[0]
                batch.record(batch.out[i], timing[0][1], first_call)
                first_call = False

        def guarded(executor: ProcessExecutor) -> None:
            try:
                work(executor)
            except BaseException:  # e.g. UnknownDataSourceError: the other threads stop too, then it is raised
                batch.halt("")
                raise

        futures = [self._threads.submit(guarded, executor) for executor in self.workers]
        errors = [future.exception() for future in futures]  # waits for every thread
        if raised := next((e for e in errors if e is not None), None):
            raise raised
        done = sum(o is not None for o in batch.out)
        if done < len(rows):  # stopped early
            raise RewardsFailing(f"reward function {self.names[fn_index]!r}: {batch.why} after {done} of "
                                 f"{len(rows)} calls; the rest were not waited for", batch.errors, batch.first_error)
        return batch.out

    def close(self) -> None:
        for executor in self.workers:
            executor.close()
        self._threads.shutdown(wait=False, cancel_futures=True)
