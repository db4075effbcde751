"""LoRA runs end to end on the embedded model: a checkpoint holds the adapters only, and the export gives the
trained policy, merged or as a PEFT adapter directory."""

import json

import pytest
import torch

from rlplat.tools.export import main as export_main
from rlplat.trainer.run import load_run_config, run

from .test_trainer import metrics, overrides

LORA = ["trainer.ray_address=inprocess", "model.lora.rank=8", "algorithm.use_kl_loss=true"]


def _train(out, steps, val, *extra):
    cfg, plan = load_run_config(overrides(out, steps, val, *LORA, *extra))
    return run(cfg, plan)


@pytest.mark.slow
def test_a_lora_checkpoint_holds_the_adapters_and_exports_the_trained_policy(embedded_cache, small_val, tmp_path, capsys):
    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoModelForCausalLM

    # (resuming from such a checkpoint: tests/trainer/test_reliability.py, kill -9 of a LoRA run)
    full = tmp_path / "full"
    _train(full, 4, small_val)
    assert metrics(full)[4]["actor/kl_loss"] > 0  # the adapters moved the policy

    # the checkpoint holds the adapters (and their optimizer state), not the frozen base weights
    ckpt = full / "checkpoints" / "step_000004"
    saved = FileSystemReader(str(ckpt / "actor")).read_metadata().state_dict_metadata
    weights = [key for key in saved if key.startswith("model.")]
    assert weights and all(".lora_A." in key or ".lora_B." in key for key in weights), weights[:3]

    # exported from the checkpoint: the end of run's merged model bit for bit; as an adapter, the same policy
    assert export_main([str(ckpt), "--out", str(tmp_path / "merged")]) == 0
    assert export_main([str(ckpt), "--out", str(tmp_path / "adapter"), "--adapter"]) == 0
    assert "PeftModel.from_pretrained(base_model" in capsys.readouterr().out
    end_of_run = AutoModelForCausalLM.from_pretrained(full / "hf_export").state_dict()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    assert exported.keys() == end_of_run.keys()
    assert all(torch.equal(exported[k], end_of_run[k]) for k in exported)

    from peft import PeftModel

    base_path = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), tmp_path / "adapter")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = torch.arange(40).reshape(2, 20) % merged.config.vocab_size
    with torch.no_grad():
        torch.testing.assert_close(adapted(ids).logits.log_softmax(-1), merged(ids).logits.log_softmax(-1),
                                   atol=1e-4, rtol=0)


@pytest.mark.slow
def test_the_kl_against_the_adapters_off_is_the_kl_against_a_reference_copy(embedded_cache, small_val, tmp_path, ray_cluster):
    # the same LoRA run twice on Ray: the reference as the actor's model with its adapters off (no copy), and
    # as a frozen copy of the base model on a pool of its own
    on_ray = ["trainer.ray_address=null", "model.lora.rank=8", "algorithm.use_kl_loss=true"]
    for name, extra in (("adapters", []), ("copy", ["ref.placement=separate"])):
        cfg, plan = load_run_config(overrides(tmp_path / name, 2, small_val, *on_ray, *extra))
        assert plan.reference == name.replace("copy", "separate")
        run(cfg, plan)
    adapters, copy = metrics(tmp_path / "adapters"), metrics(tmp_path / "copy")
    assert adapters[2]["actor/kl_loss"] > 0
    for step in (1, 2):
        assert adapters[step]["actor/kl_loss"] == pytest.approx(copy[step]["actor/kl_loss"], abs=1e-6, rel=0)
