"""Reward throughput: the reward process pool (``reward.isolation=process``) against serial in-process calls.

    python benchmarks/reward_pool.py                      # the three tables below, ~1.5 min on 2 cores
    python benchmarks/reward_pool.py --io-calls 200 --cpu-calls 100 --math-calls 100   # quicker

Three reward functions, each timed over one ``RewardManager.score`` batch, serial in the calling process
(``isolation=inprocess``) and in the process pool with ``--workers`` worker processes:

* I/O-bound: a custom function that sleeps ``--io-ms`` (20 ms) and returns 1.0 (a remote judge);
* CPU-bound: a custom function that runs a pure-Python loop whose iteration count is calibrated once at
  start so that one call takes ``--cpu-ms`` (20 ms) here; the pool cannot beat the number of cores;
* the built-in ``math`` scorer (math-verify/sympy) on symbolic answers ((x+k)^2 vs x^2+2kx+k^2,
  \\sqrt{12k^2} vs 2k\\sqrt{3}, \\{k,k+1\\} vs "k+1, k") with data_source ``math``. ``distinct`` varies k
  on every call, so every answer is parsed afresh; ``repeated`` scores the same three cases (k=1) over and
  over, so math-verify's parse cache (rlplat.reward.equivalence) answers all but the first parses.

Every manager is warmed up with one small batch first (worker start-up and imports are not counted).
Columns: seconds for the batch, calls per second, the batch's time as a share of the serial time, and
the mean seconds per call as the manager measured it (``ScoreReport.stats[...]["latency_mean_s"]``; in
the pool the time the controller waited for the call, pipe round trip included). Figures for the docs
come from running this script on the machine in question; nothing here is a stored result.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

from rlplat.reward import build_reward_manager

IO_REWARD = '''import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep({seconds!r})
    return 1.0
'''

CPU_REWARD = '''ITERATIONS = {iterations!r}


def burn(n):
    x = 0
    for i in range(n):
        x += i * i
    return x


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    burn(ITERATIONS)
    return 1.0
'''


def burn(n: int) -> int:  # the same loop as CPU_REWARD's, for the calibration
    x = 0
    for i in range(n):
        x += i * i
    return x


def calibrate(target_s: float) -> int:
    """Iterations of :func:`burn` that take ``target_s`` here (best of 5 timings of a ~0.1 s probe)."""
    n = 100_000
    while True:
        start = time.perf_counter()
        burn(n)
        if time.perf_counter() - start > 0.05:
            break
        n *= 2
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        burn(n)
        best = min(best, time.perf_counter() - start)
    return max(1, round(n * target_s / best))


def math_rows(calls: int, distinct: bool, offset: int = 0) -> list[tuple[str, str]]:
    """(response, ground truth) pairs cycling over three symbolic cases; k = 1 throughout unless distinct."""
    rows = []
    for i in range(calls):
        k = offset + i // 3 + 2 if distinct else 1
        case = i % 3
        if case == 0:
            rows.append((f"The answer is \\boxed{{(x+{k})^2}}", f"x^2+{2 * k}x+{k * k}"))
        elif case == 1:
            rows.append((f"So \\boxed{{\\sqrt{{{12 * k * k}}}}}", f"{2 * k}\\sqrt{{3}}"))
        else:
            rows.append((f"\\boxed{{\\{{{k},{k + 1}\\}}}}", f"{k + 1}, {k}"))
    return rows


def timed(cfg: dict, rows: list[tuple[str, str]], warmup: list[tuple[str, str]], source: str) -> dict[str, float]:
    """One manager: score ``warmup``, then time one batch of ``rows``; seconds, errors, mean s/call."""

    def batch(pairs):
        n = len(pairs)
        return ([text for text, _ in pairs], [source] * n, [truth for _, truth in pairs], [None] * n, [16] * n)

    manager = build_reward_manager(cfg)
    try:
        manager.score(*batch(warmup))
        start = time.perf_counter()
        result = manager.score(*batch(rows))
        seconds = time.perf_counter() - start
    finally:
        manager.close()
    stats = next(iter(result.stats.values()))
    wrong = sum(score != 1.0 for score in result.scores)
    return {"seconds": seconds, "errors": result.num_errors, "wrong": wrong, "latency": stats["latency_mean_s"]}


def table(title: str, cfg: dict, workers: list[int], rows: list[tuple[str, str]], source: str,
          warmup_rows) -> None:
    print(f"\n{title}")
    print(f"| {'workers':<10} | {'seconds':>8} | {'calls/s':>8} | {'share of serial':>15} | {'ms/call':>8} |")
    print(f"|{'-' * 12}|{'-' * 10}|{'-' * 10}|{'-' * 17}|{'-' * 10}|")
    serial = None
    for n in [0, *workers]:
        run_cfg = {**cfg, "isolation": "inprocess"} if n == 0 else {**cfg, "isolation": "process", "num_workers": n}
        r = timed(run_cfg, rows, warmup_rows(max(n, 1)), source)
        serial = serial or r["seconds"]
        label = "serial" if n == 0 else str(n)
        note = f"  ({r['errors']} errors, {r['wrong']} not 1.0)" if r["errors"] or r["wrong"] else ""
        print(f"| {label:<10} | {r['seconds']:>8.2f} | {len(rows) / r['seconds']:>8.1f} | "
              f"{r['seconds'] / serial:>15.2f} | {r['latency'] * 1000:>8.2f} |{note}")


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, {platform.system()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--io-calls", type=int, default=1000)
    parser.add_argument("--io-ms", type=float, default=20.0, help="sleep per I/O-bound call")
    parser.add_argument("--io-workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--cpu-calls", type=int, default=200)
    parser.add_argument("--cpu-ms", type=float, default=20.0, help="CPU time per CPU-bound call (calibrated)")
    parser.add_argument("--cpu-workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--math-calls", type=int, default=200)
    parser.add_argument("--math-workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--math-modes", nargs="+", choices=["distinct", "repeated"], default=["distinct", "repeated"])
    parser.add_argument("--skip", nargs="*", choices=["io", "cpu", "math"], default=[])
    args = parser.parse_args()

    print(f"{datetime.datetime.now().isoformat(timespec='seconds')}; {machine()}")
    constant = lambda pairs: lambda workers: pairs * (2 * workers)  # noqa: E731  warm-up: 2 calls a worker
    with tempfile.TemporaryDirectory() as tmp:
        if "io" not in args.skip:
            path = Path(tmp) / "io_reward.py"
            path.write_text(IO_REWARD.format(seconds=args.io_ms / 1000))
            cfg = {"custom_fn": {"path": str(path), "name": "compute_score"}, "timeout_s": 30}
            table(f"I/O-bound reward: sleep {args.io_ms:g} ms, {args.io_calls} calls", cfg, args.io_workers,
                  [("x", "x")] * args.io_calls, "bench", constant([("x", "x")]))
        if "cpu" not in args.skip:
            iterations = calibrate(args.cpu_ms / 1000)
            path = Path(tmp) / "cpu_reward.py"
            path.write_text(CPU_REWARD.format(iterations=iterations))
            cfg = {"custom_fn": {"path": str(path), "name": "compute_score"}, "timeout_s": 30}
            table(f"CPU-bound reward: {iterations:,} loop iterations (~{args.cpu_ms:g} ms), {args.cpu_calls} calls",
                  cfg, args.cpu_workers, [("x", "x")] * args.cpu_calls, "bench", constant([("x", "x")]))
        for mode in ([] if "math" in args.skip else args.math_modes):
            distinct = mode == "distinct"
            rows = math_rows(args.math_calls, distinct)
            # distinct: the warm-up answers use other k than the timed ones (no parse-cache hits)
            warm = (lambda w: math_rows(3 * w, True, offset=10_000)) if distinct else \
                (lambda w: math_rows(3 * w, False))
            table(f"Built-in math scorer (math-verify), {mode} answers, {args.math_calls} calls",
                  {"functions": ["math"], "timeout_s": 30}, args.math_workers, rows, "math", warm)


if __name__ == "__main__":
    main()
