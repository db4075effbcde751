"""On-policy distillation (docs/distillation.md): the teacher's per-token term against a hand computation, its
config's rules, and the start-up errors (a teacher that does not load, a tokenizer that differs, a teacher too
large for the plan)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlplat.config import ConfigError
from rlplat.controller import InProcessWorkerGroup
from rlplat.models.tiny import TinyModelSpec, build_tiny_model
from rlplat.trainer.ppo import distillation_term
from rlplat.trainer.preflight import check_other_model_paths, checked_teacher
from rlplat.trainer.run import load_run_config, run, run_plan
from rlplat.utils.errors import RunError
from rlplat.workers.roles import ActorRolloutRefWorker
from workers.helpers import engine_config, prompt_batch, reference_log_probs


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    """Another tiny model with the same tokenizer (other random weights: a teacher that disagrees a lot)."""
    return str(build_tiny_model(tmp_path_factory.mktemp("teacher") / "model", seed=1))


def test_the_per_token_advantage_is_the_reverse_kl_computed_by_hand(tiny_model_path, teacher_path):
    """-(log pi_student - log pi_teacher) per sampled token, from two plain transformers models in float64: the
    worker's teacher pass and the advantages stage's term agree with it; masked tokens get 0."""
    cfg, plan = engine_config(tiny_model_path, extra=["algorithm=opd", f"teacher.model_path={teacher_path}"])
    assert (plan.teacher, plan.old_policy) == ("colocated", "rollout")  # the sampler's own log-probs (hf, float32)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(tiny_model_path, with_ref=False, teacher_path=teacher_path)
    try:
        torch.manual_seed(0)
        out = group.generate_sequences(prompt_batch(tiny_model_path, temperature=0.7))
        out = out.union(group.compute_teacher_log_probs(out))
    finally:
        group.shutdown()
    metrics = {}
    advantage = distillation_term(out, plan.old_policy, metrics)

    mask = out.tensors["response_mask"].double()
    with torch.no_grad():
        student, teacher = (reference_log_probs(AutoModelForCausalLM.from_pretrained(path).double(), out, 0.7)
                            for path in (tiny_model_path, teacher_path))
    expected = -(student - teacher) * mask
    assert mask.sum() >= 16 and expected.abs().max() > 0.1  # sampled tokens on which the two models disagree
    torch.testing.assert_close(advantage.double(), expected, atol=1e-5, rtol=0)
    assert bool((advantage[mask == 0] == 0).all())
    assert metrics["distill/reverse_kl"] == pytest.approx(float(((student - teacher) * mask).sum() / mask.sum()),
                                                          abs=1e-5)
    assert metrics["distill/teacher_log_prob"] == pytest.approx(float((teacher * mask).sum() / mask.sum()), abs=1e-5)


@pytest.mark.parametrize("overrides, message", [
    (["algorithm=opd"], "algorithm.distill.coef=1.0 distills from a teacher, and teacher.model_path is not set"),
    (["algorithm=grpo", "teacher.model_path=embedded-teacher"],
     "teacher.model_path='embedded-teacher' loads a teacher that nothing reads (algorithm.distill.coef=0)"),
    (["algorithm=opd", "teacher.model_path=embedded-teacher", "algorithm.distill.coef=0"],
     "algorithm.adv_estimator='opd' trains on the distillation term alone"),
    (["algorithm=grpo", "teacher.model_path=embedded-teacher", "algorithm.distill.coef=-1"],
     "algorithm.distill.coef must be >= 0"),
    (["algorithm=opd", "teacher.model_path=embedded-teacher", "teacher.placement=separate",
      "trainer.ray_address=inprocess"], "teacher.placement=separate needs Ray"),
    (["algorithm=opd", "teacher.model_path=embedded-teacher", "teacher.fsdp.ulysses_size=2",
      "trainer.workers_per_node=2"], "a colocated teacher splits its sequences over the actor's groups"),
])
def test_distillation_config_errors_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as caught:
        load_run_config(overrides)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_distilling_plan_reads_the_actors_log_probs_before_the_update():
    """One mini-batch, one epoch: without distillation pi_old is the update's own forward; with it the term needs
    the student's log-probs in the advantages stage (the rollout's, exact on the embedded hf engine)."""
    _, plain = load_run_config(["algorithm=grpo", "actor.mini_batch_size_prompts=64"])
    _, mixed = load_run_config(["algorithm=grpo", "actor.mini_batch_size_prompts=64", "algorithm.distill.coef=0.5",
                                "teacher.model_path=embedded-teacher"])
    assert (plain.old_policy, plain.teacher) == ("update", "none")
    assert (mixed.old_policy, mixed.teacher) == ("rollout", "colocated")


def test_a_teacher_path_that_does_not_load_is_one_line(tmp_path):
    cfg, plan = load_run_config(["algorithm=opd", f"teacher.model_path={tmp_path / 'missing'}"])
    with pytest.raises(RunError, match=r"teacher.model_path='.*missing': no such directory"):
        check_other_model_paths(cfg, plan)


@pytest.fixture
def other_tokenizer_teacher(teacher_path, tmp_path):
    """The teacher with two of its tokens' ids swapped in its tokenizer: another vocabulary, same model."""
    path = tmp_path / "teacher"
    shutil.copytree(teacher_path, path)
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["0"], vocab["1"] = vocab["1"], vocab["0"]
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    return str(path)


