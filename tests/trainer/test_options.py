"""Options users reach for, each shown by its effect: reference sync / Polyak mixing, truncated responses
(mask / penalize), dropping zero-gradient groups, the dynamic-prompts hook and the gpg F_norm key. (The format reward counted only when
correct is in tests/reward/test_manager.py.)"""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlplat.config import ConfigError
from rlplat.protocol import Batch
from rlplat.trainer.components import Components
from rlplat.trainer.ppo import PPOTrainer
from rlplat.trainer.run import load_run_config, run
from rlplat.utils.errors import RunError

from .test_trainer import metrics, overrides

INPROC = "trainer.ray_address=inprocess"


def train(out_dir, steps, val_file, *extra):
    cfg, plan = load_run_config(overrides(out_dir, steps, val_file, INPROC, *extra))
    return run(cfg, plan)


# ------------------------------------------------------------------------------------- reference sync
def test_reference_sync_copies_or_mixes_the_actor(embedded_cache, small_val, tmp_path):
    # The KL loss at step 2 is measured against the reference before step 2's update. A fixed reference
    # is the initial model; synced after step 1 with alpha=1 it IS the actor that step 2 starts from (KL
    # exactly 0); Polyak alpha=0.5 sits half way, so the KL lies strictly between.
    kl = {}
    for name, extra in {"fixed": [], "copy": ["ref.sync_steps=1"],
                        "polyak": ["ref.sync_steps=1", "ref.sync_alpha=0.5"]}.items():
        out = tmp_path / name
        train(out, 2, small_val, "algorithm.use_kl_loss=true", *extra)
        kl[name] = metrics(out)[2]["actor/kl_loss"]
        assert metrics(out)[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-9)  # everyone starts at the model
    assert kl["copy"] == pytest.approx(0.0, abs=1e-9)
    assert kl["fixed"] > kl["polyak"] > 1e-7, kl
    # the synced reference is part of the checkpoint (a resume must not fall back to the initial model)
    assert (tmp_path / "copy" / "checkpoints" / "step_000002" / "ref").is_dir()
    assert not (tmp_path / "fixed" / "checkpoints" / "step_000002" / "ref").exists()


@pytest.mark.slow
def test_reference_sync_to_a_separate_reference_pool(embedded_cache, small_val, tmp_path, ray_cluster):
    # ref.placement=separate: the actor's weights travel over a weight channel of their own to the reference workers;
    # on-policy distillation's teacher has a pool of its own too (teacher.placement=separate), never synced
    out = tmp_path / "separate"
    cfg, plan = load_run_config(overrides(out, 2, small_val, "algorithm.use_kl_loss=true", "ref.placement=separate",
                                      "ref.sync_steps=1", "algorithm.distill.coef=0.5",
                                      "teacher.model_path=embedded-teacher", "teacher.placement=separate"))
    run(cfg, plan)
    assert metrics(out)[2]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-9)
    assert (out / "checkpoints" / "step_000002" / "ref").is_dir()
    assert not (out / "checkpoints" / "step_000002" / "teacher").exists()
    for step in (1, 2):  # the embedded model is far from its teacher: a clearly positive reverse KL
        assert metrics(out)[step]["distill/reverse_kl"] > 0.05 and metrics(out)[step]["distill/teacher_log_prob"] < 0


def test_a_resumed_run_keeps_the_synced_reference(embedded_cache, small_val, tmp_path):
    sync = ["algorithm.use_kl_loss=true", "ref.sync_steps=2", "ref.sync_alpha=0.5", "trainer.save_freq=2"]
    train(tmp_path / "full", 3, small_val, *sync)
    train(tmp_path / "resumed", 2, small_val, *sync)
    train(tmp_path / "resumed", 3, small_val, *sync, "trainer.resume_allow_config_change=true")
    assert metrics(tmp_path / "resumed")[3]["actor/kl_loss"] == metrics(tmp_path / "full")[3]["actor/kl_loss"]


