"""``actor.ppo_epochs > 1``: every epoch takes its PPO ratio against the same π_old, the log-probs of the
policy before the update, so from the second epoch on the ratio π_θ/π_old moves off 1 (the clip can act);
and the epochs see the rows in the configured order (``actor.shuffle``: a new permutation per epoch, fixed
by ``trainer.seed`` and the step; off: the batch's order every epoch).

Observed on the real worker and engine (the tiny model on CPU): a wrapper around the actor engine's
``train_mini_batch`` (one call per optimizer step) records what each micro-batch's loss saw (its rows, log π_θ,
the batch's π_old) and the metrics the loss reported for that step."""

import pytest
import torch

from rlplat.trainer.run import load_run_config
from rlplat.controller import InProcessWorkerGroup
from rlplat.protocol import Batch
from rlplat.workers.roles import ActorRolloutRefWorker
from workers.helpers import engine_config, prompt_batch, with_training_fields


class UpdateRecorder:
    """Wraps ``engine.train_mini_batch`` of a live engine: per optimizer step, the rows in the order the loss
    saw them, each micro-batch's (rows, log π_θ [b, R], batch tensors) and the step's returned metrics."""

    def __init__(self, engine):
        self.steps: list[dict] = []
        train = engine.train_mini_batch

        def recording(micro_batches, loss_fn, **kwargs):
            step = {"rows": [], "micro": []}

            def observed(fwd, micro: Batch):
                rows = micro.tensors["row"].tolist()
                step["rows"] += rows
                step["micro"].append((rows, fwd.log_probs.detach().clone(), dict(micro.tensors)))
                return loss_fn(fwd, micro)

            step["metrics"] = train(micro_batches, observed, **kwargs)
            self.steps.append(step)
            return step["metrics"]

        engine.train_mini_batch = recording

    def take(self) -> list[dict]:
        steps, self.steps = self.steps, []
        return steps


def _actor(model_path: str, extra: list[str]):
    """An in-process actor group with the tiny model, its recorder, and a rollout of 8 rows that carries
    row ids, advantages and (when the plan recomputes π_old, as the trainer's old_log_probs stage does)
    ``old_log_probs``."""
    cfg, plan = engine_config(model_path, extra=extra)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(model_path, with_ref=False)
    torch.manual_seed(0)
    batch = with_training_fields(group.generate_sequences(prompt_batch(model_path)))
    batch = batch.union(Batch.from_dict({"row": torch.arange(len(batch))}))
    if plan.old_policy == "recompute":
        batch = batch.union(group.compute_log_probs(batch).select(["old_log_probs"]))
    return group, plan, UpdateRecorder(group.worker.actor), batch


def test_more_than_one_epoch_needs_a_fixed_pi_old():
    """With one epoch over one mini-batch, the update's own forward is π_old; with two epochs it cannot be
    (the second epoch's forward is the already updated policy)."""
    common = ["actor.mini_batch_size_prompts=4", "data.train_batch_size_prompts=4", "trainer.device=cpu"]
    assert load_run_config(common)[1].old_policy == "update"
    for source in ("auto", "recompute", "rollout"):
        plan = load_run_config([*common, "actor.ppo_epochs=2", f"algorithm.old_log_probs={source}"])[1]
        assert plan.old_policy != "update", source


