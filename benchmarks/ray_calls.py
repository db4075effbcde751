"""Time a worker call's round trip on a local Ray cluster: the step's batch there and back, per transport.

    python benchmarks/ray_calls.py                   # with the settings rlplat starts a local cluster with
    python benchmarks/ray_calls.py --ray-defaults    # with Ray's own defaults, for comparison

An actor method returns its argument. Payloads are the fields of an update batch (token ids, masks and
positions in int64, log-probs, scores and advantages in float32, a bool per row) for the shapes of
benchmarks/compare_trl.py's three sizes and the Quickstart's step. Columns: a call without arguments,
the same tensors as a plain dict (torch pickles every tensor with its whole storage), and as an rlplat
``Batch`` (a numpy byte array per tensor, see ``Batch.__reduce__``). Median of ``--calls`` calls after 5 warm-up calls.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from rlplat.protocol import Batch
from rlplat.trainer.run import LOCAL_RAY_SYSTEM_CONFIG

# name: (rows, prompt tokens, response tokens)
SHAPES = {"small": (64, 10, 16), "mid": (64, 10, 48), "25m": (32, 10, 128), "quickstart": (512, 24, 32)}


def update_batch(rows: int, prompt: int, response: int) -> dict[str, torch.Tensor]:
    ids = lambda cols: torch.randint(0, 100, (rows, cols))  # noqa: E731
    floats = lambda: torch.randn(rows, response)  # noqa: E731
    return {"prompts": ids(prompt), "prompt_mask": ids(prompt), "responses": ids(response),
            "response_mask": ids(response), "input_ids": ids(prompt + response),
            "attention_mask": ids(prompt + response), "position_ids": ids(prompt + response),
            "rollout_log_probs": floats(), "token_level_scores": floats(), "token_level_rewards": floats(),
            "advantages": floats(), "truncated": torch.zeros(rows, dtype=torch.bool)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ray-defaults", action="store_true", help="start Ray with its default system config")
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()

    import ray

    ray.init(include_dashboard=False, logging_level="ERROR",
             **({} if args.ray_defaults else {"_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG)}))

    @ray.remote
    class Echo:
        def echo(self, value=None):
            return value

    actor = Echo.remote()

    def round_trip_ms(value) -> float:
        times = []
        for i in range(args.calls + 5):
            start = time.perf_counter()
            ray.get(actor.echo.remote(value))
            if i >= 5:
                times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    config = "Ray's defaults" if args.ray_defaults else f"rlplat's local cluster ({LOCAL_RAY_SYSTEM_CONFIG})"
    print(f"Ray {ray.__version__}, torch {torch.__version__}, {platform.processor() or platform.machine()}, {config}")
    print(f"{'payload':<12} {'rows x tokens':>14} {'MB':>6} {'no args ms':>11} {'dict ms':>8} {'Batch ms':>9}")
    for name, (rows, prompt, response) in SHAPES.items():
        tensors = update_batch(rows, prompt, response)
        size_mb = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20
        empty = round_trip_ms(None)
        plain = round_trip_ms(tensors)
        batch = round_trip_ms(Batch.from_dict(tensors))
        shape = f"{rows} x {prompt + response}"
        print(f"{name:<12} {shape:>14} {size_mb:>6.2f} {empty:>11.2f} {plain:>8.2f} {batch:>9.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
