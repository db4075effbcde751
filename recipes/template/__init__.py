"""A complete recipe to copy: GRPO with a per-token length penalty added to the reward stage."""
