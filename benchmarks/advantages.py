"""Time the vectorised advantage estimators on a large batch and print a table.

    python benchmarks/advantages.py                      # 65,536 sequences x 1,024 tokens, group 8
    python benchmarks/advantages.py --batch 4096 --names grpo rloo

Targets (docs/performance.md): grpo, rloo, dr_grpo < 1 s each at the default size on a 2-core CPU.
Inputs are float32 with ragged response lengths (a quarter to all of the tokens valid) and an outcome
reward on each response's last valid token, as the trainer produces them.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from rlplat.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInput, AdvantageOptions, compute_advantages

TARGETS_S = {"grpo": 1.0, "rloo": 1.0, "dr_grpo": 1.0}


def make_input(batch: int, length: int, group: int, seed: int = 0) -> AdvantageInput:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 4, length + 1, (batch,), generator=gen)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    rewards = torch.zeros(batch, length)
    scores = torch.randint(0, 2, (batch,), generator=gen).float()
    rewards[torch.arange(batch), lengths - 1] = scores
    return AdvantageInput(
        token_level_rewards=rewards,
        response_mask=mask,
        group_ids=torch.arange(batch) // group,
        values=torch.randn(batch, length, generator=gen) * mask,
        baseline_scores=torch.rand(batch, generator=gen),
        old_log_probs=torch.rand(batch, length, generator=gen).clamp(min=1e-3).log(),  # optimal token baselines
        sum_pi_squared=torch.rand(batch, length, generator=gen),
        options=AdvantageOptions(gamma=1.0, lam=0.95),
    )


def time_one(name: str, inp: AdvantageInput, repeats: int) -> float:
    compute_advantages(name, inp)  # warm-up (allocator, first-call overheads)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        compute_advantages(name, inp)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=65_536, help="sequences")
    parser.add_argument("--length", type=int, default=1_024, help="response tokens per sequence")
    parser.add_argument("--group", type=int, default=8, help="responses per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per estimator (best is shown)")
    parser.add_argument("--names", nargs="*", default=None, help="estimators (default: all registered)")
    args = parser.parse_args()

    names = args.names or list(ADVANTAGE_ESTIMATORS.names())
    inp = make_input(args.batch, args.length, args.group)
    print(
        f"# {args.batch:,} sequences x {args.length:,} tokens, group {args.group}, float32, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    )
    print(f"| {'estimator':<26} | {'best of ' + str(args.repeats) + ' (s)':>15} | {'target (s)':>10} | {'ok':>3} |")
    print(f"|{'-' * 28}|{'-' * 17}|{'-' * 12}|{'-' * 5}|")
    for name in names:
        seconds = time_one(name, inp, args.repeats)
        target = TARGETS_S.get(name)
        ok = "" if target is None else ("yes" if seconds < target else "NO")
        print(f"| {name:<26} | {seconds:>15.3f} | {target if target else '-':>10} | {ok:>3} |")


if __name__ == "__main__":
    main()
