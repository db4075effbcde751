"""Server mode (``rollout.mode=server``): generate through an already running vLLM server.

For users who serve inference on other machines (the analogue of TRL's ``vllm-serve``): every worker
sends its prompts to ``rollout.server.url``'s OpenAI-compatible ``/v1/completions`` as token ids
(``return_token_ids``, ``logprobs=0`` for the sampled token's log-prob), and after each actor update rank
0 pushes the new weights through the server's ``/collective_rpc`` endpoint into the same worker
extension the colocated engine uses (:mod:`rlplat.rollout.vllm_worker`): each bucket travels as a
base64 safetensors payload, then ``/reset_prefix_cache``. Start a compatible server with
``python -m rlplat.rollout.vllm_serve MODEL`` (it adds the flags this client relies on).

Only the standard library is used here: the trainer's machine needs no vLLM.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterable

from rlplat.models.moe import checkpoint_layout
from rlplat.protocol import Batch
from rlplat.rollout.base import (
    RolloutEngine, RolloutSetup, SamplingParams, WeightBucket, assemble_rollout, pad_responses,
    prompt_token_lists,
)


class ServerError(RuntimeError):
    """The rollout server could not be reached or refused a request."""


def encode_bucket(bucket: WeightBucket) -> str:
    """A bucket as base64 text of a safetensors file (the server's RPC endpoint takes strings only)."""
    from safetensors.torch import save

    # copies: safetensors refuses tensors that share memory (tied embeddings)
    return base64.b64encode(save({name: t.detach().to("cpu", copy=True) for name, t in bucket})).decode("ascii")


class VLLMServerClient(RolloutEngine):
    def __init__(self, setup: RolloutSetup, engine_cfg):
        self.setup, self.url, self.timeout = setup, engine_cfg.url.rstrip("/"), engine_cfg.timeout_s
        self.model = self._model_name()
        # The server loaded model.path itself; rlplat cannot know if that equals the actor's start.
        self.needs_initial_weights = True

    def _request(self, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:300]
            raise ServerError(f"rollout server {self.url}{path} answered {err.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            raise ServerError(f"rollout server {self.url} is not reachable ({path}): {err}") from None
        return json.loads(text) if text else None

    def _model_name(self) -> str:
        models = self._request("/v1/models")["data"]
        if not models:
            raise ServerError(f"rollout server {self.url} serves no model")
        return models[0]["id"]

    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        prompts = prompt_token_lists(batch)
        greedy = params.temperature == 0
        body = {
            "model": self.model,
            "prompt": prompts,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": 1.0 if greedy else params.top_p,
            "top_k": 0 if greedy or params.top_k <= 0 else params.top_k,
            "n": 1,
            "stop_token_ids": list(params.stop_token_ids),
            "ignore_eos": params.ignore_eos,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        choices = sorted(self._request("/v1/completions", body)["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts):
            raise ServerError(f"rollout server returned {len(choices)} completions for {len(prompts)} prompts")
        token_ids = [c["token_ids"] for c in choices]
        log_probs = [c["logprobs"]["token_logprobs"] for c in choices]
        responses, mask, lps = pad_responses(token_ids, log_probs, params.max_new_tokens, self.setup.pad_token_id)
        return assemble_rollout(batch, responses, mask, lps)

    def _rpc(self, method: str, *args: str) -> None:
        self._request("/collective_rpc", {"method": method, "args": list(args)})

    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        if self.setup.rank != 0:  # one server: rank 0 sends, the others only take part in the gathers
            for _ in buckets:
                pass
            return
        self._rpc("rlplat_start_weight_update")
        for bucket in buckets:  # a mixture of experts' fused expert tensors as the checkpoint's per-expert ones
            self._rpc("rlplat_load_serialized_weights", encode_bucket(checkpoint_layout(bucket)))
        self._rpc("rlplat_finish_weight_update")
        self._request("/reset_prefix_cache", {})
