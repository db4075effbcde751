"""Synchronous (colocated) against asynchronous (a separate rollout pool, K steps ahead) training.

    python benchmarks/async.py                                # both workloads, sync / K=1 / K=2, 20 steps
    python benchmarks/async.py --workloads heavy --steps 12 --repeats 2
    python benchmarks/async.py --workloads heavy --modes sync async1 async1-stream async1-resume

Each run is a fresh process training with Ray on this machine's cores, in the order sync, K=1, K=2 (then
again with ``--repeats``, so a slow hour hits every mode alike). Workloads:

* ``quickstart``: the Quickstart's GRPO (``algorithm=grpo``, the embedded model, the arithmetic task: 64
  prompts x 8 responses of at most 8 tokens per step).
* ``heavy``: generation-heavy, with a long tail of response lengths and an I/O-bound reward: 16 prompts x
  4 responses of up to 128 tokens; EOS does not end a response (``rollout.ignore_eos``) and token ``4``
  does (``rollout.stop_token_ids=[11]``: ~2.3% of the embedded model's tokens after its answer, so the
  lengths are about geometric: most responses stop within 60 tokens, the longest run to 128); every
  reward call waits 50 ms before it scores (a remote judge or sandbox), on 8 reward workers.

Further modes (``--modes``): ``async1-stream`` (K = 1, calls of 4 prompt groups: ``rollout.stream_groups=4``) and
``async1-resume`` (K = 1, updates loaded between two tokens: ``rollout.partial=resume``).

Printed per run: samples per second over the steps after the first two (the timeline's wall-clock span of
those steps), each pool's idle fraction over the run (``summary.json`` ``idle_frac``: the trainer pool, and
the rollout pool when it is separate), the mean time a step waited for its batch (``timing/generate_s``),
the largest staleness, and validation accuracy after the run (every mode trains on the same number of
samples).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = {"sync": [], "async1": ["rollout.mode=separate", "trainer.async_steps=1"],
         "async2": ["rollout.mode=separate", "trainer.async_steps=2"],
         # K = 1 with calls of 4 prompt groups scored as each arrives, or updates loaded between two tokens
         "async1-stream": ["rollout.mode=separate", "trainer.async_steps=1", "rollout.stream_groups=4"],
         "async1-resume": ["rollout.mode=separate", "trainer.async_steps=1", "rollout.partial=resume"]}
DEFAULT_MODES = ["sync", "async1", "async2"]
SLOW_REWARD = '''import time

from rlplat.reward.scorers import arithmetic


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(0.05)  # a remote call
    return arithmetic(data_source, solution_str, ground_truth, extra_info)
'''
WORKLOADS = {
    "quickstart": ["algorithm=grpo"],
    "heavy": ["algorithm=grpo", "data.train_batch_size_prompts=16", "actor.mini_batch_size_prompts=16", "rollout.n=4",
              "data.max_response_length=128", "rollout.ignore_eos=true", "rollout.stop_token_ids=[11]",
              "reward.num_workers=8", "data.val_batch_size_prompts=64"],
}
SKIP = 2  # the first steps: Ray calls and caches warming up


def one_run(mode: str, workload: str, out: Path, steps: int, reward_file: Path) -> None:
    from rlplat.trainer.run import load_run_config, run

    extra = [f"reward.custom_fn.path={reward_file}"] if workload == "heavy" else []
    cfg, plan = load_run_config([*WORKLOADS[workload], *MODES[mode], *extra, f"trainer.output_dir={out}",
                                 f"trainer.total_steps={steps}", "trainer.test_freq=-1", "trainer.progress=off",
                                 "trainer.logger=[jsonl]"])
    run(cfg, plan)


def measure(out: Path, samples_per_step: int) -> dict[str, float]:
    summary = json.loads((out / "summary.json").read_text())
    timeline = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()][SKIP:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "timing/step_s" in m][SKIP:]
    span = timeline[-1]["end"] - timeline[0]["start"]
    return {"samples_per_s": samples_per_step * len(timeline) / span,
            "trainer_idle": summary["idle_frac"].get("trainer", float("nan")),
            "rollout_idle": summary["idle_frac"].get("rollout", float("nan")),
            "wait_s": statistics.mean(m["timing/generate_s"] for m in steps),
            "staleness_max": max((m.get("off_policy/staleness_max", 0.0) for m in steps), default=0.0),
            "val_accuracy": summary["final_val_accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=["quickstart", "heavy"])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=DEFAULT_MODES)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--one", nargs=4, metavar=("MODE", "WORKLOAD", "OUT", "REWARD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        mode, workload, out, reward = args.one
        one_run(mode, workload, Path(out), args.steps, Path(reward))
        return
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="rlplat-async-") as tmp:
        reward = Path(tmp) / "slow_reward.py"
        reward.write_text(SLOW_REWARD)
        for workload in args.workloads:
            per_step = {"quickstart": 64 * 8, "heavy": 16 * 4}[workload]
            for repeat in range(args.repeats):
                for mode in args.modes:
                    out = Path(tmp) / f"{workload}-{mode}-{repeat}"
                    done = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--one", mode, workload,
                                           str(out), str(reward)], capture_output=True, text=True)
                    if done.returncode != 0:
                        sys.exit(f"{workload} {mode} failed:\n{done.stderr[-3000:]}")
                    results.setdefault((workload, mode), []).append(measure(out, per_step))
                    print(f"[{workload} {mode} {repeat + 1}/{args.repeats}] {results[workload, mode][-1]}", flush=True)
    print(f"\n{args.steps} steps per run (samples/s over the steps after the first {SKIP}); medians of {args.repeats} run(s)")
    print("| workload | mode | samples/s | vs sync | trainer idle | rollout idle | wait for batch, s | max staleness | val accuracy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for workload in args.workloads:
        base = statistics.median(r["samples_per_s"] for r in results.get((workload, "sync"), [{"samples_per_s": float("nan")}]))
        for mode in args.modes:
            runs = results[workload, mode]
            med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            print(f"| {workload} | {mode} | {med['samples_per_s']:.1f} | {med['samples_per_s'] / base:.2f}x | "
                  f"{med['trainer_idle']:.2f} | {med['rollout_idle']:.2f} | {med['wait_s']:.3f} | "
                  f"{med['staleness_max']:.0f} | {med['val_accuracy']:.3f} |")


if __name__ == "__main__":
    main()
