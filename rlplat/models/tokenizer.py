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



def check_teacher_tokenizer(tokenizer, path: str, key: str, trust_remote_code: bool = False) -> None:
    """On-policy distillation's teacher (the model directory ``path``, set by ``key``) scores the student's token
    ids as they are: a RunError, one line, unless its tokenizer loads and gives each of the student's tokens
    (``tokenizer``'s) the same id (it may have more)."""
    from transformers import AutoTokenizer

    from rlplat.utils.errors import RunError

    try:
        teacher = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RunError(f"{key}: its tokenizer does not load ({reason}); the teacher needs the student's tokenizer "
                       f"saved beside its weights") from None
    if problem := vocabulary_mismatch(tokenizer.get_vocab(), teacher.get_vocab()):
        raise RunError(f"{key}: its tokenizer is not the student's: {problem}; on-policy distillation scores the "
                       f"student's token ids with the teacher, so both need one vocabulary (distillation across "
                       f"tokenizers is not supported: docs/distillation.md)")


def vocabulary_mismatch(student: dict[str, int], teacher: dict[str, int]) -> str | None:
    """How many of the student's tokens have another id (or none) in the teacher's vocabulary, with the first
    one; None when every one maps to the same id (the teacher may have more tokens)."""
    differ = [(token, sid) for token, sid in sorted(student.items(), key=lambda item: item[1])
              if teacher.get(token) != sid]
    if not differ:
        return None
    token, sid = differ[0]
    where = f"{teacher[token]} in the teacher's" if token in teacher else "absent from the teacher's"
    return f"{len(differ)} of the student's {len(student)} tokens differ (the first, {token!r}: {sid} in the " \
           f"student's, {where})"
