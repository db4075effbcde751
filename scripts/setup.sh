#!/usr/bin/env bash
# Idempotent set-up of the project's virtualenv (.venv by default, RLPLAT_VENV to change it).
# CPU machines get the pinned CPU torch wheel first: an unpinned torch pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RLPLAT_VENV:-.venv}"
torch_spec="${RLPLAT_TORCH:-torch==2.13.0}"
stamp="$venv/.rlplat-installed"
want="$(cat setup.py | sha256sum | cut -d' ' -f1) $torch_spec"

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating virtualenv $venv"
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing $torch_spec and rlplat[test,megatron,trackers,ifeval,envs] into $venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$torch_spec"
  # megatron-core is small and runs its CPU tests; the trackers (tensorboard, wandb, mlflow) and the ifeval
  # reward's lm-eval are tested for real, and so are the field's environments (envs)
  "$venv/bin/python" -m pip install -q -e ".[test,megatron,trackers,ifeval,envs]"
  echo "$want" > "$stamp"
else
  echo "[setup] $venv is up to date"
fi
