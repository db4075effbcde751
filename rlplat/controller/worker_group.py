"""Worker groups: N workers of one class that the controller drives as one object.

``group.method(batch)`` looks up ``method``'s dispatch mode (see :mod:`rlplat.controller.dispatch`),
splits the arguments over the workers, runs them concurrently and collects the answers.

* :class:`RayWorkerGroup` starts one Ray actor per bundle of a :class:`ResourcePool` (one device each;
  across nodes when the pool spans nodes), then joins them into one torch.distributed process group
  (gloo on CPU, nccl on GPU).
* :class:`InProcessWorkerGroup` runs a single worker in this process, with no Ray at all: for
  debugging and for machines without Ray. The worker code and dispatch are the same.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from rlplat.controller.dispatch import collect_results, split_arguments
from rlplat.controller.resource_pool import ResourcePool
from rlplat.utils.errors import NotPlaced, RunError, WorkerDied
from rlplat.engines import ParallelLayout
from rlplat.workers.base import Dispatch, Worker, concurrency_group, dispatch_mode


#: the worker calls that (re)build a worker's engines, and with them its place among the replicas
LAYOUT_SETTING_CALLS = frozenset({"init_model"})


class Pending:
    """A worker-group call under way (:meth:`WorkerGroup.submit`): :meth:`result` waits for it and returns what
    :meth:`WorkerGroup.call` would have, raising the workers' errors the same way."""

    def __init__(self, finish: Callable[[], Any], ready: Callable[[], bool] | None = None):
        self._finish, self._ready, self._value, self._done = finish, ready, None, False

    def done(self) -> bool:
        """Whether :meth:`result` returns (or raises) without waiting."""
        return self._done or (self._ready is not None and self._ready())

    def result(self) -> Any:
        if not self._done:
            self._value, self._done = self._finish(), True
        return self._value


class WorkerGroup(ABC):
    def __init__(self, worker_cls: type[Worker]):
        self.worker_cls = worker_cls
        self._layouts: list[ParallelLayout] | None = None

    @property
    @abstractmethod
    def world_size(self) -> int: ...

    @abstractmethod
    def _start(self, name: str, per_rank: list[tuple[tuple, dict]]) -> Pending:
        """Start ``name`` on ranks 0..len(per_rank)-1 concurrently; the results come back in rank order."""

    def call(self, name: str, *args, **kwargs) -> Any:
        return self.submit(name, *args, **kwargs).result()

    def submit(self, name: str, *args, **kwargs) -> Pending:
        """Start a call and return at once (Ray workers compute meanwhile; each worker runs its calls in the
        order they were submitted). The arguments are split and the results collected as for :meth:`call`."""
        mode = dispatch_mode(self.worker_cls, name)
        if mode is Dispatch.ONE_TO_ALL:
            if name in LAYOUT_SETTING_CALLS:
                self._layouts = None  # the engine it builds decides the layout
            return self._start(name, [(args, kwargs)] * self.world_size)
        layouts = self.layouts()
        per_worker, pad = split_arguments(mode, layouts, args, kwargs)
        started = self._start(name, per_worker)
        return Pending(lambda: collect_results(started.result(), pad, layouts))

    def submit_to(self, rank: int, name: str, *args, **kwargs) -> Pending:
        """Start ``name`` on worker ``rank`` alone, with the arguments as they are (not split): work one worker
        does by itself, e.g. a rollout worker generating a few prompt groups. :meth:`Pending.result` is that
        worker's answer."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"no worker {rank} in a group of {self.world_size}")
        return self._start_one(rank, name, args, kwargs)

    @abstractmethod
    def _start_one(self, rank: int, name: str, args: tuple, kwargs: dict) -> Pending: ...

    def layouts(self) -> list[ParallelLayout]:
        """Each worker's place among the data-parallel replicas (asked once after each set-up call). Workers that
        never talk to each other (``works_alone``) are each a replica, in the group's order (after :meth:`remove`
        not their own ranks')."""
        if self._layouts is None and self.worker_cls.works_alone:
            self._layouts = [ParallelLayout(dp_rank=rank, dp_size=self.world_size) for rank in range(self.world_size)]
        if self._layouts is None:
            self._layouts = self._start("parallel_layout", [((), {})] * self.world_size).result()
        return self._layouts

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        dispatch_mode(self.worker_cls, name)  # fail early, listing the exposed methods
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    def shutdown(self) -> None:
        """Release the workers (Ray actors are killed; in-process workers are dropped)."""


