"""The policy's tokenizer: ``model.tokenizer_path``, or the model's own, loaded with ``model.trust_remote_code``
(a tokenizer whose class is the model directory's own code needs it, as the model does), with
``model.chat_template`` in place of its chat template when set (rlplat.models.chat_template)."""

from __future__ import annotations

from omegaconf import DictConfig

from rlplat.models.chat_template import resolve_chat_template


def load_tokenizer(model_cfg: DictConfig, model_path: str):
    """The tokenizer of ``model_path`` (the ``model`` section ``model_cfg`` names it, or another directory)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_cfg.tokenizer_path or model_path,
                                              trust_remote_code=model_cfg.trust_remote_code)
    if model_cfg.get("chat_template"):
        tokenizer.chat_template = resolve_chat_template(model_cfg.chat_template)
    return tokenizer
