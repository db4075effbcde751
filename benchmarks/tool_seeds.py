"""The tool-use learning test's gains over seeds: the spread its minimum gains are set from.

    python benchmarks/tool_seeds.py                      # the test's run and seeds 0..8, 20 steps
    python benchmarks/tool_seeds.py --seeds 3 --steps 10
    python benchmarks/tool_seeds.py --seeds 5 --environment verifiers   # the task as a verifiers ToolEnv
    OMP_NUM_THREADS=1 python benchmarks/tool_seeds.py --jobs 2   # two seeds at a time, one thread each

Each seed trains in a fresh process exactly as ``tests/trainer/test_agents.py`` does (its ``TOOL_RUN`` and
``correct_call_probability``; the embedded tool model from the cache, built on first use): seed "test" is
the test's own run, seed k adds ``trainer.seed=k data.seed=k``. Printed per seed: the validation accuracy
(mean@8 at T=1 on 128 held-out problems) before and after, P(the correct call) before and after (exact,
teacher forcing) and the tool calls per trajectory at the first and last step; then per gain the mean,
std, min and the minimum of the rule in docs/learning_thresholds.md. ``--environment verifiers`` trains the same
problems through the verifiers ``ToolEnv`` of ``examples/environments/verifiers_arithmetic.py`` (its rubric's
``correct`` for the reward; docs/environments.md) instead of rlplat's own tool environment, every other setting
the same.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module(name: str, path: Path):
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def verifiers_data(tmp: Path) -> tuple[list[str], Path]:
    """The tool task's rows through the verifiers ToolEnv of tests/envs: (its overrides, the validation file)."""
    from rlplat.data import write_parquet
    from rlplat.data.verifiers import rows

    envs = str(ROOT / "examples" / "environments" / "verifiers_arithmetic.py")
    train = write_parquet(rows(envs, {"kind": "tool", "count": 20_000}), tmp / "train.parquet")  # as builtin:
    val = write_parquet(rows(envs, {"kind": "tool", "count": 128, "seed": 1, "split": "test"}), tmp / "val.parquet")
    return [f"data.train_files={train}", f"rollout.agent.environment=verifiers:{envs}",
            "rollout.agent.environment_args.kind=tool"], val


def one_run(seed: str, steps: int, environment: str = "rlplat") -> dict:
    """Train one seed in this process and measure it (what the test does)."""
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "tests"))
    from trainer.test_agents import TOOL_RUN, correct_call_probability
    from trainer.test_trainer import metrics

    from rlplat.data import TASKS, RLDataset, write_parquet
    from rlplat.data.synthetic import with_tool_demonstrations
    from rlplat.trainer.run import load_run_config, run
    from rlplat.trainer.sft import ensure_embedded_model, row_tools

    tmp = Path(tempfile.mkdtemp(prefix="tool-seeds-"))
    val_rows = TASKS.get("tool_arithmetic")(128, seed=1, split="test")
    model_dir = str(ensure_embedded_model("embedded-tools"))
    demos = write_parquet(with_tool_demonstrations(val_rows, 1.0, 0), tmp / "demos.parquet")
    rows = list(RLDataset(demos, AutoTokenizer.from_pretrained(model_dir), 512, tools_of=row_tools))
    seeds = [] if seed == "test" else [f"trainer.seed={seed}", f"data.seed={seed}"]
    if environment == "rlplat":
        extra, val_file = [], write_parquet(val_rows, tmp / "val.parquet")
    else:
        extra, val_file = verifiers_data(tmp)
    cfg, plan = load_run_config([*TOOL_RUN, f"trainer.total_steps={steps}", f"trainer.output_dir={tmp}/run",
                                 f"data.val_files={val_file}", *seeds, *extra])
    summary = run(cfg, plan)
    step = metrics(tmp / "run")
    return {"seed": seed, "steps": steps, "acc": [step[0]["val/accuracy"], step[steps]["val/accuracy"]],
            "call": [correct_call_probability(model_dir, rows), correct_call_probability(summary["hf_export"], rows)],
            "calls": [step[1]["agent/tool_calls_mean"], step[steps]["agent/tool_calls_mean"]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=9, help="seeds 0..N-1, besides the test's own run")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once (with OMP_NUM_THREADS=1 on a "
                        "machine with that many idle cores)")
    parser.add_argument("--environment", default="rlplat", choices=["rlplat", "verifiers"],
                        help="the tool environment: rlplat's own, or the task as a verifiers ToolEnv")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one seed, JSON on the last line
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args.one, args.steps, args.environment)))
        return 0
    rule = module("learning_seeds", ROOT / "benchmarks" / "learning_seeds.py")
    print("| seed | steps | val accuracy before -> after | gain | P(correct call) before -> after | gain | "
          "tool calls per trajectory, step 1 -> last |\n|---|---:|---|---:|---|---:|---|", flush=True)
    seeds = ["test", *map(str, range(args.seeds))]

    def child(seed: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, __file__, "--one", seed, "--steps", str(args.steps),
                               "--environment", args.environment],
                              capture_output=True, text=True, cwd=ROOT)

    results = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for seed, done in zip(seeds, pool.map(child, seeds)):  # printed in seed order
            if done.returncode != 0:
                print(f"seed {seed}: FAILED (exit {done.returncode})\n{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            r = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(r)
            (a0, a1), (c0, c1), (t0, t1) = r["acc"], r["call"], r["calls"]
            print(f"| {seed} | {args.steps} | {a0:.3f} -> {a1:.3f} | {a1 - a0:+.3f} | {c0:.3f} -> {c1:.3f} | "
                  f"{c1 - c0:+.3f} | {t0:.2f} -> {t1:.2f} |", flush=True)
    for key in ("acc", "call"):
        gains = [r[key][1] - r[key][0] for r in results]
        print(f"{key} gain: mean {statistics.mean(gains):+.3f}, std {statistics.stdev(gains):.3f}, "
              f"min {min(gains):+.3f}; bound {rule.lower_bound(gains):+.3f}, rule {rule.min_gain(gains):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