class InProcessWorkerGroup(WorkerGroup):
    """World size 1 in the calling process: no Ray, same worker code and dispatch."""

    def __init__(self, worker_cls: type[Worker], device: str, **worker_kwargs):
        import torch.distributed as dist

        super().__init__(worker_cls)
        self.worker = worker_cls(rank=0, world_size=1, device=device, **worker_kwargs)
        # Several in-process groups (actor, critic) share this process's world-size-1 process group;
        # the one that created it destroys it.
        self._owns_process_group = not dist.is_initialized()
        self.worker.setup_distributed(self.worker.master_address())

    @property
    def world_size(self) -> int:
        return 1

    def _start(self, name, per_rank):
        args, kwargs = per_rank[0]
        value = [getattr(self.worker, name)(*args, **kwargs)]  # computed now: one process, nothing to overlap
        return Pending(lambda: value)

    def _start_one(self, rank, name, args, kwargs):
        value = getattr(self.worker, name)(*args, **kwargs)
        return Pending(lambda: value, ready=lambda: True)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if self.worker is not None:
            self.worker.close()
        self.worker = None
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()


class RayWorkerGroup(WorkerGroup):
    """One Ray actor per bundle of ``pool``; ``share`` is this group's fraction of each bundle's device
    (colocated groups on one pool split it, e.g. actor+rollout+ref worker and critic worker)."""

    def __init__(self, worker_cls: type[Worker], pool: ResourcePool, share: float = 1.0,
                 imports: list[tuple[str, str | None]] | None = None, **worker_kwargs):
        import ray

        super().__init__(worker_cls)
        groups = worker_cls.concurrency_groups
        self._remote_cls = ray.remote(concurrency_groups=groups)(worker_cls) if groups else ray.remote(worker_cls)
        self.pool, self.share, self.imports, self.worker_kwargs = pool, share, imports, worker_kwargs
        self.bundles = list(range(pool.world_size))  # rank -> its bundle of the pool (fewer after remove())
        self.actors = [self._launch(index) for index in range(pool.world_size)]
        self._setup = self._joined(list(range(pool.world_size)))

    def _launch(self, rank: int):
        """A new actor for ``rank``, on its bundle of the pool (the worker's own rank is its bundle's index)."""
        bundle = self.bundles[rank]
        return self._remote_cls.options(**self.pool.actor_options(bundle, self.share)).remote(
            rank=bundle, world_size=self.pool.world_size, device=self.pool.device, **self.worker_kwargs)

    def _setup_calls(self, ranks: list[int], join: Callable) -> tuple[list, list[int]]:
        """The set-up calls of the actors of ``ranks``, queued without waiting (an actor runs its calls in order), so
        the worker processes start while the controller goes on; the group's next call waits for them and reports
        their errors. ``join(actor)``: the call that gives it its torch.distributed context."""
        actors = [self.actors[rank] for rank in ranks]
        setup = []
        if self.pool.device == "cpu":  # each worker computes with its share of its node's cores
            setup += [a.use_threads.remote(self.pool.threads_per_worker) for a in actors]
        if self.imports:  # before any work: plug-ins (e.g. a policy loss) are looked up inside the workers
            setup += [a.import_modules.remote(self.imports) for a in actors]
        setup += [join(a) for a in actors]
        return setup, ranks * (len(setup) // len(actors))

    def _joined(self, ranks: list[int]) -> tuple[list, list[int]]:
        """The set-up calls of every rank, joining one new torch.distributed process group (at rank 0's address)."""
        master = self.actors[0].master_address.remote()
        return self._setup_calls(ranks, lambda actor: actor.setup_distributed.remote(master))

    def replace(self, ranks: list[int], timeout_s: float) -> None:
        """Kill the workers of ``ranks`` (dead already, or not) and start new ones in their places, set up as at the
        start; the caller loads their models (``init_model``) and state. Every rank: a new group, with a new
        torch.distributed process group. Some: only for a worker class whose workers never talk to each other
        (:attr:`~rlplat.workers.base.Worker.works_alone`, e.g. rollout workers): the new ones join no process group
        (a torch.distributed group takes no new member). New workers that are not set up within ``timeout_s`` (their
        bundle's node left the cluster, and no other node has room for it) raise :class:`NotPlaced` naming them."""
        import ray

        ranks = sorted(set(ranks))
        if len(ranks) < len(self.actors) and not self.worker_cls.works_alone:
            raise RunError(f"{self.worker_cls.__name__} workers share a process group: they are replaced all together")
        for rank in ranks:  # the old actors' set-up, if not waited for yet, no longer matters: replaced below
            ray.kill(self.actors[rank], no_restart=True)
            self.actors[rank] = self._launch(rank)
        if len(ranks) == len(self.actors):
            self._setup = self._joined(ranks)
        else:
            self._setup = self._setup_calls(ranks, lambda actor: actor.setup_alone.remote())
        self._layouts = None
        started, _ = ray.wait(self._setup[0], num_returns=len(self._setup[0]), timeout=timeout_s)
        if missing := sorted({rank for ref, rank in zip(*self._setup) if ref not in started}):
            raise NotPlaced(f"the {self.worker_cls.__name__} workers that replace ranks {missing} did not start within "
                            f"{timeout_s:.0f} s: Ray has no room for them where their pool was placed (a node that "
                            f"left the cluster and did not come back?)", missing)
        self._set_up()

    def silent(self, method: str, timeout_s: float) -> list[int]:
        """The ranks whose workers do not answer ``method`` (no arguments) within ``timeout_s`` (a dead worker
        answers at once, with its death)."""
        import ray

        refs = [self._method(actor, method).remote() for actor in self.actors]
        answered, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        return [rank for rank, ref in enumerate(refs) if ref not in answered]

    def kill(self, rank: int) -> None:
        """End the process of worker ``rank`` (a hung one): its calls fail as a dead worker's do."""
        import ray

        ray.kill(self.actors[rank], no_restart=True)

    def remove(self, ranks: list[int]) -> None:
        """Go on without the workers of ``ranks`` (their places are gone: :class:`NotPlaced`); the others keep their
        order, renumbered from 0. Only for workers that never talk to each other (``works_alone``)."""
        import ray

        if not self.worker_cls.works_alone:
            raise RunError(f"{self.worker_cls.__name__} workers share a process group: the group cannot shrink")
        keep = [rank for rank in range(len(self.actors)) if rank not in ranks]
        for rank in ranks:
            ray.kill(self.actors[rank], no_restart=True)
        if self._setup is not None:  # the set-up calls of the workers kept, with their new ranks
            kept = [(ref, keep.index(rank)) for ref, rank in zip(*self._setup) if rank in keep]
            self._setup = ([ref for ref, _ in kept], [rank for _, rank in kept]) if kept else None
        self.actors, self.bundles = [self.actors[rank] for rank in keep], [self.bundles[rank] for rank in keep]
        self._layouts = None

    @property
    def world_size(self) -> int:
        return len(self.actors)

    def _start(self, name, per_rank):
        self._set_up()
        refs = [self._method(actor, name).remote(*a, **k) for actor, (a, k) in zip(self.actors, per_rank)]
        return Pending(lambda: self._results(refs, list(range(len(refs))), f"{name}()"))

    def _start_one(self, rank, name, args, kwargs):
        self._set_up()
        import ray

        ref = self._method(self.actors[rank], name).remote(*args, **kwargs)
        return Pending(lambda: self._results([ref], [rank], f"{name}()")[0],
                       ready=lambda: not ray.wait([ref], timeout=0)[1])

    def _method(self, actor, name: str):
        """The actor's method ``name``, in its concurrency group when it has one."""
        group = concurrency_group(self.worker_cls, name)
        return getattr(actor, name) if group is None else getattr(actor, name).options(concurrency_group=group)

    def _set_up(self) -> None:
        """Wait for the set-up calls queued at start (once), raising their errors."""
        if self._setup is not None:
            (setup, ranks), self._setup = self._setup, None
            self._results(setup, ranks, "set-up")

    def _results(self, refs: list, ranks: list[int], what: str) -> list[Any]:
        """The values of ``refs`` in order; a worker's error or death is raised as soon as it happens."""
        import ray

        # Wait for whichever rank finishes first rather than in rank order: when one rank dies or raises,
        # the others may be blocked in a collective waiting for it, and ray.get(refs) would hang with them.
        values: dict[Any, Any] = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                values[done[0]] = ray.get(done[0])
            except ray.exceptions.RayTaskError as err:
                if isinstance(err.cause, RunError):  # a worker's own one-line error: no Ray traceback around it
                    raise err.cause from None
                # a collective's error (a peer's connection reset) may only be the echo of another rank's death
                if death := self._death_among(pending, refs, ranks, what):
                    raise death from None
                raise
            except ray.exceptions.RayActorError as err:
                raise self._death(err, ranks[refs.index(done[0])], what) from None
        return [values[ref] for ref in refs]

    def _death(self, err: Exception, rank: int, what: str) -> WorkerDied:
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return WorkerDied(f"{self.worker_cls.__name__} rank {rank} of {len(self.actors)} died during {what} ({cause}); "
                          f"its process exited (out of memory, a crash or a kill): see the Ray logs of that worker",
                          self.worker_cls.__name__, rank)

    def _death_among(self, pending: list, refs: list, ranks: list[int], what: str,
                     timeout_s: float = 10.0) -> WorkerDied | None:
        """The death of a rank whose call is in ``pending``, if one shows within ``timeout_s``."""
        import ray

        if not pending:
            return None
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as err:
                return self._death(err, ranks[refs.index(ref)], what)
            except Exception:  # noqa: BLE001 - another rank's own error: the first one is raised
                continue
        return None

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
