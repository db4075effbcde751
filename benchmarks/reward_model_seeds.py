"""The reward-model learning test's gain over seeds: the spread its minimum gain is set from.

    python benchmarks/reward_model_seeds.py              # seeds 0..9, 20 steps, as the test trains
    python benchmarks/reward_model_seeds.py --seeds 3

Each seed trains as ``tests/reward/test_reward_model.py``'s learning test does (GRPO, the tiny reward model that
prefers answers with a 7 as the only reward, 20 steps of 16 prompts; the test's own run is seed 1) with
``trainer.seed=k data.seed=k``, and measures the share of T = 1 samples containing a 7 on 256 held-out prompts
before and after (the test's ``sevens_share``). Printed: each seed's shares and gain, then the gains' mean, std,
min and the minimum of the rule in docs/learning_thresholds.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from learning_seeds import lower_bound, min_gain
    from reward.test_reward_model import sevens_share

    from rlplat.models.tiny import build_tiny_reward_model
    from rlplat.trainer.run import load_run_config, run
    from rlplat.trainer.sft import ensure_embedded_model

    tmp = Path(tempfile.mkdtemp(prefix="reward-model-seeds-"))
    reward_model = tmp / "prefers-7"
    build_tiny_reward_model(reward_model, marker="7")
    before = sevens_share(str(ensure_embedded_model()))
    print(f"share of samples with a 7 before training: {before:.3f}\n| seed | after | gain |\n|---|---:|---:|", flush=True)
    gains = []
    for seed in range(args.seeds):
        out = tmp / f"seed{seed}"
        cfg, plan = load_run_config(["algorithm=grpo", "trainer.ray_address=inprocess", f"trainer.output_dir={out}",
                                     f"reward.model.path={reward_model}", f"trainer.total_steps={args.steps}",
                                     "data.train_batch_size_prompts=16", "trainer.test_freq=0", f"trainer.seed={seed}",
                                     f"data.seed={seed}"])
        with contextlib.redirect_stdout(io.StringIO()):
            run(cfg, plan)
        after = sevens_share(str(out / "hf_export"))
        gains.append(after - before)
        print(f"| {seed} | {after:.3f} | {after - before:+.3f} |", flush=True)
    print(f"gain: mean {statistics.mean(gains):+.3f}, std {statistics.stdev(gains):.3f}, min {min(gains):+.3f}; "
          f"bound {lower_bound(gains):+.3f}, rule {min_gain(gains):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
