"""``python -m rlplat.tools.export``: checkpoints of a 2-worker FSDP run (any step) and of Megatron runs
(TP = 1 and TP = 2) become Hugging Face models that transformers loads, with the training engine's weights
and log-probs; bad input is one line and exit status 2."""

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlplat.controller import InProcessWorkerGroup
from rlplat.tools.export import main as export_main
from rlplat.trainer.checkpoint import MANIFEST, write_manifest
from rlplat.trainer.run import load_run_config, run
from rlplat.workers.roles import ActorRolloutRefWorker

from trainer.test_trainer import overrides
from workers.helpers import engine_config, prompt_batch, reference_log_probs


def export(ckpt, out, *extra) -> None:
    assert export_main([str(ckpt), "--out", str(out), *extra]) == 0


def weights(model_dir) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()


def assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() >= expected.keys()
    assert all(torch.equal(got[name], tensor) for name, tensor in expected.items())


@pytest.mark.slow
def test_a_two_worker_checkpoint_exports_with_the_engines_log_probs(embedded_cache, small_val, tmp_path, ray_cluster):
    out = tmp_path / "run"
    summary = run(*load_run_config(overrides(out, 2, small_val, "trainer.workers_per_node=2", "trainer.save_freq=1")))
    # the last checkpoint: the same weights as the run's own export
    export(out / "checkpoints" / "step_000002", tmp_path / "last")
    final = weights(summary["hf_export"])
    assert_same(weights(tmp_path / "last"), final)
    # an earlier one, read back by a training engine of another world size (1): its weights, its log-probs
    export(out / "checkpoints" / "step_000001", tmp_path / "first")
    first = weights(tmp_path / "first")
    model_path = summary["hf_export"]
    cfg, plan = engine_config(model_path)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(model_path, with_ref=False)
        group.load_checkpoint(str(out / "checkpoints" / "step_000001"))
        assert_same(first, group.actor_weights()[0])
        torch.manual_seed(0)
        batch = group.generate_sequences(prompt_batch(model_path))
        engine = group.compute_log_probs(batch).tensors["old_log_probs"]
    finally:
        group.shutdown()
    with torch.no_grad():
        exported = reference_log_probs(AutoModelForCausalLM.from_pretrained(tmp_path / "first"), batch, 1.0)
    mask = batch.tensors["response_mask"].bool()
    torch.testing.assert_close(exported[mask], engine[mask], atol=1e-5, rtol=0)
    assert not torch.equal(first["model.norm.weight"], final["model.norm.weight"])  # step 1 is not step 2
    # bf16: the saved tensors are the cast weights
    export(out / "checkpoints" / "step_000002", tmp_path / "bf16", "--dtype", "bfloat16")
    saved = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert all(torch.equal(t, final[name].to(torch.bfloat16)) for name, t in saved.items())


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)], ids=["tp1-in-process", "tp2-ray"])
def test_a_megatron_checkpoint_exports_as_the_runs_own_export(embedded_cache, small_val, tmp_path, request, tp):
    """TP = 2: the shards of both ranks are joined and the vocabulary padding dropped."""
    pytest.importorskip("megatron.core")
    workers = ["trainer.ray_address=inprocess"] if tp == 1 else [
        "trainer.workers_per_node=2", f"actor.megatron.tensor_model_parallel_size={tp}"]
    if tp > 1:
        request.getfixturevalue("ray_cluster")
    out = tmp_path / "run"
    summary = run(*load_run_config(overrides(out, 1, small_val, "actor.strategy=megatron", *workers)))
    export(out / "checkpoints" / "step_000001", tmp_path / "model")
    got, final = weights(tmp_path / "model"), weights(summary["hf_export"])
    assert got.keys() == final.keys()
    assert_same(got, final)


@pytest.fixture(scope="module")
def checkpoint(embedded_cache, small_val, tmp_path_factory):
    """The checkpoint of a 1-step, 1-worker FSDP run."""
    out = tmp_path_factory.mktemp("export") / "run"
    run(*load_run_config(overrides(out, 1, small_val, "trainer.ray_address=inprocess")))
    return out / "checkpoints" / "step_000001"


