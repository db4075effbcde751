"""``summary.json``: what a finished (or stopped) run reports: accuracies before and after, steps, wall
time, where its outputs are, and the algorithm that produced them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from omegaconf import DictConfig

from rlplat.trainer.timeline import idle_fractions, read_timeline


def write_summary(cfg: DictConfig, steps: int, initial: dict, final: dict, wall_time_s: float,
                  accuracy_source: str | None, reward_functions: list[str]) -> dict:
    """Write ``<trainer.output_dir>/summary.json`` and return it. ``initial`` and ``final`` are the first and
    last validation's metrics; ``accuracy_source`` says where val accuracy's "correct" comes from (the
    reward's ``acc`` field, or the ``score >= 1`` rule)."""
    out_dir = Path(cfg.trainer.output_dir)
    algo = cfg.algorithm
    summary = {
        "initial_val_accuracy": initial.get("val/accuracy"),
        "final_val_accuracy": final.get("val/accuracy"),
        "steps": steps,
        "wall_time_s": wall_time_s,
        "output_dir": str(out_dir.resolve()),
        "hf_export": str((out_dir / "hf_export").resolve()),
        "final_val": final,
        "val_accuracy_source": accuracy_source,
        "preset": algo.preset,
        "adv_estimator": algo.adv_estimator,
        "policy_loss": algo.policy_loss,
        "loss_agg_mode": algo.loss_agg_mode,
        "kl": {"in_reward": algo.kl_penalty if algo.use_kl_in_reward else None,
               "loss": algo.kl_loss_type if algo.use_kl_loss else None},
        "reward_functions": reward_functions,
        # each pool's idle fraction over the steps (rlplat.trainer.timeline; "rollout" with a separate pool)
        "idle_frac": idle_fractions(read_timeline(out_dir)),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


class WallClock:
    """A run's wall time over the commands that made it: ``segments.json`` in the output dir lists each
    command's start and the time of its last finished step (``mark``), so a run killed and resumed counts
    the time every segment ran, the steps redone after the resume included."""

    def __init__(self, output_dir: str | Path, resumed: bool):
        self.path = Path(output_dir) / "segments.json"
        earlier = []
        if resumed and self.path.is_file():
            try:
                earlier = json.loads(self.path.read_text())
            except ValueError:  # damaged: the earlier commands' time is lost, not the run
                print(f"[summary] warning: {self.path} does not parse; wall_time_s counts this command only",
                      flush=True)
        now = time.time()
        self.segments = [*earlier, {"start": now, "end": now}]
        self.mark()

    def mark(self) -> None:
        """The current segment lasts until now."""
        self.segments[-1]["end"] = time.time()
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.segments))
        os.replace(tmp, self.path)

    @property
    def seconds(self) -> float:
        return sum(s["end"] - s["start"] for s in self.segments)
