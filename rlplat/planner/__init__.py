"""The planner: a run's plan, checked before any worker starts or any GPU is touched: ``trainer.dry_run=true`` on
the main command, or ``python -m rlplat.tools.plan [overrides ...] [--device-memory 80GB]`` (:mod:`rlplat.tools.plan`).

Takes the run's own overrides and, without a GPU and without training:

1. resolves and validates the config as a run does, builds the reward functions (names, custom reward
   files) and imports ``trainer.imports``;
2. reads the data with the run's tokenizer and chat template: the prompt-length distribution of each split,
   and what ``data.truncation`` does to prompts longer than ``data.max_prompt_length`` (with ``error``, the
   count, the longest and the first row, and the knobs: stopped here, not after start-up);
3. prints the batch ledger: prompts, sequences and tokens per step, mini-batches, optimizer steps and
   micro-batches per worker, steps per epoch;
4. estimates the memory of one device in each phase (rollout, log-prob passes, update) from the model's
   config and what the chosen engines declare about their memory (:mod:`rlplat.planner.memory`; an engine of
   one's own is planned from its declarations, or the defaults of its base class), and flags each phase that
   does not fit ``--device-memory`` with the knob to turn;
5. estimates validation's cost and a checkpoint's size on disk.

The formulas, their sources and the measured error are in docs/plan.md. Exit status: 0 = every phase fits,
1 = a phase does not fit, 2 = the config, data or rewards are wrong (one line, as the run would print).
"""

from rlplat.planner.report import default_device_memory, planned_device, report

__all__ = ["default_device_memory", "planned_device", "report"]
