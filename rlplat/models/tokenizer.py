"""The policy's tokenizer: ``model.tokenizer_path``, or the model's own, loaded with ``model.trust_remote_code``
(a tokenizer whose class is the model directory's own code needs it, as the model does)."""

from __future__ import annotations

from omegaconf import DictConfig


def load_tokenizer(model_cfg: DictConfig, model_path: str):
    """The tokenizer of ``model_path`` (the ``model`` section ``model_cfg`` names it, or another directory)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_cfg.tokenizer_path or model_path,
                                         trust_remote_code=model_cfg.trust_remote_code)
