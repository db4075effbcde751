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
