"""Token-budget micro-batches (``*.micro_batch_max_tokens_per_worker``): contiguous pieces of about equal
tokens, as many on every replica as the fullest needs, and the same update as sequence-count micro-batches
(the losses use the mini-batch's global denominators, so how it is cut does not change the gradient)."""

import pytest
import torch

from rlplat.config import ConfigError
from rlplat.trainer.run import load_run_config
from rlplat.controller import InProcessWorkerGroup
from rlplat.protocol import Batch
from rlplat.engines.base import MicroBatching, micro_batches
from rlplat.workers.roles import ActorRolloutRefWorker
from workers.helpers import engine_config, full_weights, prompt_batch, with_training_fields


class Replicas:
    """A stand-in engine whose other data-parallel replica needs ``other`` micro-batches."""

    def __init__(self, other: int):
        self.other = other

    def all_reduce_dp(self, values, op="sum"):
        assert op == "max"
        return [max(values[0], self.other)]


def rows_of(lengths: list[int]) -> Batch:
    width = max(lengths)
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    return Batch.from_dict({"attention_mask": mask, "row": torch.arange(len(lengths))})


def test_pieces_are_contiguous_within_budget_and_as_many_as_the_fullest_replica_needs():
    lengths = [9, 1, 1, 1, 6, 6, 3, 3, 2, 8]  # 40 tokens
    pieces = micro_batches(Replicas(other=1), rows_of(lengths), MicroBatching(100, 12))
    assert torch.cat([p.tensors["row"] for p in pieces]).tolist() == list(range(10))  # in order, every row once
    assert [int(p.tensors["attention_mask"].sum()) for p in pieces] == [12, 12, 8, 8]  # filled in order
    more = micro_batches(Replicas(other=6), rows_of(lengths), MicroBatching(100, 12))
    assert len(more) == 6 and all(len(p) > 0 for p in more)  # the other replica needs 6: so do we
    assert torch.cat([p.tensors["row"] for p in more]).tolist() == list(range(10))  # still every row once, in order
    assert max(int(p.tensors["attention_mask"].sum()) for p in more) <= 12
    alone = micro_batches(Replicas(other=1), rows_of([30, 2, 2]), MicroBatching(100, 10))
    assert [len(p) for p in alone] == [1, 2]  # a sequence over the budget is a piece of its own
    assert [len(p) for p in micro_batches(Replicas(other=1), rows_of(lengths), MicroBatching(4, None))] == [4, 4, 2]


def test_a_token_budget_gives_the_same_update_as_sequence_counts(tiny_model_path):
    weights = {}
    for budget in (None, 40):
        extra = [] if budget is None else [f"actor.micro_batch_max_tokens_per_worker={budget}"]
        cfg, plan = engine_config(tiny_model_path, extra=extra)
        group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
        try:
            group.init_model(tiny_model_path, with_ref=False)
            torch.manual_seed(0)
            batch = with_training_fields(group.generate_sequences(prompt_batch(tiny_model_path)))
            if budget is not None:  # several micro-batches, none over the budget
                pieces = micro_batches(group.worker.actor, batch, MicroBatching(100, budget))
                assert len(pieces) > 2 and max(int(p.tensors["attention_mask"].sum()) for p in pieces) <= budget
            group.update_actor(batch)
            weights[budget] = dict(full_weights(group.worker.actor))
        finally:
            group.shutdown()
    for name, tensor in weights[None].items():
        torch.testing.assert_close(weights[40][name], tensor, atol=1e-6, rtol=1e-5)


def test_a_token_budget_must_be_positive():
    with pytest.raises(ConfigError, match="actor.micro_batch_max_tokens_per_worker must be >= 1"):
        load_run_config(["actor.micro_batch_max_tokens_per_worker=0"])


@pytest.mark.slow
def test_replicas_that_need_different_counts_run_the_same_number(ray_cluster, tiny_model_path):
    from rlplat.controller import RayWorkerGroup, ResourcePool
    from workers.helpers import single_process_step

    budget = 45
    cfg, plan = engine_config(tiny_model_path, workers=2, extra=[f"actor.micro_batch_max_tokens_per_worker={budget}"])
    pool = ResourcePool(nnodes=1, workers_per_node=2, device="cpu").create()
    group = RayWorkerGroup(ActorRolloutRefWorker, pool, cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        torch.manual_seed(0)
        out = group.generate_sequences(prompt_batch(tiny_model_path))
        # the first replica's rows keep one response token: it needs fewer micro-batches than the second
        t = out.tensors
        one = torch.zeros_like(t["response_mask"])
        one[:, 0] = 1
        response_mask = torch.where((torch.arange(8) < 4)[:, None], t["response_mask"] * one, t["response_mask"])
        prompt_mask = t["attention_mask"][:, : -response_mask.shape[1]]
        out.pop(["response_mask", "attention_mask"])
        out = out.union(Batch.from_dict({"response_mask": response_mask,
                                         "attention_mask": torch.cat([prompt_mask, response_mask], dim=1)}))
        counts = [len(micro_batches(Replicas(other=1), out[rows], MicroBatching(100, budget))) for rows in (slice(0, 4), slice(4, 8))]
        assert counts[0] < counts[1], counts
        train = with_training_fields(out)
        group.update_actor(train)  # would hang if the replicas ran different numbers of forward passes
        per_rank = group.actor_weights()
        reference = single_process_step(tiny_model_path, cfg, train, plan.loss_scale_factor)
        for name, tensor in reference.items():
            torch.testing.assert_close(per_rank[0][name], tensor, atol=1e-5, rtol=1e-5)
    finally:
        group.shutdown()
        pool.release()
