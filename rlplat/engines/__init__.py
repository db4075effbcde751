"""Training engines behind one ABC, chosen by ``actor.strategy`` through ``TRAINING_ENGINES``."""

from rlplat.engines.base import TRAINING_ENGINES, ForwardOutput, ParallelLayout, TrainingEngine
from rlplat.engines.fsdp import FSDPEngine

__all__ = ["TRAINING_ENGINES", "FSDPEngine", "ForwardOutput", "ParallelLayout", "TrainingEngine"]
