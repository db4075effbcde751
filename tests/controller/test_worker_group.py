"""Dispatch modes on real worker groups: in-process, 2 Ray workers, and 2 Ray nodes."""

import sys

import pytest
import torch
import torch.distributed as dist

from rlplat.controller import InProcessWorkerGroup, RayWorkerGroup, ResourcePool
from rlplat.controller.dispatch import collect_results, split_arguments
from rlplat.engines import ParallelLayout
from rlplat.protocol import Batch
from rlplat.workers.base import Dispatch, Worker, register


class Probe(Worker):
    def __init__(self, rank, world_size, device, offset=0):
        super().__init__(rank, world_size, device)
        self.offset = offset

    @register(Dispatch.ONE_TO_ALL)
    def where(self):
        import os

        node = "local"
        try:
            import ray

            node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
        except ImportError:
            pass
        return self.rank, dist.get_world_size(), node, os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def threads(self) -> int:
        import torch

        return torch.get_num_threads()

    @register(Dispatch.DP_SPLIT)
    def double(self, batch: Batch) -> Batch:
        return Batch.from_dict({"x2": batch.tensors["x"] * 2 + self.offset,
                                "rank": torch.full((len(batch),), self.rank)})

    @register(Dispatch.DP_SPLIT_EXACT)
    def global_sum(self, batch: Batch) -> float:
        total = batch.tensors["x"].sum().double()
        dist.all_reduce(total)  # a real collective over the group's process group
        return float(total)

    @register(Dispatch.ONE_TO_ALL)
    def die_on_rank_1(self):
        """Rank 1's process dies; rank 0 waits in a collective that will never complete."""
        import os

        if self.rank == 1:
            os._exit(1)
        dist.barrier()

    def not_exposed(self):
        return 1


