"""Megatron-Core on a CPU-only torch (tests, small runs on our CPU machines).

Megatron-Core is written for CUDA: a few of its functions name the CUDA device or the CUDA random state
whatever device the model is on. :func:`use_cpu` points exactly those at the CPU, once per process, before
the engine builds a model; nothing changes on a GPU. What it redirects, and where megatron-core 0.16 needs it:

* ``torch.cuda.current_device()`` -> ``"cpu"``: the tensor-parallel layers and the pipeline's
  point-to-point messages allocate on it.
* ``torch.cuda.synchronize()`` -> nothing to wait for: the pipeline's shape exchange calls it.
* ``torch.zeros(..., device="cuda")`` inside ``pipeline_parallel.schedules`` -> CPU: the schedules' token
  counter is created there.
* the CUDA random state that activation recomputation saves and restores -> the CPU generator's (the
  engine builds the model without dropout, so recomputation draws nothing either way).
* ``Tensor.cuda()`` while a model is built (:func:`building`): the tied output layer of the last
  pipeline stage is moved to CUDA before its first all-reduce with the embedding.
"""

from __future__ import annotations

import contextlib

import torch

_installed = False


class _SchedulesTorch:
    """``torch`` as ``megatron.core.pipeline_parallel.schedules`` sees it: ``zeros(device="cuda")`` makes a
    CPU tensor; everything else is torch's."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*size, device=None, **kwargs):
        return torch.zeros(*size, device="cpu" if str(device).startswith("cuda") else device, **kwargs)


def use_cpu() -> None:
    """Point Megatron-Core's CUDA-only calls at the CPU (idempotent; only for a process without CUDA)."""
    global _installed
    if _installed:
        return
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import random

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda device=None: None
    schedules.torch = _SchedulesTorch()
    random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    random.initialize_rng_tracker(inference_rng_tracker=True)  # its states are CPU generator states
    _installed = True


@contextlib.contextmanager
def building():
    """While a model is built on CPU, ``Tensor.cuda()`` leaves the tensor where it is."""
    moved = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = moved