def test_reference_sync_settings_are_checked():
    with pytest.raises(ConfigError, match=r"ref.sync_steps=5 syncs a reference policy, but this run has none"):
        load_run_config(["algorithm.use_kl_loss=false", "ref.sync_steps=5"])
    with pytest.raises(ConfigError, match=r"ref.sync_alpha must be in \(0, 1\]"):
        load_run_config(["algorithm.use_kl_loss=true", "ref.sync_steps=1", "ref.sync_alpha=1.5"])


# ------------------------------------------------------------------------------------ truncated responses
def test_a_response_is_truncated_only_without_a_stop_token():
    cfg, _ = load_run_config(["rollout.stop_token_ids=[7]"])
    owner = SimpleNamespace(tokenizer=SimpleNamespace(eos_token_id=2), cfg=cfg)
    responses = torch.tensor([[5, 5, 5], [5, 5, 2], [5, 7, 0], [2, 0, 0]])  # limit / EOS last / stop id / EOS
    assert Components.truncated(owner, Batch.from_dict({"responses": responses})).tolist() == [True, False, False, False]


def test_decode_gives_the_sampled_text_of_each_response():
    # the response part of attention_mask says what was sampled; special tokens (EOS) are dropped
    from rlplat.models.tiny import build_tokenizer

    tok = build_tokenizer()
    owner = SimpleNamespace(tokenizer=tok)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos, pad = tok.eos_token_id, tok.pad_token_id
    responses = torch.tensor([ids("12") + [eos, pad], ids("345") + [eos], ids("6789"), [pad] * 4])
    generated = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1], [0, 0, 0, 0]])
    prompt = torch.ones(4, 3, dtype=torch.long)
    batch = Batch.from_dict({"responses": responses, "attention_mask": torch.cat([prompt, generated], -1)})
    assert Components.decode(owner, batch) == ["12", "345", "689", ""]


def test_mask_truncated_clears_the_loss_mask_after_the_advantages():
    cfg, plan = load_run_config(["algorithm.truncated_responses=mask"])
    trainer = PPOTrainer(cfg, plan, components=None)
    assert trainer.stages.index("mask_truncated") == trainer.stages.index("advantages") + 1
    batch = Batch.from_dict({"response_mask": torch.ones(3, 2, dtype=torch.long), "advantages": torch.ones(3, 2),
                             "truncated": torch.tensor([False, True, False])})
    metrics_ = {}
    out = trainer.mask_truncated(batch, metrics_)
    assert out.tensors["response_mask"].tolist() == [[1, 1], [0, 0], [1, 1]]
    assert metrics_["batch/masked_truncated_frac"] == pytest.approx(1 / 3)
    assert "mask_truncated" not in PPOTrainer(*load_run_config([]), components=None).stages


@pytest.mark.parametrize("mode", ["keep", "penalize", "mask"])
def test_truncated_responses_in_a_run(embedded_cache, small_val, tmp_path, mode):
    # 3 tokens hold a two-digit answer and EOS, not a longer one: some responses are truncated
    out = tmp_path / mode
    # the mask run also drops the groups that scored alike (no resampling): the step trains on the rest
    drop = ["algorithm.drop_zero_gradient_groups=true"] if mode == "mask" else []
    train(out, 1, small_val, "data.max_response_length=3", f"algorithm.truncated_responses={mode}",
          "algorithm.truncated_penalty=-5", *drop)
    m = metrics(out)[1]
    # the responses that ended by themselves (a stop token within the limit): none is longer, on average not
    # longer than all responses, of which the truncated ones have the full length
    assert m["response_length/terminated/max"] <= 3 and m["batch/num_tokens"] > 0
    assert m["response_length/terminated/mean"] <= m["response_length/mean"]
    if drop:
        assert m["batch/kept_groups"] + m["batch/dropped_groups"] == 8
        assert m["batch/dropped_groups"] == min(m["batch/zero_gradient_groups"], 7)  # one worker: no rounding
        assert m["batch/kept_groups"] >= 1 and np.isfinite(m["actor/pg_loss"])
    assert 0 < m["response_length/truncation_ratio"] < 1
    if mode == "penalize":
        assert m["score/min"] == -5.0  # a truncated response's score is the penalty
    else:
        assert m["score/min"] >= 0.0
    if mode == "mask":
        assert m["batch/masked_truncated_frac"] == m["response_length/truncation_ratio"]
    else:
        assert "batch/masked_truncated_frac" not in m


