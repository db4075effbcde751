"""``python -m rlplat.tools.plan [overrides ...] [--device-memory 80GB] [--device cuda|cpu]``: the plan of a run
with the same overrides, checked before any GPU is touched (:mod:`rlplat.planner` has what it checks and
prints; the formulas are in docs/plan.md). ``trainer.dry_run=true`` on the main command does the same.
"""

from __future__ import annotations

import argparse
import re
import sys

from rlplat.planner import planned_device
from rlplat.trainer.run import run_plan


def parse_size(text: str) -> int:
    """``80GB`` / ``80G`` / ``80GiB`` / ``81920MB`` / bytes -> bytes (GB = 10^9, GiB = 2^30)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?)B?\s*", text, re.I)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 80GB, 141GB or 24GiB")
    number, unit, binary = float(match.group(1)), match.group(2).upper(), bool(match.group(3))
    return int(number * (1024 if binary else 1000) ** " KMGT".index(unit or " "))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlplat.tools.plan", description=__doc__.split("\n\n")[0],
                                     epilog="Any other argument is a config override, as for rlplat.trainer.main.")
    parser.add_argument("--device-memory", type=parse_size, default=None,
                        help="one device's memory, e.g. 80GB (default: the visible GPU's, else 80GB; on a CPU run "
                             "(trainer.device=cpu) this machine's memory)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="plan for this device (default: trainer.device; auto = a visible GPU, else the CPU); "
                             "trainer.device=cuda plans for GPUs on a machine without one")
    args, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if unknown := [o for o in overrides if o.startswith("-")]:
        parser.error(f"unknown option {unknown[0]!r}")
    from rlplat.config import ConfigError
    from rlplat.trainer.run import load_run_config

    try:
        cfg, plan = load_run_config(overrides, device=args.device or planned_device(overrides), require_installed=False)
    except ConfigError as err:
        print(f"rlplat: config error: {err}", file=sys.stderr)
        return 2
    return run_plan(cfg, plan, args.device_memory)


if __name__ == "__main__":
    sys.exit(main())