@pytest.mark.parametrize("source", ["recompute", "auto"])
def test_every_epoch_takes_the_ratio_against_the_policy_before_the_update(tiny_model_path, source):
    """One mini-batch per epoch, two epochs: the first epoch's forward is the policy π_old was taken from
    (ratio 1); the second's is the policy after the first optimizer step, while π_old is still the batch's
    pre-update log-probs, so the ratio the loss reports is exp(log π_θ1 − log π_old) ≠ 1."""
    group, plan, recorder, batch = _actor(tiny_model_path, [
        "actor.ppo_epochs=2", f"algorithm.old_log_probs={source}", "actor.optim.lr=1e-2"])
    try:
        assert plan.old_policy == {"recompute": "recompute", "auto": "rollout"}[source]
        key = {"recompute": "old_log_probs", "rollout": "rollout_log_probs"}[plan.old_policy]
        pi_old = batch.tensors[key].clone()
        mask = batch.tensors["response_mask"].bool()
        group.update_actor(batch)
        epochs = recorder.take()
        assert len(epochs) == 2  # one optimizer step per epoch
        ratio_mean, log_ratio = [], []
        for epoch in epochs:
            ratios, gaps = [], []
            for rows, log_probs, tensors in epoch["micro"]:
                old = tensors[key]
                assert torch.equal(old, pi_old[rows])  # the same π_old in both epochs, never recomputed
                valid = mask[rows]
                ratios.append(torch.exp(log_probs - old)[valid])
                gaps.append((log_probs - old).abs()[valid])
            ratio_mean.append(float(torch.cat(ratios).mean()))
            log_ratio.append(float(torch.cat(gaps).max()))
            # the ratio the loss used is the one taken against that π_old
            assert epoch["metrics"]["actor/ratio_mean"] == pytest.approx(ratio_mean[-1], abs=1e-6)
        first, second = (e["metrics"] for e in epochs)
        assert log_ratio[0] < 1e-4 and first["actor/ratio_var"] < 1e-10  # π_θ0 = π_old (float error)
        assert log_ratio[1] > 100 * max(log_ratio[0], 1e-6), log_ratio  # the first step moved π_θ
        assert second["actor/ratio_var"] > 1e3 * max(first["actor/ratio_var"], 1e-12)
        assert abs(second["actor/approx_kl"]) > abs(first["actor/approx_kl"])
        clipped = [e["actor/clip_frac_lower"] + e["actor/clip_frac_upper"] for e in (first, second)]
        assert clipped[0] == 0 < clipped[1], clipped  # only against a fixed π_old can the clip act
    finally:
        group.shutdown()


def _epoch_orders(group, recorder, batch: Batch, step: int) -> list[list[list[int]]]:
    """Per epoch, the rows of each mini-batch in the order the loss saw them, for a batch of ``step``."""
    batch.meta["step"] = step
    group.update_actor(batch)
    steps = recorder.take()
    mini_batches = group.worker.plan.mini_batches_per_step
    return [[s["rows"] for s in steps[i:i + mini_batches]] for i in range(0, len(steps), mini_batches)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_epochs_see_the_rows_in_the_configured_order(tiny_model_path, shuffle):
    """Two epochs of two mini-batches (4 of the 8 rows each). Off: rows 0-3 then 4-7, every epoch. On: each
    epoch is a permutation of all rows, different from the other epoch's; the permutations are a function of
    ``trainer.seed`` and the step (the same again for the same both, different when either changes)."""
    extra = ["actor.ppo_epochs=2", "actor.mini_batch_size_prompts=2", f"actor.shuffle={str(shuffle).lower()}"]
    group, plan, recorder, batch = _actor(tiny_model_path, extra)
    try:
        assert plan.mini_batches_per_step == 2
        orders = _epoch_orders(group, recorder, batch, step=3)
        assert len(orders) == 2 and all(len(epoch) == 2 for epoch in orders)
        flat = [sum(epoch, []) for epoch in orders]
        assert all(sorted(rows) == list(range(8)) for rows in flat)  # each epoch sees every row once
        assert all(len(mini) == 4 for epoch in orders for mini in epoch)
        if not shuffle:
            assert flat == [list(range(8))] * 2
            assert _epoch_orders(group, recorder, batch, step=4) == orders
            return
        assert flat[0] != flat[1] and list(range(8)) not in flat
        assert {tuple(sorted(m)) for m in orders[0]} != {tuple(sorted(m)) for m in orders[1]}  # other mini-batches
        assert _epoch_orders(group, recorder, batch, step=3) == orders  # the same seed and step: the same order
        assert _epoch_orders(group, recorder, batch, step=4) != orders  # the next step: another
    finally:
        group.shutdown()
    reseeded, _, recorder, _ = _actor(tiny_model_path, [*extra, "trainer.seed=1000"])
    try:
        assert _epoch_orders(reseeded, recorder, batch, step=3) != orders  # another seed: another
    finally:
        reseeded.shutdown()
