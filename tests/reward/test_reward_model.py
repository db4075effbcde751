"""A learned reward model as the reward: scoring on its workers, GRPO learning what it prefers, its placement.

The reward model is a tiny sequence-classification model trained for the session (the
``tiny_reward_model`` fixture: rlplat.models.tiny ``build_tiny_reward_model``, ~5 s) to score arithmetic answers that contain a "7" high. The learning test
uses it as the only reward and measures the share of sampled answers (T = 1, 256 held-out prompts)
that contain a 7, before and after 20 GRPO steps. Its minimum gain is the rule of docs/learning_thresholds.md
over the seeds of ``benchmarks/reward_model_seeds.py`` on both kinds of CPU, the lower of the two: with AVX-512
5 seeds gained 0.51-0.61 (mean 0.56, std 0.04: the rule's 0.245); without, 10 seeds gained 0.570-0.738
(mean 0.688, std 0.051: 0.455).
"""

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlplat.config import ConfigError
from rlplat.protocol import Batch
from rlplat.reward import ModelOutcomes, RewardConfigError, RewardFailure, RewardValue, build_reward_manager
from rlplat.trainer.run import load_run_config, run
from rlplat.workers.reward_model import RewardModelWorker

PROMPT = [{"role": "user", "content": "12+35="}]
REWARD_MODEL_MIN_GAIN = 0.245  # the module docstring: the rule over the seeds of both kinds of CPU


def rm_cfg(path, **model):
    return OmegaConf.create({"reward": {"model": {"path": path, "micro_batch_size": 2, "max_length": 64,
                                                  "apply_chat_template": True, **model}},
                             "model": {"trust_remote_code": False}})


def test_the_reward_model_worker_scores_prompt_and_response_in_micro_batches(tiny_reward_model):
    worker = RewardModelWorker(0, 1, "cpu", rm_cfg(tiny_reward_model))
    worker.init_model()
    rows = Batch.from_dict(non_tensors={"raw_prompt": [PROMPT] * 5, "response_text": ["47", "46", "7", "1", "777"]})
    scores = worker.score(rows).tensors["rm_scores"]
    assert scores.shape == (5,)
    assert min(scores[[0, 2, 4]]) > 0 > max(scores[[1, 3]])  # with a 7 / without
    one_by_one = torch.cat([worker.score(rows[i:i + 1]).tensors["rm_scores"] for i in range(5)])
    assert torch.allclose(scores, one_by_one, atol=1e-5)  # padding in a micro-batch changes nothing


def test_a_directory_that_is_not_a_reward_model_is_one_clear_error(tmp_path, tiny_model_path):
    from rlplat.utils.errors import RunError

    worker = RewardModelWorker(0, 1, "cpu", rm_cfg(str(tmp_path / "missing")))
    with pytest.raises(RunError, match="is not a Hugging Face sequence-classification model directory"):
        worker.init_model()


def test_reward_model_config_rules(tiny_reward_model):
    assert build_reward_manager({"model": {"path": tiny_reward_model}}).names == ["reward_model"]  # replaces auto
    both = build_reward_manager({"functions": ["reward_model", "format"], "weights": [1.0, 0.2],
                                 "model": {"path": tiny_reward_model}, "isolation": "inprocess"})
    assert both.names == ["reward_model", "format_reward"]
    with pytest.raises(RewardConfigError, match="does not list reward_model"):
        build_reward_manager({"functions": ["format"], "model": {"path": tiny_reward_model}})
    with pytest.raises(RewardConfigError, match="reward.model.path is not set"):
        build_reward_manager({"functions": ["reward_model"]})
    # the manager weighs model outcomes like any function's; a bad one is a counted error
    result = both.score(["<think>a</think><answer>1</answer>", "x"], ["s"] * 2, ["1"] * 2, [{}] * 2, [1, 1],
                        model_outcomes={"reward_model": ModelOutcomes(
                            [RewardValue(2.0), RewardFailure("bad_value", "the reward model gave nan on sample 1")],
                            seconds=0.5)})
    assert result.scores == [2.0 + 0.2, 0.0] and result.num_errors == 1
    assert result.stats["reward_model"]["latency_mean_s"] == 0.25  # the batch's seconds per sample
    with pytest.raises(ConfigError, match="reward.model.placement='nearby' is not one of: colocated, separate"):
        load_run_config(["reward.model.placement=nearby"])


def sevens_share(model_dir: str, prompts: int = 256, seed: int = 0) -> float:
    """The share of T = 1 samples that contain a 7, on the arithmetic task's held-out prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlplat.data import RLDataset, resolve_files

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    data = RLDataset(resolve_files(["builtin:arithmetic"], "test"), tok, 128, "error", True)
    rows = [list(data[i]["prompt_ids"]) for i in range(prompts)]
    torch.manual_seed(seed)
    hits = 0
    with torch.no_grad():
        for start in range(0, len(rows), 64):
            chunk = rows[start:start + 64]
            width = max(map(len, chunk))
            ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in chunk])
            out = model.generate(ids, attention_mask=(ids != tok.pad_token_id).long(), do_sample=True,
                                 temperature=1.0, top_k=0, max_new_tokens=8, pad_token_id=tok.pad_token_id)
            hits += sum("7" in tok.decode(row, skip_special_tokens=True) for row in out[:, width:])
    return hits / len(rows)


@pytest.mark.slow
def test_grpo_with_the_reward_model_as_the_only_reward_learns_what_it_prefers(tiny_reward_model, embedded_cache, tmp_path):
    from rlplat.models.embedded import embedded_model_dir

    before = sevens_share(str(embedded_model_dir()))
    cfg, plan = load_run_config(["algorithm=grpo", "trainer.ray_address=inprocess", f"trainer.output_dir={tmp_path}",
                                 f"reward.model.path={tiny_reward_model}", "trainer.total_steps=20",
                                 "data.train_batch_size_prompts=16", "trainer.test_freq=0", "trainer.seed=1",
                                 "data.seed=1"])
    run(cfg, plan)
    after = sevens_share(str(tmp_path / "hf_export"))
    print(f"share of samples with a 7: {before:.3f} -> {after:.3f}")
    assert after - before > REWARD_MODEL_MIN_GAIN
    lines = [json.loads(line) for line in (Path(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    first = next(m for m in lines if m["step"] == 1)
    assert "reward/reward_model_mean" in first and "reward_calls/reward_model_std" in first


@pytest.mark.slow
def test_a_separate_reward_model_runs_on_its_own_ray_workers(tiny_reward_model, embedded_cache, small_val, tmp_path, ray_cluster):
    from rlplat.models.embedded import embedded_model_dir
    from rlplat.reward.batch import model_outcomes
    from rlplat.trainer.components import build_components

    cfg, plan = load_run_config([f"trainer.output_dir={tmp_path}", f"data.val_files={small_val}",
                                 f"reward.model.path={tiny_reward_model}", "reward.model.placement=separate"])
    components = build_components(cfg, plan, str(embedded_model_dir()))
    try:
        rm, actor = components.reward_model, components.actor
        assert len(components.pools) == 2 and not set(rm.actors) & set(actor.actors)
        given = model_outcomes(components.model_scorers, cfg.reward, [PROMPT, PROMPT], ["47", "46"], ["47", "47"])
        outcomes = given["reward_model"].outcomes
        assert outcomes[0].score > 0 > outcomes[1].score
    finally:
        components.shutdown()
