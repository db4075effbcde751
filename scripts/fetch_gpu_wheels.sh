#!/usr/bin/env bash
# Prepares what scripts/gpu_check.sh carries to a GPU machine that has no package registry (docs/gpu.md),
# on a machine that has one:
#   .gpu-wheels/  the wheels of scripts/gpu_wheels.txt for the GPU machine's Python (3.12, x86_64 Linux);
#                 antlr4-python3-runtime is published as a source archive only, so its wheel is built here
#   .gpu-cache/   the embedded model, built once (its SFT warm start takes minutes of CPU there)
# Idempotent. GPU_PYTHON_VERSION (default 3.12) names the GPU machine's Python; PYTHON the local one.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
version="${GPU_PYTHON_VERSION:-3.12}"
mkdir -p .gpu-wheels
while read -r spec; do
  spec="${spec%%#*}" && spec="${spec//[[:space:]]/}"  # the comment after a pin off
  [ -n "$spec" ] || continue
  name="${spec%%==*}"
  if ls .gpu-wheels/"$(echo "$name" | tr - _)"-"${spec##*==}"-*.whl >/dev/null 2>&1; then
    echo "[fetch-gpu] $spec: have it"
  elif "$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 -d .gpu-wheels "$spec" 2>/tmp/fetch-gpu.err; then
    echo "[fetch-gpu] $spec: downloaded"
  else  # no wheel for that Python on the registry: build one, which is right only for a pure-Python package
    built=$(mktemp -d)
    "$python" -m pip wheel -q --no-deps -w "$built" "$spec"
    wheel=$(ls "$built"/*.whl)
    case "$wheel" in
      *-py3-none-any.whl) mv "$wheel" .gpu-wheels/ && echo "[fetch-gpu] $spec: built from its source archive" ;;
      *) echo "[fetch-gpu] $spec: no wheel for Python $version on the registry ($(tail -1 /tmp/fetch-gpu.err)), and" \
              "building one here gives $(basename "$wheel"), which is not pure Python" >&2; exit 1 ;;
    esac
    rm -rf "$built"
  fi
done < scripts/gpu_wheels.txt
echo "[fetch-gpu] the embedded model into .gpu-cache/"
RLPLAT_CACHE="$PWD/.gpu-cache" "$python" -c "from rlplat.trainer.sft import ensure_embedded_model; print(ensure_embedded_model())"
du -sh .gpu-wheels .gpu-cache
