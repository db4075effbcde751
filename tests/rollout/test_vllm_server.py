"""Server mode against a real ``vllm serve`` on 127.0.0.1 (started by ``python -m rlplat.rollout.vllm_serve``).

Skipped where vllm does not import (CI runs it in the vLLM virtualenv)."""

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlplat.rollout import ROLLOUT_SERVER_CLIENTS, RolloutSetup, SamplingParams
from rlplat.trainer.run import load_run_config, run
from rlplat.utils.net import free_port
from workers.helpers import prompt_batch, reference_log_probs

pytest.importorskip("vllm")
START_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def server_url(tiny_model_path, tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "vllm.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlplat.rollout.vllm_serve", tiny_model_path, "--host", "127.0.0.1",
             "--port", str(port), "--max-model-len", "256", "--dtype", "float32"],  # vLLM would pick bf16 on CPU
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"vllm serve did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(1)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def client(url: str, model_path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    setup = RolloutSetup(model_path=model_path, tokenizer_path=model_path, device=torch.device("cpu"),
                         dtype=torch.float32, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         max_model_len=256, seed=0, rank=0, world_size=1)
    cfg = load_run_config([f"rollout.server.url={url}"])[0].rollout.server
    return ROLLOUT_SERVER_CLIENTS.get("vllm")(setup, cfg)


def test_two_training_steps_against_a_server_move_the_served_model(server_url, tiny_model_path, tmp_path):
    cfg, plan = load_run_config([
        f"model.path={tiny_model_path}", "rollout=vllm", "rollout.mode=server", f"rollout.server.url={server_url}",
        "trainer.ray_address=inprocess", "trainer.total_steps=2", f"trainer.output_dir={tmp_path}",
        "trainer.test_freq=0", "data.train_batch_size_prompts=8", "actor.mini_batch_size_prompts=8",
        "rollout.n=2", "rollout.val_n=1", "data.val_batch_size_prompts=8", "actor.optim.lr=1e-2",
        "actor.optim.warmup_steps=0", "actor.micro_batch_size_seqs_per_worker=16",
        "critic.micro_batch_size_seqs_per_worker=16",
    ])
    summary = run(cfg, plan)
    assert summary["steps"] == 2
    served = client(server_url, tiny_model_path)
    out = served.generate(prompt_batch(tiny_model_path, temperature=1.0), SamplingParams(max_new_tokens=8))
    mask = out.tensors["response_mask"].bool()
    trained = AutoModelForCausalLM.from_pretrained(summary["hf_export"], dtype=torch.float32)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        expected, before = reference_log_probs(trained, out, 1.0), reference_log_probs(initial, out, 1.0)
    assert (expected - before)[mask].abs().max() > 0.05  # two steps changed the policy ...
    torch.testing.assert_close(out.tensors["rollout_log_probs"][mask], expected[mask], atol=1e-3, rtol=0)  # ... on the server


def test_unreachable_server_is_one_clear_error(tiny_model_path):
    from rlplat.rollout.server import ServerError

    with pytest.raises(ServerError, match=r"rollout server http://127.0.0.1:\d+ is not reachable"):
        client(f"http://127.0.0.1:{free_port()}", tiny_model_path)
