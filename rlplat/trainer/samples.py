"""Sample tables: responses with their prompts and scores, one JSON line per step in a file of the run directory,
which the report shows as tables and the loggers receive: ``val_samples.jsonl`` (the first ``trainer.val_samples``
validation prompts' responses) and ``completions.jsonl`` (the first ``trainer.log_completions`` responses of each
training step, with their advantages and reward terms: TRL's ``log_completions``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlplat.data.vision import text_of
from rlplat.protocol import Batch
from rlplat.utils.tracking import TRAINING_SAMPLE_COLUMNS, Tracker, rewind_jsonl


class SampleLog:
    """``<output_dir>/<name>``: one line ``{"step", "samples"}`` per write, cut back on resume like
    ``metrics.jsonl``; each write also goes to the loggers (``tracker``) under ``key``."""

    def __init__(self, output_dir: str | Path, name: str, key: str, columns: tuple[str, ...]):
        self.path, self.key, self.columns = Path(output_dir) / name, key, columns

    def write(self, step: int, samples: list[dict], tracker: Tracker) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "samples": samples}) + "\n")
        tracker.log_samples(samples, step, self.key, self.columns)

    def rewind(self, keep_through: int | None) -> None:
        """Cut the lines after step ``keep_through`` (all when None), as the tracker cuts ``metrics.jsonl``."""
        rewind_jsonl(self.path, keep_through)


class CompletionLog(SampleLog):
    """``completions.jsonl``: the first responses of each training step (``trainer.log_completions``)."""

    def __init__(self, output_dir: str | Path):
        super().__init__(output_dir, "completions.jsonl", "train/completions", TRAINING_SAMPLE_COLUMNS)

    def log(self, step: int, batch: Batch, n: int, components) -> None:
        """Write the first ``n`` rows of ``batch`` (after its advantages), decoded by the run's ``components``."""
        shown = batch[torch.arange(min(len(batch), n))]
        samples = training_samples(shown, components.decode(shown), shown.meta.get("reward_term_names", ()))
        self.write(step, samples, components.tracker)


def samples_of(batch: Batch, responses: list[str], scores: list[float], **columns: list) -> list[dict]:
    """One dict per row of ``batch``: the prompt's last message, the response, its score, the ground truth and
    data source, and ``columns`` (each a list over the rows). An agent loop's trajectory shows as its whole
    conversation after the prompt (each message on a line of its own, led by its role: the tool calls and what
    they returned), not only the last answer."""
    nt = batch.non_tensors
    infos = nt["extra_info"] if "extra_info" in nt else [None] * len(batch)
    shown = [_conversation(info["agent"]["messages"][len(prompt):]) if info and "agent" in info else response
             for prompt, info, response in zip(nt["raw_prompt"], infos, responses)]
    rows = [{"prompt": text_of(prompt[-1]["content"]), "response": response, "score": score,
             "ground_truth": truth, "data_source": source}
            for prompt, response, score, truth, source in zip(nt["raw_prompt"], shown, scores, nt["ground_truth"],
                                                              nt["data_source"])]
    for name, values in columns.items():
        for row, value in zip(rows, values):
            row[name] = value
    return rows


def training_samples(batch: Batch, responses: list[str], term_names: tuple[str, ...]) -> list[dict]:
    """The rows of a training ``batch`` after its advantages: each response with its score (the sum of its token
    rewards before any KL penalty), its advantage (the mean over its response tokens: one value per sequence
    for the group estimators), each reward function's term by name, and whether it was cut off."""
    t = batch.tensors
    mask = t["response_mask"].float()
    scores = t["token_level_scores"].sum(-1).tolist()
    advantages = ((t["advantages"] * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    terms = t["reward_terms"].tolist() if "reward_terms" in t.keys() else [[] for _ in range(len(batch))]
    truncated = t["truncated"].tolist() if "truncated" in t.keys() else [None] * len(batch)
    return samples_of(batch, responses, scores, advantage=advantages, truncated=truncated,
                      reward_terms=[dict(zip(term_names, row)) for row in terms])


def _conversation(messages: list[dict]) -> str:
    return "\n".join(f"[{message.get('role')}] {text_of(message.get('content') or '')}" for message in messages)

