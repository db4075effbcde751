"""The rollout pool's heartbeat (``rollout.heartbeat_s``). A rollout worker whose process stops answering (wedged
with the interpreter lock held, stopped, swapping without end) is not dead to Ray, and the calls sent to it would
wait for ever. A thread of the controller asks every worker of the pool for a heartbeat every ``heartbeat_s``
(the worker answers in a thread of its own, beside its generation and weight loads); a worker that does not answer
within ``heartbeat_s`` is killed, so its calls fail as a dead worker's do, and the rollout queue replaces it
(``rollout.max_restarts``). A worker that answers while a call of its waits for ever (a dead engine process it
waits on) is alive to the heartbeat: that is not detected."""

from __future__ import annotations

import threading

from rlplat.controller import WorkerGroup


class Heartbeat:
    """Watches ``pool`` every ``seconds`` from a thread of its own; ``lock``: held while it asks, so workers that are
    being replaced (still starting) are never asked. ``hung``: the ranks killed, until :meth:`forget`."""

    def __init__(self, pool: WorkerGroup, seconds: float, lock: threading.Lock):
        self.pool, self.seconds, self.lock = pool, seconds, lock
        self.hung: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rlplat-rollout-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def forget(self, ranks: list[int]) -> None:
        """The workers of ``ranks`` were replaced (or dropped)."""
        self.hung -= set(ranks)

    def _watch(self) -> None:
        while not self._stop.wait(self.seconds):
            with self.lock:
                try:
                    silent = self.pool.silent("heartbeat", self.seconds)
                except Exception:  # noqa: BLE001 - the run ended under it (Ray shut down): nothing left to watch
                    if self._stop.is_set():
                        return
                    raise
                if self._stop.is_set():
                    return
                for rank in silent:
                    print(f"[rollout] {self.pool.worker_cls.__name__} rank {rank} of {self.pool.world_size} answered "
                          f"no heartbeat within rollout.heartbeat_s={self.seconds:g} s: killed as hung", flush=True)
                    self.hung.add(rank)
                    self.pool.kill(rank)