# ---------------------------------------------------------------------------------------- dynamic prompts
HOOK = '''
import json, os

def pick(step, samples):
    """Serve the hardest prompt of this step twice next, and log what the hook saw."""
    with open(os.environ["HOOK_LOG"], "a") as f:
        f.write(json.dumps({"step": step, "index": [s["index"] for s in samples],
                            "keys": sorted(samples[0])}) + "\\n")
    worst = min(samples, key=lambda s: s["score"])
    row = {"data_source": "rlplat/arithmetic", "prompt": "1+1=", "reward_model": {"ground_truth": "2"}}
    return [worst["index"], worst["index"], row]
'''


def test_dynamic_prompts_hook_chooses_the_next_prompts(embedded_cache, small_val, tmp_path, monkeypatch):
    (tmp_path / "hook.py").write_text(HOOK)
    log = tmp_path / "hook.jsonl"
    monkeypatch.setenv("HOOK_LOG", str(log))
    train(tmp_path / "run", 3, small_val, f"data.dynamic_prompts_fn={tmp_path / 'hook.py'}:pick")
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["step"] for c in calls] == [1, 2, 3]
    assert calls[0]["keys"] == ["completion", "data_source", "extra_info", "ground_truth", "index", "prompt", "score"]
    for before, after in zip(calls, calls[1:]):
        served = after["index"][::4]  # rollout.n=4 responses per prompt
        assert served[:3] == [served[0], served[0], -1] and served[0] in before["index"]  # the hook's picks first
        assert all(i >= 0 for i in served[3:])  # then the dataset's order


def test_a_bad_dynamic_prompts_result_is_one_line(embedded_cache, small_val, tmp_path):
    (tmp_path / "hook.py").write_text("def pick(step, samples):\n    return [10**9]\n")
    with pytest.raises(RunError, match=r"step 1: data.dynamic_prompts_fn returned '1000000000'; expected None or a "
                                       r"list of dataset indices in \[0, \d+\)"):
        train(tmp_path / "run", 1, small_val, f"data.dynamic_prompts_fn={tmp_path / 'hook.py'}:pick")
    with pytest.raises(ConfigError, match=r"data.dynamic_prompts_fn='nowhere.py:pick': cannot load it: no such file .*nowhere.py"):
        train(tmp_path / "run2", 1, small_val, "data.dynamic_prompts_fn=nowhere.py:pick")


# -------------------------------------------------------------------------------------------- gpg F_norm
def test_gpg_f_norm_scales_the_advantages():
    def advantages(*extra):
        cfg, plan = load_run_config(["algorithm=gpg", *extra])
        batch = Batch.from_dict({"token_level_scores": torch.tensor([[1.0], [0.0], [1.0], [1.0]]),
                                 "response_mask": torch.ones(4, 1)},
                                non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)})
        return PPOTrainer(cfg, plan, components=None).advantages(batch, {}).tensors["advantages"]

    assert torch.allclose(advantages("algorithm.gpg_f_norm=4"), advantages() / 4)
    assert advantages().abs().sum() > 0
    with pytest.raises(ConfigError, match="algorithm.gpg_f_norm must be > 0, got 0"):
        load_run_config(["algorithm=gpg", "algorithm.gpg_f_norm=0"])
