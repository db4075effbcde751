"""Step metrics computed on the controller, and the validation metrics (mean@N, best@N, maj@N, pass@k)."""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from rlplat.protocol import Batch
from rlplat.utils.errors import RunError


@contextlib.contextmanager
def timed(metrics: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    metrics[f"timing/{name}_s"] = metrics.get(f"timing/{name}_s", 0.0) + time.perf_counter() - start


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/std": float(values.std()) if values.numel() > 1 else 0.0,
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def data_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch: the response lengths of
    all responses and of those that ended by themselves (``response_length/terminated/*``, not cut off at the
    limit; TRL's ``*_terminated_length``), and the step's real tokens (``batch/num_tokens``, prompts and
    responses)."""
    t = batch.tensors
    mask = t["response_mask"].bool()  # the trained tokens (algorithm.truncated_responses=mask clears some rows)
    lengths = t["attention_mask"][:, -mask.shape[1]:].sum(-1)  # the generated tokens
    truncated = t["truncated"] if "truncated" in t.keys() else lengths >= max_response_length
    out = {
        **_stats("score", t["token_level_scores"].sum(-1)),
        **_stats("reward", t["token_level_rewards"].sum(-1)),
        **_stats("advantages", t["advantages"][mask]),
        **_stats("response_length", lengths),
        **_stats("response_length/terminated", lengths[~truncated.bool()]),
        "response_length/truncation_ratio": float(truncated.float().mean()),
        "batch/num_tokens": float(t["attention_mask"].sum()),
    }
    if "returns" in t.keys():
        out.update(_stats("returns", t["returns"][mask]))
    if "values" in t.keys():
        out.update(_stats("values", t["values"][mask]))
    return out


def agent_metrics(batch: Batch) -> dict[str, float]:
    """Means over a batch of agent trajectories (``extra_info["agent"]``, :mod:`rlplat.rollout.agent_loop`):
    turns and tool calls per trajectory, the share of tool calls that failed / timed out and their mean
    latency, how trajectories ended, the share of response tokens that are observations, and the
    re-tokenization drift (mean mismatch fraction, share of trajectories with any). Empty for single-turn."""
    agents = [info["agent"] for info in batch.non_tensors.get("extra_info", []) if isinstance(info, dict) and "agent" in info]
    if not agents:
        return {}
    count = len(agents)
    calls = sum(a["tool_calls"] for a in agents)
    mean = lambda key: sum(float(a[key]) for a in agents) / count  # noqa: E731
    out = {"agent/turns_mean": mean("turns"), "agent/tool_calls_mean": mean("tool_calls"),
           "agent/tool_error_rate": sum(a["tool_errors"] for a in agents) / max(calls, 1),
           "agent/tool_timeout_rate": sum(a["tool_timeouts"] for a in agents) / max(calls, 1),
           "timing/agent_tool_latency_s": sum(a["tool_seconds"] for a in agents) / max(calls, 1),
           "agent/retokenize_mismatch_frac": mean("retokenize_mismatch_frac"),
           "agent/retokenize_drift_frac": sum(a["retokenize_first_difference"] is not None for a in agents) / count}
    for ending in ("max_turns", "budget", "truncated"):
        out[f"agent/ended_{ending}_frac"] = sum(a["ended"] == ending for a in agents) / count
    attended = batch.tensors["attention_mask"][:, -batch.tensors["responses"].shape[1]:].sum()
    out["agent/observation_token_frac"] = sum(a["observation_tokens"] for a in agents) / max(float(attended), 1.0)
    return out


#: stages whose time is spent on every real token of the batch (prompt and response)
TOKEN_STAGES = ("old_log_probs", "reference", "values", "update_critic", "update_actor")


def throughput_metrics(batch: Batch, metrics: dict[str, float]) -> dict[str, float]:
    """Tokens per second: of the step (``perf/tokens_per_s``, real prompt + response tokens), of the
    generate stage (``perf/generate_tokens_per_s``, tokens sampled) and of each stage that runs every real
    token through a model (``perf/<stage>_tokens_per_s``, once per pass over the batch)."""
    t = batch.tensors
    tokens = float(t["attention_mask"].sum())
    generated = float(t["attention_mask"][:, -t["responses"].shape[1]:].sum())
    out = {"perf/tokens_per_s": tokens / metrics["timing/step_s"]}
    if metrics.get("timing/generate_s"):
        out["perf/generate_tokens_per_s"] = generated / metrics["timing/generate_s"]
    for stage in TOKEN_STAGES:
        if metrics.get(f"timing/{stage}_s"):
            out[f"perf/{stage}_tokens_per_s"] = tokens / metrics[f"timing/{stage}_s"]
    return out


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var(R − V) / Var(R) over valid tokens (``[batch, response_len]`` each): 1 for a perfect critic,
    0 for one no better than predicting the batch's mean return, negative for a worse one. Unlike the
    value loss it does not grow when the returns themselves become more varied (e.g. accuracy 0.1 -> 0.3)."""
    from rlplat.algorithms.masked import masked_var

    var_returns = float(masked_var(returns, mask))
    if var_returns == 0.0:
        return float("nan")
    return 1.0 - float(masked_var(returns - values, mask)) / var_returns


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2107.03374, eq. 1)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def validation_metrics(
    data_sources: Sequence[str], prompt_ids: Sequence[str], answers: Sequence[str], scores: Sequence[float],
    correct: Sequence[float] | None = None,
) -> dict[str, float]:
    """Per data source: ``mean@N`` (mean score), ``best@N`` (mean over prompts of the best score),
    ``maj@N`` (score of each prompt's most frequent answer), ``pass@1``/``pass@N`` (unbiased) and
    ``accuracy`` (share of correct samples); plus overall ``val/accuracy``. ``correct`` is 1/0 per sample
    (from the reward's ``acc`` field, see :meth:`~rlplat.reward.ScoreReport.correct`); without it a sample is
    correct when its score >= 1.
    """
    if correct is None:
        correct = [float(s >= 1.0) for s in scores]
    groups: dict[str, dict[str, list[tuple[str, float, float]]]] = defaultdict(lambda: defaultdict(list))
    for source, pid, answer, score, ok in zip(data_sources, prompt_ids, answers, scores, correct):
        groups[source][pid].append((answer.strip(), float(score), float(ok)))
    out: dict[str, float] = {}
    for source, prompts in groups.items():
        n = max(len(samples) for samples in prompts.values())
        rows = defaultdict(list)
        for samples in prompts.values():
            sample_scores = [s for _, s, _ in samples]
            num_correct = int(sum(ok >= 0.5 for _, _, ok in samples))
            counts: dict[str, int] = defaultdict(int)
            for answer, _, _ in samples:
                counts[answer] += 1
            majority = max(counts, key=lambda a: (counts[a], -[x for x, _, _ in samples].index(a)))
            rows["mean"].append(sum(sample_scores) / len(samples))
            rows["best"].append(max(sample_scores))
            rows["maj"].append(next(s for a, s, _ in samples if a == majority))
            rows["pass1"].append(pass_at_k(len(samples), num_correct, 1))
            rows["passn"].append(pass_at_k(len(samples), num_correct, len(samples)))
            rows["accuracy"].append(num_correct / len(samples))
        mean = {k: sum(v) / len(v) for k, v in rows.items()}
        prefix = f"val/{source}"
        out.update({
            f"{prefix}/mean@{n}": mean["mean"], f"{prefix}/best@{n}": mean["best"], f"{prefix}/maj@{n}": mean["maj"],
            f"{prefix}/pass@1": mean["pass1"], f"{prefix}/pass@{n}": mean["passn"], f"{prefix}/accuracy": mean["accuracy"],
        })
    out["val/accuracy"] = sum(float(ok >= 0.5) for ok in correct) / max(len(correct), 1)
    out["val/score_mean"] = sum(scores) / max(len(scores), 1)
    return out


class NonFiniteGuard:
    """A NaN/inf loss or gradient norm (``trainer.nonfinite``): ``stop`` the run before the step is saved (the last
    checkpoint is intact), or ``skip`` it — the engines apply no update whose gradient norm is not finite — and
    count it (``actor/skipped_steps``: the steps skipped since the run started), stopping once
    ``trainer.max_skipped_steps`` steps in a row were skipped (<= 0: never)."""

    def __init__(self, mode: str, max_in_a_row: int):
        self.mode, self.max_in_a_row = mode, int(max_in_a_row)
        self.skipped, self.in_a_row, self.last = 0, 0, None  # steps skipped, the latest run of them, its last

    def __call__(self, metrics: dict[str, float], step: int, newest: Path | None, logged: dict[str, float]) -> None:
        """Check one update's ``metrics`` (the critic's, the actor's) of ``step``; the count goes into ``logged``."""
        bad = {k: v for k, v in metrics.items() if ("loss" in k or "grad_norm" in k) and not math.isfinite(v)}
        if bad and step != self.last:
            self.skipped += 1
            self.in_a_row = self.in_a_row + 1 if self.last == step - 1 else 1
            self.last = step
        logged["actor/skipped_steps"] = float(self.skipped)
        if not bad:
            return
        shown = ", ".join(f"{k}={v}" for k, v in sorted(bad.items()))
        kept = f"the last checkpoint {newest.name} is intact" if newest else "nothing was saved"
        if self.mode != "skip":
            raise RunError(f"step {step}: {shown}; stopping (trainer.nonfinite=stop; {kept}). Lower the learning "
                           f"rate or check the rewards, or set trainer.nonfinite=skip to skip such steps")
        if 0 < self.max_in_a_row <= self.in_a_row:
            raise RunError(f"step {step}: {shown}; {self.in_a_row} steps in a row skipped (trainer.max_skipped_steps="
                           f"{self.max_in_a_row}), stopping ({kept}). Lower the learning rate or check the rewards")
        print(f"[step {step}] warning: {shown}; the update was skipped (trainer.nonfinite=skip; {self.in_a_row} in "
              "a row)", flush=True)
