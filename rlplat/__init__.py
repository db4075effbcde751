"""rlplat: a reinforcement-learning platform for post-training language models."""

__version__ = "0.1.0"
