"""Configuration: the dataclass schema (source of truth), YAML presets, loading and validation."""

from rlplat.config.errors import ConfigError
from rlplat.config.loader import compose_config, group_options, load_config
from rlplat.config.plan import RunPlan, make_plan
from rlplat.config.schema import RLPlatConfig
from rlplat.config.validate import validate

__all__ = ["ConfigError", "RLPlatConfig", "RunPlan", "compose_config", "group_options", "load_config", "make_plan",
           "validate"]
