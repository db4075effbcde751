"""rlplat: a reinforcement-learning platform for post-training language models."""

import sys as _sys

__version__ = "0.1.0"

try:  # the first of rlplat's dependencies that every entry point imports
    import omegaconf
except ModuleNotFoundError as _missing:
    _hint = (f"rlplat: {_missing.name!r} is not installed in this Python ({_sys.executable}); rlplat's "
             f"dependencies are in the project's virtualenv: run `bash scripts/setup.sh`, then use "
             f"`.venv/bin/python` (or `source .venv/bin/activate`, after which the docs' `python` is that one)")
    if _sys.argv[:1] == ["-m"]:  # python -m rlplat...: one line, no traceback
        raise SystemExit(_hint) from None
    raise ModuleNotFoundError(_hint, name=_missing.name) from None
del omegaconf

