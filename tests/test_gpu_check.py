"""scripts/gpu_check.sh's dry run: the CPU instead of the GPU, tiny sizes, Ray hidden from every step, so
the script, its wheel list and the no-Ray path are proven before a GPU machine is there (docs/gpu.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_dry_runs_on_cpu(embedded_cache, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_OUT": str(tmp_path / "check")}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "check" / "summary.json").read_text())
    assert summary["dry_run"] and summary["passed"]
    steps = summary["steps"]
    assert sorted(steps) == ["gpu_tests", "grpo_fsdp", "grpo_megatron", "mfu", "mfu_micro"]
    assert all(step["exit"] == 0 for step in steps.values())
    for run in ("grpo_fsdp", "grpo_megatron"):  # one step each, validated before and after
        assert steps[run]["last_step"]["step"] == 1 and len(steps[run]["val_accuracy"]) == 2
        assert torch.isfinite(torch.tensor(steps[run]["last_step"]["actor/grad_norm"]))
    rows = {row["strategy"]: row for row in steps["mfu"]["figures"]["rows"]}
    assert list(rows) == ["fsdp", "fsdp-eager", "fsdp-fused", "fsdp-compile-chunked", "megatron", "megatron-bf16"]
    micro = steps["mfu_micro"]["figures"]["rows"]
    assert [(row["strategy"], row["micro_batch"]) for row in micro] == [("fsdp", 2), ("fsdp", 4)]
    every = [*rows.values(), *micro]
    assert all(row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1 and row["gather_bf16_s"] >= 0 for row in every)
    fp32, bf16 = rows["megatron"], rows["megatron-bf16"]
    for row in [row for row in every if row["strategy"].startswith("fsdp")]:  # the same update: heads, layers,
        assert row["pg_loss"] == pytest.approx(fp32["pg_loss"], rel=1e-4)  # micro-batches and both engines
    assert bf16["pg_loss"] == pytest.approx(fp32["pg_loss"], rel=5e-2)  # bf16 weights: to bf16 precision
    # bf16 weights take half the bytes; their fp32 masters, fp32 weights' bytes
    assert bf16["weights_gib"] == pytest.approx(fp32["weights_gib"] / 2) and fp32["masters_gib"] == 0
    assert bf16["masters_gib"] == pytest.approx(fp32["weights_gib"]) and bf16["moments_gib"] == fp32["moments_gib"]
    gpu_log = (tmp_path / "check" / "gpu_tests.log").read_text()
    if not torch.cuda.is_available():
        assert "needs a CUDA device" in gpu_log and " passed" not in gpu_log  # collected without Ray, then skipped
    assert "Traceback" not in gpu_log
