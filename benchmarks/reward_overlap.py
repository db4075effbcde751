"""The reward stage overlapped with the log-prob passes, against the same step scoring in turn.

    python benchmarks/reward_overlap.py                   # the Quickstart's GRPO step, built-in reward
    python benchmarks/reward_overlap.py --sleep-ms 0.5    # + a 0.5 ms wait per call (a remote judge)

Each run is a fresh process training the Quickstart's configuration (``algorithm=grpo``, the embedded
model, Ray mode) for ``--steps`` steps without validation, alternating the default trainer (``reward_start``
... ``reward_wait`` around the old-log-prob and reference passes) with a subclass that overrides
``reward`` (one stage, scored before the passes). Medians over the steps after the first two; the table
gives the step, the time the step spent in the reward stage(s) and the two passes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SLOW_REWARD = '''import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep({seconds!r})
    words = solution_str.strip().split()
    return 1.0 if words and words[-1] == str(ground_truth) else 0.0
'''


def one_run(mode: str, out: Path, steps: int, extra: list[str]) -> dict[str, float]:
    from rlplat.trainer.ppo import PPOTrainer
    from rlplat.trainer.run import load_run_config, run

    class InTurn(PPOTrainer):
        def reward(self, batch, metrics):
            return super().reward(batch, metrics)

    cfg, plan = load_run_config(["algorithm=grpo", f"trainer.output_dir={out}", f"trainer.total_steps={steps}",
                                 "trainer.test_freq=-1", "trainer.progress=off", "trainer.logger=[jsonl]", *extra])
    run(cfg, plan, trainer_cls=InTurn if mode == "in turn" else PPOTrainer)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing/step_s" in r][2:]

    def median(*keys: str) -> float:
        return statistics.median(sum(r.get(k, 0.0) for k in keys) for r in rows)

    return {"step": median("timing/step_s"),
            "reward": median("timing/reward_s", "timing/reward_start_s", "timing/reward_wait_s"),
            "passes": median("timing/old_log_probs_s", "timing/reference_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="wait this long in every reward call")
    parser.add_argument("--one", nargs=2, metavar=("MODE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--extra", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one[0], Path(args.one[1]), args.steps, args.extra)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        extra = []
        if args.sleep_ms > 0:
            reward = Path(tmp) / "slow_reward.py"
            reward.write_text(SLOW_REWARD.format(seconds=args.sleep_ms / 1000))
            extra.append(f"reward.custom_fn.path={reward}")
        results: dict[str, list[dict]] = {"overlapped": [], "in turn": []}
        for repeat in range(args.repeats):
            for mode in ("overlapped", "in turn") if repeat % 2 == 0 else ("in turn", "overlapped"):
                out = Path(tmp) / f"run-{repeat}-{mode.replace(' ', '_')}"
                done = subprocess.run([sys.executable, __file__, "--one", mode, str(out), "--steps", str(args.steps),
                                       "--extra", *extra], capture_output=True, text=True)
                if done.returncode:
                    sys.exit(f"reward_overlap: the {mode} run failed:\n{done.stderr[-3000:]}")
                results[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"reward sleep {args.sleep_ms:g} ms per call; {args.steps} steps per run, medians of steps 3+; "
          f"one column per run")
    print(f"{'mode':<12} {'s/step':<16} {'reward stage ms':<20} {'log-prob passes ms'}")
    for mode, runs in results.items():
        def col(key: str, scale: float = 1.0, digits: int = 3) -> str:
            return ", ".join(f"{r[key] * scale:.{digits}f}" for r in runs)

        print(f"{mode:<12} {col('step'):<16} {col('reward', 1000, 1):<20} {col('passes', 1000, 1)}")


if __name__ == "__main__":
    main()
