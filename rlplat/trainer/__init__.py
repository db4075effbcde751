"""The controller: PPO-family trainer, its named stages, and the command-line entry point; from Python,
``from rlplat.trainer import GRPOTrainer`` (:mod:`rlplat.trainer.python_api`)."""


def __getattr__(name: str):
    """``GRPOTrainer``, imported when first asked for: the command line's modules do not need it."""
    if name == "GRPOTrainer":
        from rlplat.trainer.python_api import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'rlplat.trainer' has no attribute {name!r}")
