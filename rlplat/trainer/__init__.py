"""The controller: PPO-family trainer, its named stages, and the command-line entry point."""
