"""What runs on a device: the role workers, the engines they hold (built from ``rlplat.engines`` and
``rlplat.rollout``), and the losses they train with."""