def test_a_teacher_with_another_tokenizer_is_one_line_at_start_and_in_the_plan(tiny_model_path,
                                                                               other_tokenizer_teacher, capsys):
    from transformers import AutoTokenizer

    cfg, plan = load_run_config([f"model.path={tiny_model_path}", "algorithm=opd",
                                 f"teacher.model_path={other_tokenizer_teacher}"])
    with pytest.raises(RunError) as caught:
        checked_teacher(cfg, plan, AutoTokenizer.from_pretrained(tiny_model_path))
    assert "its tokenizer is not the student's: 2 of the student's" in str(caught.value)
    assert "'0': 7 in the student's, 8 in the teacher's" in str(caught.value)
    assert "distillation across tokenizers is not supported" in str(caught.value)
    assert run_plan(cfg, plan) == 1  # as a model path that does not load
    err = capsys.readouterr().err
    assert "its tokenizer is not the student's" in err and len(err.strip().splitlines()) == 1


def test_a_teacher_too_large_for_the_device_is_named_by_the_plan(tiny_model_path, tmp_path, capsys):
    """A teacher 24x the student's size: the plan counts its weights beside the actor's and says to give it a pool of
    its own; there, its own phase is planned on the teacher's workers."""
    big = build_tiny_model(tmp_path / "big", TinyModelSpec(hidden_size=512, num_hidden_layers=4,
                                                          intermediate_size=2048), seed=0)
    common = [f"model.path={tiny_model_path}", "algorithm=opd", f"teacher.model_path={big}"]
    cfg, plan = load_run_config(common)
    assert run_plan(cfg, plan, device_memory=60 * 2**20) == 1
    out = capsys.readouterr().out
    assert "teacher weights (fp32)" in out and "tokenizer matches the student's" in out
    # its pass holds more than the student's: the log-prob phase's knob is the teacher's micro-batch
    assert "DOES NOT FIT: teacher.log_prob_micro_batch_size_seqs_per_worker (or a token budget); or " \
           "teacher.placement=separate (the teacher's" in out
    cfg, plan = load_run_config([*common, "teacher.placement=separate"])
    assert run_plan(cfg, plan, device_memory=60 * 2**20) == 1
    out = capsys.readouterr().out
    assert "teacher log-prob pass, on each teacher worker's device (teacher.placement=separate)" in out
    assert out.count("DOES NOT FIT") == 1


@pytest.mark.parametrize("extra", [[], ["model.lora.rank=8", "model.lora.alpha=16"]], ids=["full", "lora"])
def test_grpo_plus_distillation_trains_and_reports_both_terms(embedded_cache, small_val, tmp_path, extra):
    """algorithm.distill.coef added to GRPO's advantage: both the task reward and the distillation term are reported
    every step, and the report draws the distillation figure; a LoRA student distills the same way."""
    from trainer.test_trainer import metrics, overrides

    cfg, plan = load_run_config(overrides(tmp_path, 2, small_val, "trainer.ray_address=inprocess", "algorithm=grpo",
                                          "algorithm.distill.coef=0.5", "teacher.model_path=embedded-teacher", *extra))
    run(cfg, plan)
    steps = metrics(tmp_path)
    for step in (1, 2):
        assert {"score/mean", "actor/pg_loss"} <= steps[step].keys()
        assert steps[step]["distill/reverse_kl"] > 0.05 and steps[step]["distill/teacher_log_prob"] < 0
    assert (tmp_path / "report" / "distillation.svg").is_file()


def test_an_agents_observation_tokens_get_no_distillation_term(embedded_cache, tmp_path):
    """Tool-use trajectories (the embedded tool model calls a calculator): the teacher's term reaches the tokens the
    policy sampled, never the tool results' tokens between its turns (attended, not trained)."""
    from rlplat.trainer.ppo import PPOTrainer
    from trainer.test_learning import small_val_file

    seen = []

    class Watching(PPOTrainer):
        stage_order = PPOTrainer.insert_stage("watch", after="advantages")

        def watch(self, batch, metrics):
            seen.append(batch)
            return batch

    cfg, plan = load_run_config([
        "trainer.ray_address=inprocess", "model.path=embedded-tools", "algorithm=opd",
        "teacher.model_path=embedded-teacher", "data.train_files=builtin:tool_arithmetic",
        f"data.val_files={small_val_file('tool_arithmetic', tmp_path)}", "data.max_response_length=88", "rollout.agent.name=tool",
        "rollout.agent.max_turns=3", "rollout.agent.max_total_tokens=128", "data.train_batch_size_prompts=8",
        "actor.mini_batch_size_prompts=8", "rollout.n=2", "trainer.total_steps=1", "trainer.test_freq=0",
        "rollout.val_n=1", f"trainer.output_dir={tmp_path / 'run'}"])
    run(cfg, plan, Watching)
    t = seen[0].tensors
    response = t["attention_mask"][:, -t["responses"].shape[1]:].bool()
    observed = response & ~t["response_mask"].bool()  # in the sequence, not sampled: a tool's result
    assert observed.sum() > 0 and bool((t["advantages"][observed] == 0).all())
    assert bool((t["advantages"][t["response_mask"].bool()] != 0).any())
