"""Configuration: the dataclass schema (source of truth), YAML presets, loading and validation."""

from rlplat.config.loader import ConfigError, compose_config, group_options, load_config
from rlplat.config.schema import RLPlatConfig
from rlplat.config.validate import RunPlan, validate

__all__ = ["ConfigError", "RLPlatConfig", "RunPlan", "compose_config", "group_options", "load_config", "validate"]
