#!/usr/bin/env bash
# Idempotent set-up of the benchmark virtualenv (.venv-bench by default, RLPLAT_BENCH_VENV to change it)
# for benchmarks/compare_trl.py: rlplat and TRL's GRPOTrainer side by side, on the same torch and
# transformers. The pinned CPU torch goes in first (an unpinned torch pulls a multi-GB CUDA build), then
# rlplat, TRL and what GRPOTrainer needs on a CPU (accelerate, datasets), and psutil for the memory probe.
# The last step checks that one transformers satisfies both rlplat's setup.py and TRL, and that both import.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RLPLAT_BENCH_VENV:-.venv-bench}"
torch_spec="${RLPLAT_TORCH:-torch==2.13.0}"
trl_spec="${RLPLAT_TRL:-trl==1.16.0}"
extra_specs=(accelerate datasets psutil)
stamp="$venv/.rlplat-installed"
want="$(cat setup.py | sha256sum | cut -d' ' -f1) $torch_spec $trl_spec ${extra_specs[*]}"

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup-bench] creating virtualenv $venv"
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup-bench] installing $torch_spec, rlplat, $trl_spec and ${extra_specs[*]} into $venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$torch_spec"
  # One resolve for rlplat and TRL together, so pip picks a transformers both accept; the torch pin is
  # repeated so the resolver keeps the CPU wheel rather than swapping in a CUDA build.
  "$venv/bin/python" -m pip install -q "$torch_spec" -e . "$trl_spec" "${extra_specs[@]}"
  "$venv/bin/python" -m pip check
  "$venv/bin/python" - <<'EOF'
import importlib.metadata as md

import torch
import transformers
import trl
from trl import GRPOConfig, GRPOTrainer  # noqa: F401  (the trainer imports its optional pieces lazily)

import rlplat.trainer.run  # noqa: F401

assert "+cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
print(f"[setup-bench] torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
      f"accelerate {md.version('accelerate')}, datasets {md.version('datasets')}, ray {md.version('ray')}")
EOF
  echo "$want" > "$stamp"
else
  echo "[setup-bench] $venv is up to date"
fi
