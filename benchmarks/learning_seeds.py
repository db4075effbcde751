"""The learning tests' gains over several seeds: the spread each test's minimum gain is set from.

    python benchmarks/learning_seeds.py                        # each test's run, 5 seeds, at the test's steps
    python benchmarks/learning_seeds.py --seeds 10 --steps 40 --every 10   # + the gain after 10, 20, 30 steps
    python benchmarks/learning_seeds.py --runs rloo --extra rollout.top_k=50 --label top50
    python benchmarks/learning_seeds.py --runs grpo --control no-signal     # a run that cannot learn
    python benchmarks/learning_seeds.py --table --seeds 10 --steps 40      # the tables of the results kept
    cd /tmp && PYTHONPATH=/tmp/wt-<sha> python <checkout>/benchmarks/learning_seeds.py --runs rloo  # another commit

Each (run, seed) trains in a fresh process exactly as ``tests/trainer/test_learning.py`` does: its
``RUNS``, ``learning_run``, ``held_out_rows`` and ``correct_answer_probability`` are imported from that
file, and the validation file is conftest's ``small_val``. Seed 0 is the test's own run (the defaults
trainer.seed=42, data.seed=1); seed k adds ``trainer.seed=42+k data.seed=1+k``. The gain is P(correct
answer + EOS) on the 256 held-out prompts after the run minus before it, exact (teacher forcing), so the
spread is that of the runs, not of the measurement. Per run and measured step the table gives mean, std,
min, the 99.9% lower prediction bound of one more run's gain and the minimum gain the rule of
docs/learning_thresholds.md makes of it.

Controls, to show what a run that cannot learn gains: ``--control lr-tiny`` (``actor.optim.lr=1e-30``,
the smallest change validation allows, far below a float32 weight's resolution: the gain must be exactly
0) and ``--control no-signal`` (the reward is 1 for a fixed pseudo-random 15% of (problem, response)
pairs, whatever the answer: updates of the usual size that carry no information about arithmetic).

Results go to ``--results`` (one JSON per run, kept: a second call skips the runs already there and prints
the table over all of them). ``--jobs`` runs several at once, for a machine with idle cores only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_FILE = ROOT / "tests" / "trainer" / "test_learning.py"
FLOOR = 0.02  # no test's minimum gain is lower: runs that cannot learn gain <= 0 (docs/learning_thresholds.md)
NO_SIGNAL_SHARE = 0.15  # rewarded share under --control no-signal: about the embedded model's accuracy
NO_SIGNAL_REWARD = '''import hashlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1 for a fixed pseudo-random {share:.0%} of (problem, response) pairs, whatever the answer."""
    digest = hashlib.sha256(f"{seed}|{{ground_truth}}|{{solution_str}}".encode()).digest()
    return 1.0 if int.from_bytes(digest[:4], "little") < {share} * 2**32 else 0.0
