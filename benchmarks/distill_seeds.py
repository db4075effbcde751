"""On-policy distillation against GRPO alone from the same start: validation-accuracy curves over seeds.

    python benchmarks/distill_seeds.py                              # 5 seeds x (opd, grpo), 200 steps, every 10
    python benchmarks/distill_seeds.py --seeds 2 --steps 60 --jobs 2
    python benchmarks/distill_seeds.py --runs grpo --steps 450      # GRPO alone on the Quickstart's 450 steps
    python benchmarks/distill_seeds.py --table                      # the table of the results kept

The student is the embedded model (``model.path=embedded``, the Quickstart's), the teacher the embedded model
fine-tuned further (``teacher.model_path=embedded-teacher``); both are validated greedily on the Quickstart's 256
held-out problems. Each run is the Quickstart's command in one process (``trainer.ray_address=inprocess``) with
``algorithm=opd teacher.model_path=embedded-teacher`` or ``algorithm=grpo``, ``trainer.total_steps=--steps``,
``trainer.test_freq=--every`` and, for seed k, ``trainer.seed=42+k data.seed=1+k``. The table gives each
algorithm's mean (std) validation accuracy at every validated step, and per seed the first validated step at
which the student closed half the gap between its own start and the teacher's accuracy (docs/distillation.md).

Results go to ``--results`` (one JSON per run, kept: a second call skips the runs already there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RUNS = {"opd": ["algorithm=opd", "teacher.model_path=embedded-teacher"], "grpo": ["algorithm=grpo"]}


def train(overrides: list[str], out: Path, threads: int | None = None) -> dict[int, float]:
    """One run of ``python -m rlplat.trainer.main`` in its own process (computing with ``threads`` threads: all
    by default): validation accuracy by step."""
    command = [sys.executable, "-m", "rlplat.trainer.main", *overrides, "trainer.ray_address=inprocess",
               f"trainer.output_dir={out}", "trainer.progress=off", "trainer.logger=[jsonl]"]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    shutil.rmtree(out, ignore_errors=True)  # a run left by an interrupted call would resume
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    rows = (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
    return {row["step"]: row["val/accuracy"] for row in rows if "val/accuracy" in row}


def teacher_accuracy(results: Path) -> float:
    """The teacher's greedy validation accuracy (its run's validation before its first step)."""
    kept = results / "teacher.json"
    if not kept.exists():
        curve = train(["model.path=embedded-teacher", "algorithm=grpo", "trainer.total_steps=1",
                       "trainer.test_freq=1"], results / "runs" / "teacher")
        kept.write_text(json.dumps({"accuracy": curve[0]}))
    return json.loads(kept.read_text())["accuracy"]


def run_one(name: str, seed: int, args, results: Path) -> None:
    kept = results / f"{name}-seed{seed}-{args.steps}x{args.every}.json"
    if kept.exists():
        return
    overrides = [*RUNS[name], f"trainer.seed={42 + seed}", f"data.seed={1 + seed}", f"trainer.total_steps={args.steps}",
                 f"trainer.test_freq={args.every}"]
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None  # the cores, shared out
    curve = train(overrides, results / "runs" / kept.stem, threads)
    kept.write_text(json.dumps({"run": name, "seed": seed, "curve": curve}))
    print(f"[distill_seeds] {kept.stem}: {' '.join(f'{s}:{a:.3f}' for s, a in curve.items())}", flush=True)


def half_gap_step(curve: dict[int, float], teacher: float) -> int | None:
    """The first validated step at which the accuracy reached the start's plus half the gap to the teacher's."""
    start = curve[0]
    target = start + (teacher - start) / 2
    return next((step for step, accuracy in sorted(curve.items()) if step > 0 and accuracy >= target), None)


def table(results: Path, steps: int, every: int) -> None:
    teacher = teacher_accuracy(results)
    print(f"teacher (embedded-teacher) greedy validation accuracy: {teacher:.3f}")
    curves = {name: [{int(s): a for s, a in json.loads(path.read_text())["curve"].items()}
                     for path in sorted(results.glob(f"{name}-seed*-{steps}x{every}.json"))] for name in RUNS}
    curves = {name: runs for name, runs in curves.items() if runs}
    marks = sorted(set().union(*(c.keys() for runs in curves.values() for c in runs)))
    print(f"\n| step | {' | '.join(f'{name} mean (std), {len(runs)} seeds' for name, runs in curves.items())} |")
    print(f"|---:|{'---:|' * len(curves)}")
    for step in marks:
        cells = []
        for runs in curves.values():
            values = [c[step] for c in runs if step in c]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.3f} ({spread:.3f})" if values else "")
        print(f"| {step} | {' | '.join(cells)} |")
    print("\nfirst validated step with half the gap to the teacher closed, per seed (- = not within the run):")
    for name, runs in curves.items():
        reached = [half_gap_step(c, teacher) for c in runs]
        print(f"  {name}: {', '.join('-' if s is None else str(s) for s in reached)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=10, help="validate every N steps")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each computing with its share of the cores")
    parser.add_argument("--results", type=Path, default=Path("outputs/distill_seeds"))
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS), help="which (default: both)")
    parser.add_argument("--table", action="store_true", help="only print the table of the results kept")
    args = parser.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    if not args.table:
        teacher_accuracy(args.results)
        with ThreadPoolExecutor(args.jobs) as pool:
            for done in [pool.submit(run_one, name, seed, args, args.results)
                         for seed in range(1, args.seeds + 1) for name in args.runs]:
                done.result()
    table(args.results, args.steps, args.every)


if __name__ == "__main__":
    main()
