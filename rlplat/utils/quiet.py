"""Quiet by default: other libraries' loading bars, advisory warnings and deprecation notices stay out of a
normal run's output (``trainer.verbose=true`` brings them back)."""

from __future__ import annotations

import logging
import os
import sys
import warnings

# what keeps them quiet in a process that has not imported them yet (the Ray workers get it as their env)
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' and the hub's tqdm bars ("Loading weights ...")
    "TRANSFORMERS_VERBOSITY": "error",  # advisory warnings such as the torch_dtype deprecation
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning,ignore::UserWarning",
}


def quiet_third_party(verbose: bool) -> dict[str, str]:
    """Silence them in this process (unless ``verbose``); return the environment for worker processes."""
    if verbose:
        return {}
    os.environ.update(QUIET_ENV)
    for category in (DeprecationWarning, FutureWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)
    if "transformers" in sys.modules:  # imported before the environment was set: switch it off directly
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:  # its bars (transformers' "Loading weights" too) read the variable at import
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    logging.getLogger("ray").setLevel(logging.ERROR)  # "Started a local Ray instance", token notices
    return dict(QUIET_ENV)
