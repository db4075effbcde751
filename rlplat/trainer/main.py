"""Entry point: ``python -m rlplat.trainer.main [group=preset ...] [key=value ...] [--cfg job] [--help]``.

Composes the Hydra config (schema + presets + overrides), validates it, then runs the PPO-family
trainer. ``--cfg job`` prints the resolved, validated config as YAML and exits without training.
Errors in what the user gave (config keys, data files, reward functions, registered names) print one
line naming the key, file or row and exit with status 2; failures while running (a reward function failing
on a whole step, an unusable model path, ...) print one ``rlplat: ...`` line and exit with status 1.
``RLPLAT_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import sys

USAGE = """usage: python -m rlplat.trainer.main [algorithm=PRESET] [actor=STRATEGY] [rollout=ENGINE] [key=value ...]
                                   [--cfg job] [--help]

  --cfg job   print the resolved, validated config and exit
  trainer.dry_run=true   check data, rewards and memory and print the run's plan, without training
                         (python -m rlplat.tools.plan takes the same overrides)
  --help      this message, with the presets of each group

Examples:
  python -m rlplat.trainer.main algorithm=grpo
  python -m rlplat.trainer.main algorithm=dapo rollout.n=16 data.train_files=train.parquet
  python -m rlplat.trainer.main algorithm=grpo algorithm.adv_estimator=rloo --cfg job
"""


def registered_names() -> dict[str, tuple[str, ...]]:
    """Every registered plug-in name by kind (algorithms and reward functions), as ``--help`` and the
    README list them."""
    from rlplat.algorithms import (
        ADVANTAGE_ESTIMATORS, AGGREGATION_MODES, KL_ESTIMATORS, OFF_POLICY_CORRECTIONS, POLICY_LOSSES,
    )
    from rlplat.reward import REWARD_FUNCTIONS

    return {
        "advantage estimators (algorithm.adv_estimator)": ADVANTAGE_ESTIMATORS.names(),
        "policy losses (algorithm.policy_loss)": POLICY_LOSSES.names(),
        "loss aggregation modes (algorithm.loss_agg_mode)": AGGREGATION_MODES.names(),
        "KL estimators (algorithm.kl_penalty, algorithm.kl_loss_type)": KL_ESTIMATORS.names(),
        "off-policy corrections (algorithm.off_policy.correction)": OFF_POLICY_CORRECTIONS.names(),
        "reward functions (reward.functions; auto = by data_source)": REWARD_FUNCTIONS.names(),
    }


def _names_help() -> str:
    lines = []
    for kind, names in registered_names().items():
        lines.append(f"  {kind}: {' '.join(names)}")
        if kind.startswith("KL estimators"):
            lines.append("  (every KL estimator also as NAME+: its value with the k2 gradient, straight-through)")
    return "\n".join(lines)


def _usage() -> str:
    from rlplat.config import group_options
    from rlplat.config.loader import GROUPS

    groups = "\n".join(f"  {g}: {', '.join(group_options(g))}" for g in GROUPS)
    return (f"{USAGE}\nPresets:\n{groups}\n\nRegistered names (formulas: docs/algorithms.md):\n{_names_help()}\n\n"
            "Every key and its default: python -m rlplat.config.reference\n")


def parse_args(argv: list[str]) -> tuple[list[str], str | None, bool]:
    overrides, cfg_mode, show_help = [], None, False
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            show_help = True
        elif arg == "--cfg" or arg.startswith("--cfg="):
            cfg_mode = arg.split("=", 1)[1] if "=" in arg else next(args, None)
            if cfg_mode not in ("job", "all"):
                raise SystemExit(f"rlplat: --cfg takes 'job' (or 'all'), got {cfg_mode!r}")
        elif arg.startswith("-"):
            raise SystemExit(_unknown_option(arg))
        else:
            overrides.append(arg)
    return overrides, cfg_mode, show_help


def _unknown_option(arg: str) -> str:
    """The error for an option rlplat does not take: for one of open-instruct's flags (``--flag value`` or
    ``--flag=value``), rlplat's setting for it or why there is none."""
    from rlplat.config.migration import equivalent

    known = equivalent(arg.split("=", 1)[0]) if arg.startswith("--") else None
    if known and known[0] == "open-instruct":
        return (f"rlplat: {arg.split('=', 1)[0]} is open-instruct's flag; {known[1]}. rlplat takes key=value "
                f"overrides (docs/migrating.md maps the others)")
    return f"rlplat: unknown option {arg!r}\n\n{USAGE}"


def main(argv: list[str] | None = None, trainer_cls: type | None = None) -> int:
    """Run the CLI; a recipe passes its trainer subclass as ``trainer_cls``."""
    from omegaconf import OmegaConf

    from rlplat.config import ConfigError
    from rlplat.trainer.run import load_run_config

    overrides, cfg_mode, show_help = parse_args(sys.argv[1:] if argv is None else argv)
    if show_help:
        print(_usage())
        return 0
    from rlplat.planner import planned_device

    # a dry run and --cfg job plan a GPU run (trainer.device=cuda) on a machine without one; a dry run's engines'
    dry = "trainer.dry_run=true" in overrides  # packages may be installed only where it runs
    try:
        cfg, plan = load_run_config(overrides, planned_device(overrides) if dry or cfg_mode else None,
                                    require_installed=not dry)
    except ConfigError as err:
        print(f"rlplat: config error: {err}", file=sys.stderr)
        return 2
    if cfg_mode:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    if cfg.trainer.dry_run:
        from rlplat.trainer.run import run_plan

        return run_plan(cfg, plan)
    from rlplat.trainer.exit_status import exit_status
    from rlplat.trainer.run import run

    def train() -> None:
        run(cfg, plan, trainer_cls)

    return exit_status(train)


if __name__ == "__main__":
    sys.exit(main())
