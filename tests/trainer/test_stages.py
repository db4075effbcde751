"""Trainer stages that need no model: dynamic-sampling fill-up, stage selection, critic selection.

The dynamic-sampling tests drive ``filter_groups`` through a trainer subclass that overrides the
``generate`` and ``reward`` stages with scripted scores, the way a recipe overrides a stage.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlplat.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInput, AdvantageOutput, EstimatorSpec
from rlplat.trainer.run import load_run_config
from rlplat.protocol import Batch
from rlplat.trainer.ppo import PPOTrainer
from rlplat.trainer.prompt_source import tag_groups

N, WANT = 2, 3  # responses per prompt, prompts per step


class ScriptedTrainer(PPOTrainer):
    """``generate`` samples WANT prompts; ``reward`` scores each group by a per-round script."""

    def __init__(self, cfg, plan, rounds: list[list[tuple[float, float]]]):
        super().__init__(cfg, plan, components=SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0)))
        self.rounds, self.generated = rounds, 0

    def generate(self, batch, metrics):
        self.generated += 1
        prompts = tag_groups(Batch.from_dict({"prompt": torch.zeros(WANT, 1)}), self.prompts.number(WANT))
        out = prompts.repeat(N, interleave=True)
        return out.union(Batch.from_dict({"response_mask": torch.ones(WANT * N, 1)}))

    def reward(self, batch, metrics):
        scores = torch.tensor(self.rounds[self.generated - 1], dtype=torch.float32).flatten()
        metrics["reward/acc_mean"] = float(scores.mean())
        return batch.union(Batch.from_dict({"token_level_scores": scores[:, None]}))


def scripted(rounds, max_gen_batches):
    cfg, plan = load_run_config(["algorithm=dapo", f"rollout.n={N}", f"data.train_batch_size_prompts={WANT}",
                             f"actor.mini_batch_size_prompts={WANT}", "actor.micro_batch_size_seqs_per_worker=2",
                             "critic.micro_batch_size_seqs_per_worker=2",
                             f"algorithm.dynamic_sampling.max_gen_batches={max_gen_batches}"])
    trainer = ScriptedTrainer(cfg, plan, rounds)
    metrics: dict = {}
    batch = trainer.reward(trainer.generate(None, metrics), metrics)
    return trainer, trainer.filter_groups(batch, metrics), metrics


def group_sizes(batch):
    _, counts = np.unique(batch.non_tensors["uid"].astype(str), return_counts=True)
    return counts.tolist()


def test_fill_up_never_repeats_a_kept_group():
    # one round allowed: p0 varied (kept), p1 and p2 all-equal. The batch needs 3 groups: p0 once,
    # then the dropped p1 and p2 -> three distinct uids of 2 responses (the old fill-up appended the whole
    # round again: p0 twice, a "group" of 4 in the advantage stage, and p2 cut off).
    trainer, batch, metrics = scripted([[(1, 0), (1, 1), (0, 0)]], max_gen_batches=1)
    assert batch.non_tensors["uid"].tolist() == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert group_sizes(batch) == [N] * WANT
    assert (metrics["batch/gen_rounds"], metrics["batch/filled_groups"]) == (1, 2)


def test_later_rounds_use_the_generate_override_and_keep_reward_metrics():
    # round 1 keeps p0; round 2 (through the overridden generate) keeps p4; the third round is not allowed:
    # fill with the first dropped group, p1. Reward metrics are averaged over the 2 rounds.
    rounds = [[(1, 0), (1, 1), (0, 0)], [(0, 0), (0, 1), (0, 0)]]
    trainer, batch, metrics = scripted(rounds, max_gen_batches=2)
    assert trainer.generated == 2
    assert batch.non_tensors["uid"].tolist() == ["p0", "p0", "p4", "p4", "p1", "p1"]
    assert metrics["reward/acc_mean"] == pytest.approx((3 / 6 + 1 / 6) / 2)  # round means 1/2 and 1/6
    assert (metrics["batch/gen_rounds"], metrics["batch/filled_groups"]) == (2, 1)
    scores = batch.tensors["token_level_scores"].flatten().tolist()
    assert scores == [1, 0, 0, 1, 1, 1]


def test_a_streamed_rollout_pool_is_asked_for_the_missing_groups_only():
    # with rollout.stream_groups the queue hands out calls of a few groups: each later round asks for the groups
    # still missing (round 1 kept p0: 2 missing; round 2 kept p4: 1 missing), not a whole batch
    class Recorder:  # what the trainer asks of its rollout source
        wanted = None

        def next_groups(self, count):
            self.wanted = count

    class Streamed(ScriptedTrainer):
        def generate(self, batch, metrics):
            self.asked.append(self.rollouts.wanted)
            self.rollouts.wanted = None
            return super().generate(batch, metrics)

    cfg, plan = load_run_config(["algorithm=dapo", f"rollout.n={N}", f"data.train_batch_size_prompts={WANT}",
                                 f"actor.mini_batch_size_prompts={WANT}", "actor.micro_batch_size_seqs_per_worker=2",
                                 "algorithm.dynamic_sampling.max_gen_batches=3"])
    trainer = Streamed(cfg, plan, [[(1, 0), (1, 1), (0, 0)], [(0, 0), (0, 1), (0, 0)], [(1, 0), (0, 0), (0, 0)]])
    trainer.rollouts, trainer.asked = Recorder(), []
    metrics: dict = {}
    batch = trainer.filter_groups(trainer.reward(trainer.generate(None, metrics), metrics), metrics)
    assert trainer.asked == [None, 2, 1]
    assert batch.non_tensors["uid"].tolist() == ["p0", "p0", "p4", "p4", "p6", "p6"]


def test_enough_varied_groups_stop_early_without_fill():
    rounds = [[(1, 0), (1, 1), (0, 0)], [(0, 1), (1, 0), (0, 1)]]
    trainer, batch, metrics = scripted(rounds, max_gen_batches=5)
    assert batch.non_tensors["uid"].tolist() == ["p0", "p0", "p3", "p3", "p4", "p4"]
    assert (trainer.generated, metrics["batch/filled_groups"]) == (2, 0)


def test_kl_in_the_reward_keeps_the_old_log_prob_stage():
    # one epoch, one mini-batch: old_log_probs could be skipped, but the KL in the reward must not fall
    # back to the rollout engine's log-probs
    one_mini = ["actor.mini_batch_size_prompts=64"]
    cfg, plan = load_run_config(["algorithm=ppo", *one_mini])
    assert plan.mini_batches_per_step == 1 and cfg.algorithm.use_kl_in_reward
    assert "old_log_probs" in PPOTrainer(cfg, plan, components=None).stages
    cfg, plan = load_run_config(["algorithm=grpo", *one_mini])  # KL in the loss only: the stage may go
    assert "old_log_probs" not in PPOTrainer(cfg, plan, components=None).stages


@pytest.mark.parametrize("overrides, old_policy", [
    (["actor.mini_batch_size_prompts=64"], "update"),  # one epoch over one mini-batch: the update's own forward
    ([], "rollout"),  # the Quickstart: 4 mini-batches, the hf engine samples with the actor's float32 weights
    (["algorithm.old_log_probs=recompute"], "recompute"),
    (["algorithm.tis_cap=2.0"], "recompute"),  # pi_old / pi_rollout needs pi_old of its own
    (["algorithm.use_kl_in_reward=true"], "recompute"),
    (["algorithm.adv_estimator=optimal_token_baseline"], "recompute"),  # reads sum_pi_squared from the pass
    (["rollout.name=vllm"], "recompute"),  # another kernel stack
    (["rollout.dtype=bfloat16"], "recompute"),
    (["rollout.dtype=float32"], "rollout"),
    (["rollout.name=vllm", "algorithm.old_log_probs=rollout"], "rollout"),
    (["algorithm.use_kl_in_reward=true", "algorithm.old_log_probs=rollout"], "rollout"),
    (["actor.mini_batch_size_prompts=64", "algorithm.old_log_probs=recompute"], "update"),
])
def test_where_pi_old_comes_from(overrides, old_policy):
    """The plan reads the engines' declarations; they are read here from the engine classes themselves, so the
    vllm cases need no vLLM installed (a run with rollout=vllm does: plan_run refuses it without)."""
    from rlplat.config import load_config, make_plan
    from rlplat.config.plan import EngineDeclarations
    from rlplat.engines import TRAINING_ENGINES
    from rlplat.rollout.hf import HFRolloutEngine
    from rlplat.rollout.vllm import VLLMRolloutEngine

    cfg = load_config(["algorithm=grpo", *overrides])
    rollout = {"hf": HFRolloutEngine, "vllm": VLLMRolloutEngine}[cfg.rollout.name]
    engines = EngineDeclarations(actor_dtype=TRAINING_ENGINES.get("fsdp").computes_in(cfg.actor.fsdp, "cpu"),
                                 rollout=rollout.declare(cfg.rollout.get(cfg.rollout.name), "cpu"))
    plan = make_plan(cfg, "cpu", engines)
    assert plan.old_policy == old_policy
    stages = PPOTrainer(cfg, plan, components=None).stages
    assert ("old_log_probs" in stages) == (old_policy == "recompute")


def test_kl_in_the_reward_reads_the_rollout_log_probs_when_they_are_pi_old():
    cfg, plan = load_run_config(["algorithm=ppo", "algorithm.old_log_probs=rollout"])
    trainer = PPOTrainer(cfg, plan, components=None)
    fields = {"token_level_scores": torch.tensor([[0.0, 1.0]]), "response_mask": torch.ones(1, 2),
              "rollout_log_probs": torch.tensor([[-1.0, -2.0]]), "ref_log_probs": torch.tensor([[-1.5, -1.0]]),
              "values": torch.zeros(1, 2)}
    batch = Batch.from_dict(fields, non_tensors={"uid": np.array(["p0"], dtype=object)})
    metrics = {}
    trainer.advantages(batch, metrics)
    assert metrics["actor/reward_kl"] == pytest.approx(((-1.0 + 1.5) + (-2.0 + 1.0)) / 2)  # k1 = old - ref


def test_pf_ppo_stage_follows_the_advantages():
    cfg, plan = load_run_config(["algorithm=grpo", "algorithm.pf_ppo.enable=true"])
    stages = PPOTrainer(cfg, plan, components=None).stages
    assert stages.index("pf_ppo") == stages.index("advantages") + 1


def test_an_estimator_that_needs_values_gets_a_critic_whatever_its_name():
    def value_baseline(inp: AdvantageInput) -> AdvantageOutput:
        adv = (inp.token_level_rewards - inp.values) * inp.response_mask
        return AdvantageOutput(advantages=adv, returns=adv + inp.values)

    value_baseline.spec = EstimatorSpec(needs_values=True)  # what the estimator decorator sets
    with ADVANTAGE_ESTIMATORS.temporary("value_baseline", value_baseline):
        cfg, plan = load_run_config(["algorithm.adv_estimator=value_baseline"])
        assert plan.needs_critic
        assert {"values", "update_critic"} <= set(PPOTrainer(cfg, plan, components=None).stages)
    _, plan = load_run_config(["algorithm=grpo"])
    assert not plan.needs_critic


def test_gdpo_terms_include_what_a_recipe_added_to_the_scores():
    # reward functions give terms [[1], [0]] with weight [2]; a recipe subtracted 0.5 from row 1's score
    from rlplat.trainer.advantage_input import reward_terms

    batch = Batch.from_dict({"reward_terms": torch.tensor([[1.0], [0.0]]),
                             "token_level_scores": torch.tensor([[0.0, 2.0], [0.0, -0.5]])})
    terms, weights = reward_terms(batch, torch.tensor([2.0]))
    assert terms.tolist() == [[1.0, 0.0], [0.0, -0.5]] and weights.tolist() == [2.0, 1.0]
    plain = Batch.from_dict({"reward_terms": torch.tensor([[1.0], [0.0]]),
                             "token_level_scores": torch.tensor([[0.0, 2.0], [0.0, 0.0]])})
    assert reward_terms(plain, torch.tensor([2.0]))[0].tolist() == [[1.0], [0.0]]  # no residual: no extra term


def test_balanced_order_evens_the_replicas_tokens():
    from rlplat.controller.dispatch import balanced_order

    lengths = torch.tensor([100, 90, 80, 70, 10, 10, 5, 5])  # in order, replica 0 would hold 340 of 370
    order = balanced_order(lengths, 2)
    assert sorted(order.tolist()) == list(range(8))  # a permutation
    assert lengths[order].view(2, 4).sum(-1).tolist() == [185, 185]
    assert balanced_order(lengths, 3).tolist() == list(range(8))  # 8 rows do not split in 3: unchanged


def test_balance_batch_runs_with_several_workers_and_reorders_whole_rows():
    from types import SimpleNamespace

    from rlplat.engines import ParallelLayout

    cfg, plan = load_run_config(["trainer.workers_per_node=2"])
    assert "balance_batch" in PPOTrainer(cfg, plan, components=None).stages
    _, one = load_run_config([])
    assert "balance_batch" not in PPOTrainer(cfg, one, components=None).stages
    cfg_off, plan_off = load_run_config(["trainer.workers_per_node=2", "trainer.balance_batch=false"])
    assert "balance_batch" not in PPOTrainer(cfg_off, plan_off, components=None).stages

    actor = SimpleNamespace(layouts=lambda: [ParallelLayout(0, 2), ParallelLayout(1, 2)])
    trainer = PPOTrainer(cfg, plan, components=SimpleNamespace(actor=actor))
    lengths = torch.tensor([9, 8, 7, 6, 1, 1])  # in order: 24 | 8
    mask = (torch.arange(9)[None, :] < lengths[:, None]).long()
    batch = Batch.from_dict({"attention_mask": mask, "row": torch.arange(6)},
                            {"uid": np.array(list("aabbcc"), dtype=object)})
    metrics = {}
    out = trainer.balance_batch(batch, metrics)
    rows = out.tensors["row"]
    assert out.non_tensors["uid"].tolist() == [batch.non_tensors["uid"][r] for r in rows.tolist()]  # whole rows
    assert torch.equal(out.tensors["attention_mask"].sum(-1), lengths[rows])
    assert metrics["batch/replica_token_imbalance"] == pytest.approx(1.0)  # 16 | 16


def test_scoring_overlaps_the_worker_passes_that_do_not_read_the_scores():
    cfg, plan = load_run_config(["algorithm=ppo"])
    stages = PPOTrainer(cfg, plan, components=None).stages
    assert "reward" not in stages
    assert stages[stages.index("generate") + 1:stages.index("advantages")] == [
        "reward_start", "old_log_probs", "reference", "values", "reward_wait"]
    # dynamic sampling reads the scores right after the reward stage: nothing to overlap
    stages = PPOTrainer(*load_run_config(["algorithm=dapo"]), components=None).stages
    assert stages[stages.index("reward") + 1] == "filter_groups" and "reward_start" not in stages
    # on-policy GRPO without KL has no pass between the reward and the advantages
    no_pass = ["algorithm=grpo", "algorithm.use_kl_loss=false", "actor.mini_batch_size_prompts=64"]
    assert PPOTrainer(*load_run_config(no_pass), components=None).stages[:3] == ["generate", "reward", "advantages"]

    class OwnReward(PPOTrainer):  # a recipe's reward stage runs as it is written
        def reward(self, batch, metrics):
            return super().reward(batch, metrics)

    stages = OwnReward(cfg, plan, components=None).stages
    assert stages[stages.index("reward") + 1] == "old_log_probs" and "reward_wait" not in stages

    class ReadsScores(PPOTrainer):  # a stage inserted after the passes gets the scores: the wait comes first
        stage_order = PPOTrainer.insert_stage("mine", after="reference")

        def mine(self, batch, metrics):
            return batch

    stages = ReadsScores(cfg, plan, components=None).stages
    assert stages[stages.index("reference") + 1:stages.index("reference") + 3] == ["reward_wait", "mine"]


def test_a_pass_that_fails_while_scoring_runs_waits_for_the_scoring():
    import time
    from types import SimpleNamespace

    finished = []

    def slow_score_terms(batch):
        time.sleep(0.3)
        finished.append(len(batch))

    class FailingPass(PPOTrainer):
        def generate(self, batch, metrics):
            return Batch.from_dict({"x": torch.zeros(2)})

        def old_log_probs(self, batch, metrics):
            raise RuntimeError("the pass failed")

    cfg, plan = load_run_config(["algorithm=ppo"])
    trainer = FailingPass(cfg, plan, components=SimpleNamespace(training_scores=slow_score_terms))
    with pytest.raises(RuntimeError, match="the pass failed"):
        trainer.train_step()
    assert finished == [2] and trainer._scoring is None  # done before the error reaches the teardown


def test_optimal_token_baseline_gets_the_losss_importance_weights():
    """With the rollout correction on, the advantages stage hands the estimator the same truncated weights
    min(pi_old / pi_rollout, tis_cap) that the loss uses."""
    from rlplat.algorithms import AdvantageOptions, compute_advantages

    cfg, plan = load_run_config(["algorithm=grpo", "algorithm.adv_estimator=optimal_token_baseline",
                                 "algorithm.tis_cap=2.0", "rollout.n=2"])
    old = torch.tensor([[-0.5, -1.0], [-0.7, -0.2]])
    rollout = torch.tensor([[-0.5, -2.0], [-0.2, -0.2]])  # ratios exp(0)=1, exp(1)>2 -> 2, exp(-0.5), 1
    fields = {"token_level_scores": torch.tensor([[0.0, 1.0], [0.0, 0.0]]), "response_mask": torch.ones(2, 2),
              "old_log_probs": old, "rollout_log_probs": rollout, "sum_pi_squared": torch.full((2, 2), 0.5)}
    batch = Batch.from_dict(fields, non_tensors={"uid": np.array(["p0", "p0"], dtype=object)})
    got = PPOTrainer(cfg, plan, components=None).advantages(batch, {}).tensors["advantages"]
    weights = torch.tensor([[1.0, 2.0], [float(torch.exp(torch.tensor(-0.5))), 1.0]])
    expected = compute_advantages("optimal_token_baseline", AdvantageInput(
        fields["token_level_scores"], fields["response_mask"], torch.tensor([0, 0]), old_log_probs=old,
        sum_pi_squared=fields["sum_pi_squared"], importance_weights=weights, options=AdvantageOptions()))
    unweighted = compute_advantages("optimal_token_baseline", AdvantageInput(
        fields["token_level_scores"], fields["response_mask"], torch.tensor([0, 0]), old_log_probs=old,
        sum_pi_squared=fields["sum_pi_squared"]))
    torch.testing.assert_close(got, expected.advantages)
    assert not torch.allclose(got, unweighted.advantages)  # the weights made a difference


def test_training_logs_the_rewards_accuracy():
    """A reward's ``acc`` (else score >= 1, as validation counts) is logged for training batches too."""
    from types import SimpleNamespace

    from rlplat.reward.batch import training_scores
    from rlplat.reward.manager import ScoreReport

    result = ScoreReport(scores=[0.2, 1.0, 0.9, 0.0], per_function={"f": [0.2, 1.0, 0.9, 0.0]},
                         acc=[1.0, 0.0, None, None], extras={"f/format": [1.0, 1.0, 0.0, 0.0]})
    manager = SimpleNamespace(names=["f"], functions=[("f", 1.0)], overlong=None)
    scores = training_scores(manager, result)
    assert scores.metrics["reward/accuracy"] == pytest.approx((1 + 0 + 0 + 0) / 4)  # acc, acc, 0.9 < 1, 0.0 < 1
    assert scores.metrics["reward/f_mean"] == pytest.approx(0.525)
    assert scores.metrics["reward/f/format_mean"] == pytest.approx(0.5)


