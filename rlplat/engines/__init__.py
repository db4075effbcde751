"""Training engines behind one ABC, chosen by ``<role>.strategy`` through ``TRAINING_ENGINES``.

``megatron`` is registered lazily: its module (and megatron-core) is imported only when a run chooses it.
"""

from rlplat.engines.base import TRAINING_ENGINES, ForwardOutput, MicroBatching, ParallelLayout, TrainingEngine
from rlplat.engines.fsdp import FSDPEngine

TRAINING_ENGINES.add_lazy("megatron", "rlplat.engines.megatron.engine:MegatronEngine", requires=("megatron",),
                          install="pip install -e '.[megatron]'")

__all__ = ["TRAINING_ENGINES", "FSDPEngine", "ForwardOutput", "MicroBatching", "ParallelLayout", "TrainingEngine"]
