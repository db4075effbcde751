"""Every rule and default that start-up validation and the runtime both need has one definition, which
both import: the two cannot disagree (as the overlong-buffer bound once did: "< max" in one, "<= max"
in the other)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlplat.algorithms import OverlongShaping, make_kl_controller, policy_loss_config
from rlplat.algorithms.advantages import SCALES
from rlplat.config import ConfigError
from rlplat.config.schema import RLPlatConfig, count_keys
from rlplat.engines.optim import LR_SCHEDULES, lr_lambda
from rlplat.reward import manager as reward_manager
from rlplat.rollout.base import LOAD_FORMATS
from rlplat.trainer.run import load_run_config
from rlplat.utils.errors import RunError
from rlplat.utils.tracking import LOGGERS, Tracker

PACKAGE = Path(__file__).resolve().parents[1] / "rlplat"
config_validate = importlib.import_module("rlplat.config.validate")  # the package exports a function of that name


def string_tuples() -> list[tuple[tuple[str, ...], str]]:
    """Every literal tuple of two or more strings in the library, with where it stands."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple) and len(node.elts) >= 2 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                found.append((tuple(e.value for e in node.elts), f"{path.relative_to(PACKAGE)}:{node.lineno}"))
    return found


@pytest.mark.parametrize("names", [SCALES, LR_SCHEDULES, LOGGERS, LOAD_FORMATS], ids=lambda n: "/".join(n))
def test_name_lists_are_written_once(names):
    places = [where for values, where in string_tuples() if set(values) == set(names)]
    assert len(places) == 1, f"{names} is spelled out in {places}: import the one definition instead"


def test_validation_uses_the_runtime_name_lists():
    assert config_validate.ENUMS["algorithm.norm_adv_scale"] is SCALES
    assert config_validate.LOGGERS is LOGGERS
    with pytest.raises(RunError, match="unknown logger"):
        Tracker(["console", "tensorbord"], "unused-dir-never-created")
    with pytest.raises(ValueError, match="unknown LR schedule 'cosin'"):
        lr_lambda("cosin", 0, 10, 0.0)
    with pytest.raises(ConfigError, match=r"actor.optim.lr_schedule='cosin' is not one of: constant, linear, cosine"):
        load_run_config(["actor.optim.lr_schedule=cosin"])


@pytest.mark.parametrize("length, ok", [(8, True), (7, True), (9, False), (0, False)])
def test_overlong_bound_is_the_shaping_rule(length, ok):
    overrides = ["algorithm.overlong_buffer.enable=true", f"algorithm.overlong_buffer.length={length}",
                 "data.max_response_length=8"]
    if ok:
        cfg, _ = load_run_config(overrides)
        shaping = reward_manager.build_reward_manager(cfg.reward, cfg.algorithm.overlong_buffer, 8).overlong
        assert shaping == OverlongShaping(8, length, cfg.algorithm.overlong_buffer.penalty_factor)
        return
    with pytest.raises(ValueError) as runtime:
        OverlongShaping(8, length)
    with pytest.raises(ConfigError) as config:
        load_run_config(overrides)
    assert str(config.value) == str(runtime.value)


def test_reward_weights_rule_is_shared():
    assert reward_manager.reward_weights_problem is config_validate.reward_weights_problem


def test_policy_loss_checks_live_in_the_loss_config():
    with pytest.raises(ValueError) as runtime:
        policy_loss_config(OmegaConf.create(
            {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 0.5, "policy_loss_options": {}}))
    with pytest.raises(ConfigError) as config:
        load_run_config(["algorithm.clip_ratio_c=0.5"])
    assert str(config.value) == f"algorithm.{runtime.value}"
    assert "clip_ratio_c" not in inspect.getsource(config_validate)


def test_kl_controller_defaults_come_from_the_schema():
    params = inspect.signature(make_kl_controller).parameters.values()
    assert all(p.default is inspect.Parameter.empty for p in params)


@pytest.mark.parametrize("key", count_keys())
def test_count_keys_come_from_the_schema(key):
    assert not hasattr(config_validate, "POSITIVE_INTS")
    with pytest.raises(ConfigError, match=f"^{key} must be >= 1, got 0"):
        load_run_config([f"{key}=0"])


def test_no_model_dtype_key():
    """Training always loads fp32; the rollout's dtype is ``rollout.dtype``."""
    from rlplat.config.schema import ModelConfig

    assert "dtype" not in ModelConfig.__dataclass_fields__
    assert "dtype" in RLPlatConfig.__dataclass_fields__["rollout"].default_factory().__dataclass_fields__