def test_float16_and_the_last_line(checkpoint, tmp_path, capsys):
    export(checkpoint, tmp_path / "fp16", "--dtype", "float16")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"rlplat: exported {checkpoint} to {tmp_path / 'fp16'} (float16)")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "fp16")
    assert model.dtype == torch.float16
    export(checkpoint, tmp_path / "fp16", "--dtype", "float32")  # a previous export is replaced
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "fp16").dtype == torch.float32


def test_an_export_follows_the_umask(checkpoint, tmp_path):
    """model.safetensors comes out of save_pretrained private (0600): an export is readable as the user's
    umask says, like every other file (colleagues on a shared filesystem load it)."""
    previous = os.umask(0o027)
    try:
        export(checkpoint, tmp_path / "shared")
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [tmp_path / "shared", *(tmp_path / "shared").iterdir()]}
    assert modes.pop("model.safetensors") == 0o640
    assert modes.pop("shared") == 0o750
    assert set(modes.values()) == {0o640}, modes


def edited(checkpoint, tmp_path, **keys):
    """A copy of ``checkpoint`` whose config.yaml has ``keys`` changed, with a matching manifest."""
    copy = tmp_path / "copy" / "step_000001"
    shutil.copytree(checkpoint, copy)
    cfg = OmegaConf.load(copy / "config.yaml")
    for key, value in keys.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    (copy / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    write_manifest(copy, json.loads((copy / MANIFEST).read_text())["config"])
    return copy


def fails(capsys, ckpt, out, *extra) -> str:
    assert export_main([str(ckpt), "--out", str(out), *extra]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rlplat: export: ")
    return line.removeprefix("rlplat: export: ")


def test_bad_input_is_one_line(checkpoint, tmp_path, capsys):
    run_dir = checkpoint.parent.parent
    assert fails(capsys, run_dir, tmp_path / "m") == (
        f"{run_dir} holds checkpoints but is not one; pass one of them, e.g. the newest: {checkpoint}")
    (tmp_path / "empty").mkdir()
    assert fails(capsys, tmp_path / "empty", tmp_path / "m") == (
        f"{tmp_path / 'empty'} is not a usable checkpoint: no manifest.json (an incomplete or pre-manifest checkpoint)")
    (tmp_path / "afile").write_text("x")
    assert fails(capsys, checkpoint, tmp_path / "afile").endswith("is a file; give a directory to write the model into")
    assert fails(capsys, checkpoint, run_dir) == f"--out {run_dir} contains the checkpoint {checkpoint}; give a " \
                                                f"directory outside it"
    assert fails(capsys, checkpoint, tmp_path).startswith(f"--out {tmp_path} is a non-empty directory without a model")
    moved = edited(checkpoint, tmp_path, model__path=str(tmp_path / "gone"))
    assert fails(capsys, moved, tmp_path / "m") == (
        f"the run's model is needed for its config and tokenizer, but model.path='{tmp_path / 'gone'}': no such "
        f"directory (resolved to {tmp_path / 'gone'})")
    shutil.rmtree(moved.parent)
    other = edited(checkpoint, tmp_path, actor__strategy="deepspeed")
    assert fails(capsys, other, tmp_path / "m") == (
        f"{other}: actor.strategy='deepspeed' has no exporter; known: fsdp, megatron")
    shutil.rmtree(other.parent)
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    shard = next((damaged / "actor").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    assert fails(capsys, damaged, tmp_path / "m") == (
        f"{damaged} is not a usable checkpoint: actor/{shard.name} has 100 bytes, the manifest says "
        f"{(checkpoint / 'actor' / shard.name).stat().st_size}")
    assert not (tmp_path / "m").exists()


def test_a_real_process_prints_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlplat.tools.export", str(tmp_path / "nope"), "--out",
                           str(tmp_path / "m")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"rlplat: export: {tmp_path / 'nope'}: no such checkpoint directory (expected "
                           f"<output_dir>/checkpoints/step_NNNNNN)\n")


def test_an_export_loads_in_vllm(tiny_model_path, small_val, tmp_path):
    """vLLM reads the exported directory itself (load_format=auto) and samples with its log-probs."""
    pytest.importorskip("vllm")
    out = tmp_path / "run"
    run(*load_run_config(overrides(out, 1, small_val, "trainer.ray_address=inprocess", f"model.path={tiny_model_path}",
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
