"""``python -m rlplat.tools.report RUN_DIR``: the command line of :mod:`rlplat.utils.report` (which the
trainer also calls at the end of every run, so it lives below the trainer)."""

import sys

from rlplat.utils.report import main

if __name__ == "__main__":
    sys.exit(main())