'''


def learning_test():
    """tests/trainer/test_learning.py as a module (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location("test_learning", TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def embedded_model(run) -> str:
    """The warm-started embedded model the test's ``run`` starts from (built on first use), as the test gets it."""
    try:
        from rlplat.trainer.sft import ensure_embedded_model
    except ImportError:  # older commits (before 93406be) kept it here; the A/B runs in the doc use them
        from rlplat.models.embedded import ensure_embedded_model
    variant = getattr(run, "model", None)  # older commits' runs all start from the embedded model
    return str(ensure_embedded_model(variant) if variant else ensure_embedded_model())


def seed_overrides(seed: int) -> list[str]:
    """Seed 0: none (the test's own run); seed k: both seeds moved by k."""
    return [] if seed == 0 else [f"trainer.seed={42 + seed}", f"data.seed={1 + seed}"]


def control_overrides(control: str | None, seed: int, work: Path) -> list[str]:
    """The overrides of ``--control`` (its reward file written to ``work``)."""
    if control == "lr-tiny":
        return ["actor.optim.lr=1e-30"]
    if control == "no-signal":
        reward = work / "no_signal_reward.py"
        reward.write_text(NO_SIGNAL_REWARD.format(seed=seed, share=NO_SIGNAL_SHARE))
        return [f"reward.custom_fn.path={reward}"]
    return []


def snapshot_trainer(every: int):
    """The default trainer, also exporting the actor to ``hf_step<N>`` every ``every`` steps."""
    from rlplat.trainer.ppo import PPOTrainer

    class Snapshots(PPOTrainer):
        def train_step(self) -> dict[str, float]:
            metrics = super().train_step()
            if self.step % every == 0 and self.step < self.cfg.trainer.total_steps:
                out = Path(self.cfg.trainer.output_dir) / f"hf_step{self.step:04d}"
                self.components.actor.export_hf(str(out), self.components.model_path)
            return metrics

    return Snapshots


def measure(args: argparse.Namespace, name: str, seed: int, work: Path) -> dict:
    """Train one (run, seed) in this process; its gains (at the end, and at each snapshot)."""
    import rlplat
    test = learning_test()
    model_dir = embedded_model(test.RUNS[name])
    rows = test.held_out_rows(model_dir, test.RUNS[name].task)
    before = test.correct_answer_probability(model_dir, rows)
    val = test.small_val_file(test.RUNS[name].task, work)  # = the test's small_val
    extra = [*seed_overrides(seed), *control_overrides(args.control, seed, work), *args.extra]
    start = time.perf_counter()
    summary = test.learning_run(name, str(val), str(work / "run"), extra, args.steps,
                                snapshot_trainer(args.every) if args.every else None)
    seconds = time.perf_counter() - start
    exports = {int(p.name[len("hf_step"):]): p for p in (work / "run").glob("hf_step*")}
    exports[summary["steps"]] = Path(summary["hf_export"])
    gains = {step: test.correct_answer_probability(str(p), rows) - before for step, p in sorted(exports.items())}
    return {"run": name, "label": args.label, "seed": seed, "overrides": extra, "before": before,
            "gain": gains[summary["steps"]], "gain_at": gains, "train_s": seconds,
            "rlplat": str(Path(rlplat.__file__).parent)}


def result_path(args: argparse.Namespace, name: str, seed: int) -> Path:
    return Path(args.results) / f"{name}{'-' + args.label if args.label else ''}-s{seed}.json"


def launch(args: argparse.Namespace, name: str, seed: int) -> subprocess.Popen:
    """One (run, seed) in a fresh process, its log beside its result."""
    out = result_path(args, name, seed)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name, str(seed), *sys.argv[1:]]
    log = out.with_suffix(".log").open("w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(args.results))


def run_all(args: argparse.Namespace, names: list[str]) -> None:
    # Seed-major: stopped part-way, every run has the same number of seeds.
    todo = [(n, s) for s in range(args.seeds) for n in names if not result_path(args, n, s).exists()]
    running: list[tuple[str, int, subprocess.Popen]] = []
    while todo or running:
        while todo and len(running) < args.jobs:
            name, seed = todo.pop(0)
            print(f"[learning_seeds] {name} seed {seed}: started", flush=True)
            running.append((name, seed, launch(args, name, seed)))
        time.sleep(1.0)
        for job in [j for j in running if j[2].poll() is not None]:
            running.remove(job)
            name, seed, proc = job
            state = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see its .log)"
            print(f"[learning_seeds] {name} seed {seed}: {state}", flush=True)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (bisection on the CDF, Simpson's rule over the density): no scipy needed."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))

    def cdf(x: float, n: int = 2000) -> float:
        h = x / n
        ys = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        return 0.5 + h / 3 * (ys[0] + ys[-1] + 4 * sum(ys[1:-1:2]) + 2 * sum(ys[2:-1:2]))

    lo, hi = 0.0, 100.0
    for _ in range(60):
        lo, hi = ((lo + hi) / 2, hi) if cdf((lo + hi) / 2) < p else (lo, (lo + hi) / 2)
    return lo


def lower_bound(gains: list[float]) -> float:
    """One-sided 99.9% lower prediction bound of one more run's gain: mean - t(0.999, n-1)·std·sqrt(1 + 1/n)."""
    n = len(gains)
    return statistics.mean(gains) - t_quantile(0.999, n - 1) * statistics.stdev(gains) * math.sqrt(1 + 1 / n)


def min_gain(gains: list[float]) -> float:
    """The rule of docs/learning_thresholds.md: the bound, never under FLOOR, rounded down to 0.005."""
    return math.floor(max(FLOOR, lower_bound(gains)) * 200) / 200


def table(args: argparse.Namespace, names: list[str], runs: dict) -> None:
    """Per run: each seed's gain at each measured step; per step mean, std, min, the bound and the rule."""
    for name in names:
        found = [json.loads(p.read_text()) for s in range(args.seeds) if (p := result_path(args, name, s)).exists()]
        if not found:
            continue
        title = f"{name}" + (f" [{args.label}]" if args.label else "")
        print(f"\n{title}: P(correct answer) before {found[0]['before']:.4f}, {len(found)} seeds; the test: "
              f"{runs[name].steps} steps, minimum gain {runs[name].min_gain}")
        at = [{int(k): v for k, v in r["gain_at"].items()} for r in found]
        steps = sorted(set.intersection(*(set(a) for a in at)))
        print(f"{'seed':<8}" + "".join(f"{'gain@' + str(s):>10}" for s in steps) + f"{'train_s':>10}")
        for r, a in zip(found, at):
            print(f"{r['seed']:<8}" + "".join(f"{a[s]:>+10.4f}" for s in steps) + f"{r['train_s']:>10.0f}")
        columns = [[a[s] for a in at] for s in steps]
        print(f"{'mean':<8}" + "".join(f"{statistics.mean(g):>+10.4f}" for g in columns))
        if len(found) < 2:
            continue
        print(f"{'std':<8}" + "".join(f"{statistics.stdev(g):>10.4f}" for g in columns))
        print(f"{'min':<8}" + "".join(f"{min(g):>+10.4f}" for g in columns))
        print(f"{'bound':<8}" + "".join(f"{lower_bound(g):>+10.4f}" for g in columns))
        print(f"{'rule':<8}" + "".join(f"{min_gain(g):>9.3f}" + ("*" if lower_bound(g) < FLOOR else " ")
                                     for g in columns) + f"   (*: the bound is under the floor {FLOOR})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", help="names in the test's RUNS (default: all but grpo_vllm)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (0 = the test's own run)")
    parser.add_argument("--steps", type=int, help="training steps (default: the run's own in the test)")
    parser.add_argument("--every", type=int, default=0, help="also measure the gain every N steps")
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides, e.g. rollout.top_k=50")
    parser.add_argument("--control", choices=["lr-tiny", "no-signal"], help="a run that cannot learn")
    parser.add_argument("--label", default="", help="tells these results apart from the plain runs'")
    parser.add_argument("--results", default=str(ROOT / "outputs" / "learning_seeds"))
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (1: the machine is shared)")
    parser.add_argument("--table", action="store_true", help="only print the table of the results there")
    parser.add_argument("--one", nargs=2, metavar=("RUN", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    test = learning_test()
    args.label = args.label or args.control or ""
    args.results = str(Path(args.results).resolve())
    if args.one:
        name, seed = args.one[0], int(args.one[1])
        work = result_path(args, name, seed).with_suffix("")
        shutil.rmtree(work, ignore_errors=True)  # a failed try's checkpoint would be resumed from
        work.mkdir(parents=True)
        result = measure(args, name, seed, work)
        result_path(args, name, seed).write_text(json.dumps(result, indent=1))
        return 0
    names = args.runs or [n for n in test.RUNS if n != "grpo_vllm"]
    if unknown := [n for n in names if n not in test.RUNS]:
        parser.error(f"--runs {unknown} not in the test's RUNS: {list(test.RUNS)}")
    Path(args.results).mkdir(parents=True, exist_ok=True)
    if not args.table:
        run_all(args, names)
    table(args, names, test.RUNS)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