class TensorParallelProbe(Probe):
    """Two workers per model replica, as tensor-parallel ranks would be; rank 0 of each pair answers."""

    @register(Dispatch.ONE_TO_ALL)
    def parallel_layout(self):
        return ParallelLayout(dp_rank=self.rank // 2, dp_size=self.world_size // 2, collects=self.rank % 2 == 0)

    @register(Dispatch.DP_SPLIT)
    def double(self, batch: Batch) -> Batch:
        self.seen = batch.tensors["x"].tolist()
        return super().double(batch)

    @register(Dispatch.ONE_TO_ALL)
    def last_seen(self):
        return self.seen


def data(n):
    return Batch.from_dict({"x": torch.arange(n)}, {"uid": [str(i) for i in range(n)]})


def check_dispatch(group, world):
    out = group.double(data(5))  # 5 rows over `world` workers: padded, then unpadded
    assert out.tensors["x2"].tolist() == [0, 2, 4, 6, 8]
    assert len(out) == 5 and sorted(set(out.tensors["rank"].tolist())) == list(range(world))
    assert group.global_sum(data(4 * world)) == [float(sum(range(4 * world)))] * world
    info = group.where()
    assert [i[0] for i in info] == list(range(world)) and all(i[1] == world for i in info)
    return info


def test_in_process_group():
    group = InProcessWorkerGroup(Probe, device="cpu")
    try:
        check_dispatch(group, 1)
        with pytest.raises(AttributeError, match="not_exposed is not a worker method.*exposed: .*double"):
            group.not_exposed
    finally:
        group.shutdown()


@pytest.fixture
def by_value():
    pytest.importorskip("ray")
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.mark.slow
def test_two_ray_workers(ray_cluster, by_value, monkeypatch):
    import ray

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # a test worker's share of the cores (tests/conftest.py)
    pool = ResourcePool(nnodes=1, workers_per_node=2, device="cpu").create()
    group = RayWorkerGroup(Probe, pool)
    try:
        info = check_dispatch(group, 2)
        assert info[0][3] != info[1][3]  # two processes
        # each computes with half the node's cores (Ray alone would give a 1-CPU actor one thread)
        cores = int(ray.cluster_resources()["CPU"])
        assert group.threads() == [max(1, cores // 2)] * 2
        with pytest.raises(ValueError, match="does not split evenly over 2 data-parallel replicas"):
            group.global_sum(data(5))
    finally:
        group.shutdown()
        pool.release()


@pytest.mark.parametrize("omp_num_threads", [None, "2", "2,1"])  # "2,1": OpenMP's list of nested levels
def test_one_ray_worker_computes_with_every_core_or_omp_num_threads(ray_cluster, by_value, monkeypatch,
                                                                    omp_num_threads):
    # every core: a 1-CPU Ray actor would otherwise run torch on one thread (Ray sets OMP_NUM_THREADS=1 in it);
    # OMP_NUM_THREADS in the controller's environment caps it (the node has 4 logical CPUs here)
    import ray

    if omp_num_threads:
        monkeypatch.setenv("OMP_NUM_THREADS", omp_num_threads)
    else:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    pool = ResourcePool(nnodes=1, workers_per_node=1, device="cpu").create()
    group = RayWorkerGroup(Probe, pool)
    try:
        assert group.threads() == [int(omp_num_threads.split(",")[0]) if omp_num_threads
                                   else int(ray.cluster_resources()["CPU"])]
    finally:
        group.shutdown()
        pool.release()


def test_a_failed_set_up_is_reported_by_the_first_call(ray_cluster, by_value):
    import ray

    pool = ResourcePool(nnodes=1, workers_per_node=1, device="cpu").create()
    group = RayWorkerGroup(Probe, pool, imports=[("no_such_plugin_module", None)])  # returns without waiting
    try:
        with pytest.raises(ray.exceptions.RayTaskError, match="No module named 'no_such_plugin_module'"):
            group.where()  # not lost: the call waits for the queued set-up first
    finally:
        group.shutdown()
        pool.release()


@pytest.mark.slow
def test_a_worker_that_dies_mid_call_is_named_not_waited_for(ray_cluster, by_value):
    from rlplat.utils.errors import RunError

    pool = ResourcePool(nnodes=1, workers_per_node=2, device="cpu").create()
    group = RayWorkerGroup(Probe, pool)
    try:
        with pytest.raises(RunError, match=r"^Probe rank 1 of 2 died during die_on_rank_1\(\)"):
            group.die_on_rank_1()  # without the fix: blocks until gloo's 30-minute timeout
    finally:
        group.shutdown()
        pool.release()


@pytest.mark.slow
def test_two_node_cluster_places_one_worker_per_node(by_value):
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        pool = ResourcePool(nnodes=2, workers_per_node=1, device="cpu").create()
        group = RayWorkerGroup(Probe, pool)
        info = check_dispatch(group, 2)
        assert info[0][2] != info[1][2] and {info[0][2], info[1][2]} == set(pool.node_ids)
        group.shutdown()
        pool.release()
        with pytest.raises(RuntimeError, match="trainer.nnodes=3 .* only 2 node"):
            ResourcePool(nnodes=3, workers_per_node=1, device="cpu").create()
        # pools of one node each: the second goes to the node the first left free, not behind the full one (where
        # its placement would wait until the first is released)
        first = ResourcePool(nnodes=1, workers_per_node=1, device="cpu").create()
        second = ResourcePool(nnodes=1, workers_per_node=1, device="cpu", section="teacher").create()
        assert first.node_ids != second.node_ids and {*first.node_ids, *second.node_ids} == set(pool.node_ids)
        for one in (first, second):
            one.release()
    finally:
        ray.shutdown()
        cluster.shutdown()


def tensor_parallel_layouts(world: int) -> list[ParallelLayout]:
    return [ParallelLayout(rank // 2, world // 2, rank % 2 == 0) for rank in range(world)]


def test_replicas_share_a_chunk_and_one_worker_answers():
    """4 workers as 2 replicas of 2 tensor-parallel ranks: ranks 0 and 1 get the first half, 2 and 3 the
    second; the answers of ranks 0 and 2 come back, in replica order, with the padding removed."""
    layouts = tensor_parallel_layouts(4)
    per_worker, pad = split_arguments(Dispatch.DP_SPLIT, layouts, (data(5),), {})
    assert pad == 1
    chunks = [args[0].tensors["x"].tolist() for args, _ in per_worker]
    assert chunks[0] == chunks[1] == [0, 1, 2] and chunks[2] == chunks[3] == [3, 4, 0]  # padded with row 0
    answers = [Batch.from_dict({"x": args[0].tensors["x"], "rank": torch.full((3,), r)})
               for r, (args, _) in enumerate(per_worker)]
    merged = collect_results(answers, pad, layouts)
    assert merged.tensors["x"].tolist() == [0, 1, 2, 3, 4] and merged.tensors["rank"].tolist() == [0, 0, 0, 2, 2]
    assert collect_results(["a", "b", "c", "d"], 0, layouts) == ["a", "c"]  # one answer per replica


@pytest.mark.parametrize("layouts", [
    [ParallelLayout(0, 2), ParallelLayout(1, 1)],  # the workers disagree on the number of replicas
    [ParallelLayout(0, 1, True), ParallelLayout(0, 1, True)],  # two answers for one replica
    [ParallelLayout(0, 2, False), ParallelLayout(1, 2, True)],  # none for replica 0
])
def test_inconsistent_layouts_are_refused(layouts):
    with pytest.raises(RuntimeError, match="inconsistent parallel layout"):
        split_arguments(Dispatch.DP_SPLIT, layouts, (data(4),), {})


@pytest.mark.slow
def test_two_ray_workers_of_one_replica_get_the_same_data(ray_cluster, by_value):
    """2 workers, tp=2, dp=1: both see the whole batch; the answer is rank 0's alone."""
    pool = ResourcePool(nnodes=1, workers_per_node=2, device="cpu").create()
    group = RayWorkerGroup(TensorParallelProbe, pool)
    try:
        out = group.double(data(5))
        assert out.tensors["x2"].tolist() == [0, 2, 4, 6, 8] and out.tensors["rank"].tolist() == [0] * 5
        assert group.last_seen() == [[0, 1, 2, 3, 4]] * 2
    finally:
        group.shutdown()
        pool.release()
