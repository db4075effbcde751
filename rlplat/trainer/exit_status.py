"""The command line's exit statuses: bad input (a config key, a data file or row, a reward setting, a registry
name) is one ``rlplat: ...`` line and status 2; a failure while running is one line and status 1 (or 128 + the
signal's number when a signal stopped it); RLPLAT_DEBUG=1 adds the traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable


def exit_status(call: Callable[[], int | None]) -> int:
    """Run ``call``; its return value (None = 0), or the status of the error it raised, said in one line."""
    from rlplat.config import ConfigError
    from rlplat.data import DataError
    from rlplat.registry import RegistryError
    from rlplat.reward import RewardConfigError
    from rlplat.utils.errors import RunError, debug_traceback

    try:
        return call() or 0
    except (ConfigError, DataError, RewardConfigError, RegistryError) as err:
        debug_traceback()
        print(f"rlplat: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before training started (model loading, worker start-up)
        debug_traceback()
        print("rlplat: interrupted before training started; nothing was saved", file=sys.stderr)
        return 130
    except RunError as err:
        debug_traceback()
        print(f"rlplat: {err}", file=sys.stderr)
        return err.exit_code
