"""The run's timeline: which pool was busy with what, and when (``timeline.jsonl``, the report's timeline.svg).

Each step appends one line ``{"step", "start", "end", "spans": [[pool, what, start, end], ...]}`` (wall-clock
seconds). Pools: ``trainer`` (a call the controller waits for on the training workers: log-probs, updates,
weight export; and generation when the rollout is colocated), ``rollout`` (a separate rollout pool's
generations, as the rollout workers timed them; they are written with the step that used them), and
``controller`` (work in the controller itself: rewards, advantages, waiting for a batch). A resumed run
cuts the lines after its checkpoint, as ``metrics.jsonl``.

``timing/trainer_idle_frac`` (each step) is the part of the step the training workers were not computing
for it. A separate rollout pool's idle fraction needs the generations of the next K steps, so it is
computed over the whole run: ``summary.json`` ``idle_frac`` (:func:`idle_fractions`) and the report.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlplat.utils.tracking import rewind_jsonl

#: the stages whose whole time the training workers compute (the controller waits for them)
TRAINING_POOL_STAGES = frozenset({"old_log_probs", "reference", "teacher", "values", "update_critic", "update_actor",
                                  "sync_rollout", "sync_reference"})
POOLS = ("trainer", "rollout", "controller")


def busy_seconds(spans: list[list], pool: str, start: float, end: float) -> float:
    """The time within [start, end] that at least one span of ``pool`` covers (overlaps counted once)."""
    covered, reach = 0.0, start
    for _, _, a, b in sorted((s for s in spans if s[0] == pool), key=lambda s: s[2]):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered


def idle_fractions(rows: list[dict]) -> dict[str, float]:
    """Each pool's idle fraction from the first logged step's start to the last one's end (the timeline's
    rows); a pool with no span at all (no separate rollout pool) is left out."""
    if not rows:
        return {}
    start, end = min(r["start"] for r in rows), max(r["end"] for r in rows)
    spans = [s for r in rows for s in r["spans"]]
    return {pool: 1.0 - busy_seconds(spans, pool, start, end) / max(end - start, 1e-9)
            for pool in ("trainer", "rollout") if any(s[0] == pool for s in spans)}


class Timeline:
    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / "timeline.jsonl"
        self.spans: list[list] = []

    def rewind(self, keep_through: int | None) -> None:
        """Cut the lines after step ``keep_through`` (all when None), as the tracker cuts ``metrics.jsonl``."""
        rewind_jsonl(self.path, keep_through)

    def add(self, pool: str, what: str, start: float, end: float) -> None:
        self.spans.append([pool, what, start, end])

    def end_step(self, step: int, start: float, end: float) -> float:
        """Write the step's line; returns the training pool's idle fraction over the step."""
        spans, self.spans = self.spans, []
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "start": start, "end": end, "spans": spans}) + "\n")
        return 1.0 - busy_seconds(spans, "trainer", start, end) / max(end - start, 1e-9)


def read_timeline(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "timeline.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:  # the line a killed run was writing
            continue
    return rows