def test_the_wall_clock_adds_up_the_commands_of_a_run(tmp_path):
    from rlplat.trainer.summary import WallClock

    (tmp_path / "segments.json").write_text('[{"start": 100.0, "end": 130.0}]')  # a killed command's 30 s
    clock = WallClock(tmp_path, resumed=True)
    assert len(clock.segments) == 2 and clock.seconds == pytest.approx(30.0, abs=1.0)
    assert WallClock(tmp_path, resumed=False).seconds < 1.0  # a fresh run starts over
    (tmp_path / "segments.json").write_text("[{")  # damaged: this command alone, not a failed run
    assert WallClock(tmp_path, resumed=True).seconds < 1.0


@pytest.mark.parametrize("scores, workers, minis, kept", [
    # 6 groups of 2; one worker, one mini-batch: every varied group kept, in order
    ([(1, 0), (1, 1), (0, 1), (0, 0), (1, 0), (1, 1)], 1, 1, [0, 2, 4]),
    # 2 replicas x 2 mini-batches: rows in fours (2 groups), so the first dropped group comes back to make 4
    ([(1, 0), (1, 1), (0, 1), (0, 0), (1, 0), (1, 1)], 2, 2, [0, 1, 2, 4]),
    # nothing varied: the smallest batch that splits, never an empty one
    ([(1, 1), (0, 0), (1, 1), (0, 0), (1, 1), (0, 0)], 2, 2, [0, 1]),
])
def test_zero_gradient_groups_are_dropped_in_whole_mini_batches(scores, workers, minis, kept):
    from rlplat.engines import ParallelLayout

    cfg, plan = load_run_config(["algorithm=grpo", "rollout.n=2", "data.train_batch_size_prompts=6",
                                 f"actor.mini_batch_size_prompts={6 // minis}", f"trainer.workers_per_node={workers}",
                                 "actor.micro_batch_size_seqs_per_worker=1",
                                 "algorithm.drop_zero_gradient_groups=true"])
    assert plan.mini_batches_per_step == minis
    layouts = [ParallelLayout(rank, workers) for rank in range(workers)]
    trainer = PPOTrainer(cfg, plan, SimpleNamespace(actor=SimpleNamespace(layouts=lambda: layouts), critic=None))
    assert trainer.stages[:3] == ["generate", "reward", "drop_zero_gradient_groups"]  # before the worker passes
    batch = Batch.from_dict({"token_level_scores": torch.tensor(scores, dtype=torch.float32).view(-1, 1),
                             "row": torch.arange(12)}, {"uid": np.repeat(np.arange(6), 2).astype(object)})
    metrics = {}
    out = trainer.drop_zero_gradient_groups(batch, metrics)
    assert out.non_tensors["uid"].tolist() == np.repeat(kept, 2).tolist()  # whole groups, in their order
    assert metrics["batch/kept_groups"] == len(kept) and metrics["batch/dropped_groups"] == 6 - len(kept)
    assert metrics["batch/zero_gradient_groups"] == sum(a == b for a, b in scores)


def test_dropping_zero_gradient_groups_needs_a_group_baseline():
    from rlplat.config import ConfigError

    with pytest.raises(ConfigError, match="drop_zero_gradient_groups=true drops .*adv_estimator='gae'"):
        load_run_config(["algorithm=ppo", "algorithm.drop_zero_gradient_groups=true"])
    with pytest.raises(ConfigError, match="use_kl_in_reward=True"):
        load_run_config(["algorithm=grpo", "algorithm.drop_zero_gradient_groups=true",
                         "algorithm.use_kl_in_reward=true"])
