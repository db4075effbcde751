"""Each main algorithm makes the embedded model better at the built-in task in a few CPU steps.

Improvement is measured exactly rather than by sampling: on 256 held-out arithmetic prompts, the mean
probability the policy gives the correct answer followed by EOS, computed by teacher forcing with plain
transformers. With the exact-match arithmetic reward this is the expected reward of a temperature-1 sample
(minus the small share of other spellings the scorer also accepts), so a short run's before/after
comparison carries no sampling noise.
"""

import json
from pathlib import Path

import pytest
import torch

from rlplat.data import RLDataset, resolve_files
from rlplat.trainer.run import load_run_config, run

STEPS = 40  # x 64 prompts x 8 responses, 4 optimizer steps each: ~20 s per algorithm (ppo ~40 s)
# Teacher-forced, so a run's gain is exact and reproducible (seeded). The smallest gain is rloo's:
# 0.1264 -> 0.1644 (+0.038), measured after rollouts began sampling the full softmax the trainer's
# log-probs describe; it was +0.112 when transformers' hidden top-k 50 truncated sampling (the likely
# cause of the drop, not yet confirmed by a controlled run).
MIN_GAIN = 0.03
# ppo's critic at its default learning rate. The raw value loss is not a fair yardstick: its floor,
# about ½·Var(return) = ½·p(1 − p) for a 0/1 reward, *grows* as the policy's accuracy p rises from 0.12.
# So the test checks the value loss relative to that variance, 1 − explained variance = Var(R − V) /
# Var(R) (before each update): it must fall, and end about as good as predicting the mean return or
# better (1e-4: explained variance -1.05 -> +0.01 within 9 steps; the old default 1e-5: -0.30 after 30).
MIN_FINAL_EXPLAINED_VAR = -0.1
ALGORITHMS = ["grpo", "dr_grpo", "dapo", "ppo", "rloo", "gdpo"]  # ppo: critic + GAE, KL in the reward


def correct_answer_probability(model_dir: str, rows: list[dict]) -> float:
    """Mean over dataset items of P(ground truth + EOS | prompt) under the model in ``model_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total = 0.0
    with torch.no_grad():
        for row in rows:
            prompt = list(row["prompt_ids"])  # chat-formatted, as the trainer generates from it
            answer = tok(str(row["ground_truth"]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ids = torch.tensor([prompt + answer])
            log_probs = model(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
            total += float(log_probs.gather(-1, torch.tensor(answer)[:, None]).sum().exp())
    return total / len(rows)


@pytest.fixture(scope="module")
def held_out(embedded_cache):
    from transformers import AutoTokenizer

    from rlplat.trainer.sft import ensure_embedded_model

    model_dir = str(ensure_embedded_model())
    data = RLDataset(resolve_files(["builtin:arithmetic"], "test"), AutoTokenizer.from_pretrained(model_dir), 128,
                     "error", True)
    rows = [data[i] for i in range(len(data))]
    return model_dir, rows, correct_answer_probability(model_dir, rows)


def train_and_measure(overrides: list[str], held_out, small_val, tmp_path) -> tuple[float, float, dict]:
    model_dir, rows, before = held_out
    cfg, plan = load_run_config([
        "trainer.ray_address=inprocess", f"trainer.total_steps={STEPS}",
        f"trainer.output_dir={tmp_path}", "trainer.test_freq=0", f"data.val_files={small_val}",
        "rollout.val_n=1", "actor.optim.lr_schedule=constant",  # cosine would decay the LR within the 40 steps
        *overrides,
    ])
    summary = run(cfg, plan)
    return before, correct_answer_probability(summary["hf_export"], rows), summary


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_algorithm_raises_expected_reward(algorithm, held_out, small_val, tmp_path):
    before, after, summary = train_and_measure([f"algorithm={algorithm}"], held_out, small_val, tmp_path)
    print(f"{algorithm}: P(correct answer) {before:.4f} -> {after:.4f}")
    assert after > before + MIN_GAIN, (algorithm, before, after)
    if algorithm == "ppo":  # the critic learns on its default learning rate too
        metrics_file = Path(summary["output_dir"]) / "metrics.jsonl"
        loss_first, loss_last = metric_ends(metrics_file, "critic/vf_loss")
        ev_first, ev_last = metric_ends(metrics_file, "critic/vf_explained_var")
        print(f"ppo critic, mean of the first / last 5 steps: vf_loss {loss_first:.4f} -> {loss_last:.4f}, "
              f"explained variance {ev_first:.3f} -> {ev_last:.3f}")
        assert ev_last > max(ev_first, MIN_FINAL_EXPLAINED_VAR), (ev_first, ev_last)


def metric_ends(metrics_file: Path, key: str, k: int = 5) -> tuple[float, float]:
    """Mean of ``key`` over the first and over the last ``k`` training steps of a run's metrics.jsonl."""
    values = [m[key] for m in map(json.loads, metrics_file.read_text().splitlines()) if key in m]
    return sum(values[:k]) / k, sum(values[-k:]) / k


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_optimal_token_baselines_raise_expected_reward(estimator, held_out, small_val, tmp_path):
    before, after, _ = train_and_measure(["algorithm=grpo", f"algorithm.adv_estimator={estimator}"], held_out,
                                         small_val, tmp_path)
    print(f"{estimator}: P(correct answer) {before:.4f} -> {after:.4f}")
    assert after > before + MIN_GAIN, (estimator, before, after)


@pytest.mark.slow
def test_grpo_with_vllm_rollout_raises_expected_reward(held_out, small_val, tmp_path):
    pytest.importorskip("vllm")
    before, after, _ = train_and_measure(["algorithm=grpo", "rollout=vllm"], held_out, small_val, tmp_path)
    print(f"grpo + vllm: P(correct answer) {before:.4f} -> {after:.4f}")
    assert after > before + MIN_GAIN, (before, after)
