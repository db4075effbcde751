"""TEST ONLY: a stand-in for torchvision in vLLM 0.32's Qwen-VL support, for CPU machines, which cannot have
torchvision (PyPI's build is CUDA's: ``import vllm`` then fails with "operator torchvision::nms does not exist", so
scripts/setup_vllm.sh removes it). On a GPU machine vLLM has torchvision and nothing here is used; rlplat itself
never imports this module (without torchvision, ``rollout=vllm`` with a vision-language model is refused at start-up).

vLLM needs torchvision for two things a Qwen-VL model's images do not:

1. ``vllm/model_executor/models/qwen2_vl.py`` imports ``smart_resize`` from
   ``transformers.models.qwen2_vl.image_processing_qwen2_vl``, the torchvision image processor's module, which
   imports torchvision: the stand-in is a module of that name holding the PIL image processor's ``smart_resize``
   (the same function) and class (the one transformers, and rlplat's dataset, use without torchvision).
2. ``Qwen2_5_VLProcessor.from_pretrained`` loads a video processor (``AutoVideoProcessor``), which needs
   torchvision: the stand-in gives one that refuses videos (rlplat's engine allows none per prompt). transformers
   checks a processor's parts by class name through its lazy module, which hides ``VideoProcessorMixin`` without
   torchvision: the stand-in shows it there.

:func:`standing_in` makes these changes in this process and undoes exactly what it changed. vLLM inspects a model's
class in a subprocess, which loads :func:`register` as a vLLM general plugin (the ``vllm.general_plugins`` entry point
of the dist-info beside this file, found through ``PYTHONPATH``) and keeps the changes for its short life.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Callable, Iterator

TORCHVISION_PROCESSOR = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
MIXIN = "VideoProcessorMixin"


class NoVideoProcessorAuto:
    """Where transformers' processors look for ``AutoVideoProcessor``: a video processor that refuses videos."""

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs):
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
        from transformers.video_processing_utils import VideoProcessorMixin

        class NoVideoProcessor(VideoProcessorMixin):
            def __init__(self, **settings):  # not VideoProcessorMixin's: that builds the torchvision backend
                self.__dict__.update(settings)

            def __call__(self, *args, **kwargs):
                raise RuntimeError("videos need torchvision, which this machine does not have")

            def __repr__(self):
                return "NoVideoProcessor()"

        images = Qwen2VLImageProcessorPil.from_pretrained(path)
        return NoVideoProcessor(merge_size=images.merge_size, patch_size=images.patch_size,
                                temporal_patch_size=images.temporal_patch_size)


def _stand_in() -> list[Callable[[], None]]:
    """Make the changes that are not made yet; return how to undo each."""
    from transformers import processing_utils
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil
    from transformers.video_processing_utils import VideoProcessorMixin

    undo = []
    if TORCHVISION_PROCESSOR not in sys.modules:
        module = types.ModuleType(TORCHVISION_PROCESSOR)
        module.smart_resize, module.Qwen2VLImageProcessor = pil.smart_resize, pil.Qwen2VLImageProcessorPil
        sys.modules[TORCHVISION_PROCESSOR] = module
        undo.append(lambda: sys.modules.pop(TORCHVISION_PROCESSOR, None))
    mapping = processing_utils.MODALITY_TO_AUTOPROCESSOR_MAPPING
    if "_MAPPING_NAMES" not in vars(mapping):  # the class's names, shadowed on the instance
        mapping._MAPPING_NAMES = {**mapping._MAPPING_NAMES, "video_processor": (__name__, "NoVideoProcessorAuto")}
        undo.append(lambda: delattr(mapping, "_MAPPING_NAMES"))
    lazy = processing_utils.transformers_module
    if MIXIN not in lazy._objects:
        lazy._objects[MIXIN] = VideoProcessorMixin
        hidden = lazy._object_missing_backend.pop(MIXIN, None)
        undo.append(lambda: (lazy._objects.pop(MIXIN, None),
                             hidden is not None and lazy._object_missing_backend.setdefault(MIXIN, hidden)))
    return undo


@contextlib.contextmanager
def standing_in() -> Iterator[None]:
    """The stand-in in this process (nothing where torchvision is installed), undone on leaving."""
    undo = _stand_in() if importlib.util.find_spec("torchvision") is None else []
    try:
        yield
    finally:
        for step in reversed(undo):
            step()


def register() -> None:
    """vLLM's general plugin hook, for its subprocesses: the stand-in for the rest of the process."""
    if importlib.util.find_spec("torchvision") is None:
        _stand_in()
