"""An engine of one's own, training and rollout, registered from a ``trainer.imports`` module (toy_engines.py)
with no edit to rlplat: the plan reads their declarations (or the base classes' defaults) and a run trains a
step with them."""

import pytest

from rlplat.config import ConfigError
from rlplat.tools import plan as plan_tool
from rlplat.trainer.run import load_run_config, run

from . import toy_engines
from .test_trainer import metrics, overrides

TOY = ["trainer.imports=[trainer.toy_engines]", "actor.strategy=toy", "rollout.name=toy"]


def test_the_plan_reads_what_engines_of_ones_own_declare(embedded_cache, capsys):
    assert plan_tool.main([*TOY, "algorithm.use_kl_loss=true"]) == 0
    out = capsys.readouterr().out
    assert "actor toy, rollout toy" in out
    # the training engine declares nothing: the base class's whole float32 model with AdamW, for the reference too
    for part in ("actor weights (fp32)", "actor gradients (fp32)", "actor AdamW moments (fp32)", "ref weights (fp32)"):
        assert part in out, part
    assert toy_engines.TOY_CACHE in out  # the rollout engine's own memory declaration
    assert "plan: every phase fits" in out


def test_an_engine_of_ones_own_is_checked_by_what_it_declares():
    # the toy rollout engine declares none of the HF engine's abilities, which it inherits the code of: the
    # start-up checks say what it cannot do
    with pytest.raises(ConfigError, match=r"rollout.lora_sync=adapter.*the toy engine"):
        load_run_config([*TOY, "model.lora.rank=4", "rollout.lora_sync=adapter"])
    separate = [*TOY, "rollout.mode=separate", "trainer.async_steps=1"]
    with pytest.raises(ConfigError, match=r"rollout.verify_weights=every compares .* the toy engine can do neither"):
        load_run_config(separate)
    with pytest.raises(ConfigError, match=r"rollout.partial=resume .* which the toy engine cannot do"):
        load_run_config([*separate, "rollout.verify_weights=off", "rollout.partial=resume"])
    # the training engine does not declare trains_experts
    with pytest.raises(ConfigError, match=r"actor.strategy=toy: model.path=embedded-moe is a mixture of experts, "
                                          r"which this engine does not train yet; use actor.strategy=fsdp"):
        load_run_config([*TOY, "model.path=embedded-moe"])


def test_a_step_trains_with_engines_of_ones_own(embedded_cache, small_val, tmp_path):
    before = toy_engines.forwards[0]
    cfg, plan = load_run_config(overrides(tmp_path, 1, small_val, "trainer.ray_address=inprocess", *TOY))
    run(cfg, plan)
    step = metrics(tmp_path)[1]
    assert step["actor/grad_norm"] > 0 and "actor/pg_loss" in step
    assert toy_engines.forwards[0] > before  # the update went through the toy engine's forward
    assert (tmp_path / "hf_export" / "config.json").is_file()  # exported through its export_weights
