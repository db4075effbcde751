"""Megatron-Core on a CPU-only torch (tests, small runs on CPU machines).

Megatron-Core is written for CUDA: a few of its functions name the CUDA device or the CUDA random state
whatever device the model is on. :func:`redirected` points exactly those at the CPU for the length of a
``with`` block, and puts every original back when the block ends, so nothing outside the engine's own
calls into Megatron-Core sees a change (the engine enters it around each of them, and only on CPU). What
it redirects, and where megatron-core 0.16 needs it:

* ``torch.cuda.current_device()`` -> ``"cpu"``: the tensor-parallel layers and the pipeline's
  point-to-point messages allocate on it.
* ``torch.cuda.synchronize()`` -> nothing to wait for: the pipeline's shape exchange calls it.
* ``torch.zeros(..., device="cuda")`` inside ``pipeline_parallel.schedules`` -> CPU: the schedules' token
  counter is created there.
* the CUDA random state that activation recomputation saves and restores -> the CPU generator's (the
  engine builds the model without dropout, so recomputation draws nothing either way); the random-state
  tracker is Megatron-Core's inference tracker, whose forks draw nothing either.
* ``Tensor.cuda()`` while a model is built (:func:`building`): the tied output layer of the last
  pipeline stage is moved to CUDA before its first all-reduce with the embedding.
* ``moe_utils.te_general_gemm`` -> None where TransformerEngine is not installed (the name is then left
  undefined, and a router's forward reads it to choose its plain torch matmul).

These are private details of one Megatron-Core release, so another release is refused
(:func:`check_version`) rather than patched blindly.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator

import torch

#: the megatron-core releases (version prefix) whose CUDA-only calls this module knows
SUPPORTED_RELEASE = "0.16."


@functools.cache
def megatron_version() -> str:
    """The installed megatron-core's version (read once; the package metadata, without importing it)."""
    from importlib.metadata import version

    return version("megatron-core")


def check_version() -> None:
    """RuntimeError, in one line, unless the installed megatron-core is a release this module was written for."""
    found = megatron_version()
    if not found.startswith(SUPPORTED_RELEASE):
        raise RuntimeError(f"megatron-core {found} is installed; rlplat runs Megatron-Core on CPU only with "
                           f"{SUPPORTED_RELEASE}x (rlplat/engines/megatron/cpu.py redirects that release's "
                           f"CUDA-only calls): install megatron-core=={SUPPORTED_RELEASE}* or run on a GPU")


class _Redirection:
    """Attributes of other modules replaced while at least one ``with`` block of this redirection is open,
    and restored exactly (an attribute that was inherited is deleted again) when the last one closes; so
    blocks nest, and may even close out of order."""

    def __init__(self, targets: Callable[[], list[tuple[object, str, object]]],
                 on_enter: Callable[[], None] = lambda: None):
        self._targets, self._on_enter = targets, on_enter
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: list[tuple[object, str, bool, object]] = []  # (owner, name, own attribute?, original)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._on_enter()
                targets = self._targets()
                self._saved = [(owner, name, name in vars(owner), getattr(owner, name, None))
                               for owner, name, _ in targets]
                for owner, name, value in targets:
                    setattr(owner, name, value)
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    for owner, name, own, original in reversed(self._saved):
                        if own:
                            setattr(owner, name, original)
                        else:
                            delattr(owner, name)
                    self._saved = []


class _SchedulesTorch:
    """``torch`` as ``megatron.core.pipeline_parallel.schedules`` sees it: ``zeros(device="cuda")`` makes a
    CPU tensor; everything else is torch's."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*size, device=None, **kwargs):
        return torch.zeros(*size, device="cpu" if str(device).startswith("cuda") else device, **kwargs)


def _megatron_targets() -> list[tuple[object, str, object]]:
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import random
    from megatron.core.transformer.moe import moe_utils

    return [
        (moe_utils, "te_general_gemm", getattr(moe_utils, "te_general_gemm", None)),
        (torch.cuda, "current_device", lambda: "cpu"),
        (torch.cuda, "synchronize", lambda device=None: None),
        (schedules, "torch", _SchedulesTorch()),
        (random, "_get_cuda_rng_state", lambda *args, **kwargs: torch.get_rng_state()),
        (random, "_set_cuda_rng_state", lambda state, *args, **kwargs: torch.set_rng_state(state)),
    ]


def _first_entry() -> None:
    from megatron.core.tensor_parallel import random

    check_version()
    # a no-op once a tracker exists (it outlives the model-parallel state); its states are CPU generator states
    random.initialize_rng_tracker(inference_rng_tracker=True)


#: ``with redirected():`` around every call into Megatron-Core code on a CPU-only torch (see the module docstring)
redirected = _Redirection(_megatron_targets, on_enter=_first_entry)

#: ``with building():`` while a model is built on CPU: ``Tensor.cuda()`` leaves the tensor where it is
building = _Redirection(lambda: [(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)])
