"""Rollout engines behind one ABC, chosen by ``rollout.name`` through ``ROLLOUT_ENGINES``."""

from rlplat.rollout.base import ROLLOUT_ENGINES, RolloutEngine, SamplingParams
from rlplat.rollout.hf import HFRolloutEngine

__all__ = ["ROLLOUT_ENGINES", "HFRolloutEngine", "RolloutEngine", "SamplingParams"]
