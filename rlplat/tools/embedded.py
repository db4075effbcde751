"""Build rlplat's embedded models ahead of a run (each is built on first use otherwise).

    python -m rlplat.tools.embedded                  # the embedded model (model.path=embedded)
    python -m rlplat.tools.embedded embedded-tools   # any of: embedded, embedded-tools, embedded-moe, embedded-vl,
                                                     # embedded-teacher
    python -m rlplat.tools.embedded --list           # which are built, and where

Each is a tiny model built locally and warm-started with a short supervised phase
(:mod:`rlplat.models.embedded`), cached under ``$RLPLAT_CACHE`` (default ``~/.cache/rlplat``); a model already
built is not built again.
"""

from __future__ import annotations

import argparse
import sys
import time

from rlplat.models.embedded import (
    EMBEDDED, FURTHER, VARIANTS, embedded_model_dir, warm_start_of,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlplat.tools.embedded", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=[EMBEDDED], metavar="NAME",
                        help=f"the models to build (default: {EMBEDDED}); one of {', '.join(VARIANTS)}")
    parser.add_argument("--list", action="store_true", help="say which embedded models are built, and where")
    args = parser.parse_args(argv)
    if unknown := [name for name in args.names if name not in VARIANTS]:
        parser.error(f"no embedded model {unknown[0]!r}; the embedded models are {', '.join(VARIANTS)}")
    if args.list:
        for name in VARIANTS:
            path = embedded_model_dir(name)
            steps = warm_start_of(name)["steps"] + (FURTHER[name]["steps"] if name in FURTHER else 0)
            state = "built" if (path / "config.json").exists() else f"not built ({steps} supervised steps)"
            print(f"{name}: {state}: {path}")
        return 0
    from rlplat.trainer.sft import ensure_embedded_model
    from rlplat.utils.quiet import quiet_third_party

    quiet_third_party(verbose=False)  # the build's own lines, not transformers' progress bars
    for name in args.names:
        start = time.perf_counter()
        built = (embedded_model_dir(name) / "config.json").exists()
        path = ensure_embedded_model(name)
        took = "already built" if built else f"built in {time.perf_counter() - start:.0f} s"
        print(f"rlplat: {name}: {took}: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
