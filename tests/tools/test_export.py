"""``python -m rlplat.tools.export``: checkpoints of a 2-worker FSDP run (any step) and of a Megatron run
become Hugging Face models that transformers loads, with the training engine's log-probs; bad input is
one line."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlplat.config import load_config
from rlplat.controller import InProcessWorkerGroup
from rlplat.tools.export import main as export_main
from rlplat.trainer.run import run
from rlplat.workers.roles import ActorRolloutRefWorker

from trainer.test_trainer import overrides
from workers.helpers import engine_config, prompt_batch, reference_log_probs


def export(ckpt, out, *extra) -> None:
    assert export_main([str(ckpt), "--out", str(out), *extra]) == 0


def weights(model_dir) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()


@pytest.mark.slow
def test_a_two_worker_checkpoint_exports_with_the_engines_log_probs(embedded_cache, small_val, tmp_path, ray_cluster):
    out = tmp_path / "run"
    summary = run(*load_config(overrides(out, 2, small_val, "trainer.workers_per_node=2", "trainer.save_freq=1")))
    # the last checkpoint: the same weights as the run's own export
    export(out / "checkpoints" / "step_000002", tmp_path / "last")
    last, final = weights(tmp_path / "last"), weights(summary["hf_export"])
    assert all(torch.equal(last[name], tensor) for name, tensor in final.items())
    # an earlier one, read back by a training engine of another world size (1): equal log-probs
    export(out / "checkpoints" / "step_000001", tmp_path / "first")
    model_path = summary["hf_export"]
    cfg, plan = engine_config(model_path)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(model_path, with_ref=False)
        group.load_checkpoint(str(out / "checkpoints" / "step_000001"))
        torch.manual_seed(0)
        batch = group.generate_sequences(prompt_batch(model_path))
        engine = group.compute_log_probs(batch).tensors["old_log_probs"]
    finally:
        group.shutdown()
    with torch.no_grad():
        exported = reference_log_probs(AutoModelForCausalLM.from_pretrained(tmp_path / "first"), batch, 1.0)
    mask = batch.tensors["response_mask"].bool()
    torch.testing.assert_close(exported[mask], engine[mask], atol=1e-5, rtol=0)
    assert not torch.equal(weights(tmp_path / "first")["model.norm.weight"], final["model.norm.weight"])
    # bf16: the saved tensors are the cast weights
    export(out / "checkpoints" / "step_000002", tmp_path / "bf16", "--dtype", "bfloat16")
    saved = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert saved["model.norm.weight"].dtype == torch.bfloat16
    assert torch.equal(saved["model.norm.weight"], final["model.norm.weight"].to(torch.bfloat16))


def test_a_megatron_checkpoint_exports(embedded_cache, small_val, tmp_path):
    pytest.importorskip("megatron.core")
    out = tmp_path / "run"
    summary = run(*load_config(overrides(out, 1, small_val, "trainer.ray_address=inprocess",
                                         "actor.strategy=megatron")))
    export(out / "checkpoints" / "step_000001", tmp_path / "model")
    got, final = weights(tmp_path / "model"), weights(summary["hf_export"])
    assert got.keys() == final.keys() and all(torch.equal(got[name], t) for name, t in final.items())


def test_bad_input_is_one_line(tmp_path, embedded_cache, small_val):
    def fails(*args) -> str:
        proc = subprocess.run([sys.executable, "-m", "rlplat.tools.export", *map(str, args)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        return line

    assert fails(tmp_path / "nope", "--out", tmp_path / "m") == (
        f"rlplat: export: {tmp_path / 'nope'}: no such checkpoint directory (expected "
        f"<output_dir>/checkpoints/step_NNNNNN)")
    run(*load_config(overrides(tmp_path / "run", 1, small_val, "trainer.ray_address=inprocess")))
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    (tmp_path / "afile").write_text("x")
    assert fails(ckpt, "--out", tmp_path / "afile").endswith("is a file; give a directory to write the model into")
    shard = next((ckpt / "actor").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])  # a damaged checkpoint
    assert fails(ckpt, "--out", tmp_path / "m").startswith(f"rlplat: export: {ckpt} is not a usable checkpoint: actor/")


def test_an_export_loads_in_vllm(tiny_model_path, small_val, tmp_path):
    """vLLM reads the exported directory itself (load_format=auto) and samples with its log-probs."""
    pytest.importorskip("vllm")
    out = tmp_path / "run"
    run(*load_config(overrides(out, 1, small_val, "trainer.ray_address=inprocess", f"model.path={tiny_model_path}",
                               "actor.optim.lr=1e-2")))
    export(out / "checkpoints" / "step_000001", tmp_path / "model")
    model_path = str(tmp_path / "model")
    cfg, plan = engine_config(model_path, extra=["rollout=vllm", "rollout.vllm.load_format=auto"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(model_path, with_ref=False)
        batch = group.generate_sequences(prompt_batch(model_path, temperature=1.0))
    finally:
        group.shutdown()
    with torch.no_grad():
        expected = reference_log_probs(AutoModelForCausalLM.from_pretrained(model_path), batch, 1.0)
    mask = batch.tensors["response_mask"].bool()
    torch.testing.assert_close(batch.tensors["rollout_log_probs"][mask], expected[mask], atol=1e-3, rtol=0)
