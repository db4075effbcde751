"""Model-based scoring on workers: a learned reward model (a Hugging Face sequence-classification model).

:class:`RewardModelWorker` holds the reward model on its device: on the actor's devices
(``reward.model.placement=colocated``, a group sharing the actor's pool) or on a pool of its own
(``separate``, ``reward.model.workers_per_node`` workers). The controller sends the prompts' chat messages
and the decoded responses; each worker renders (prompt, response) as the reward model expects — its own
chat template with the response as the assistant turn, or the prompt's text followed by the response when
it has none — tokenizes with its own tokenizer (left-truncated to ``reward.model.max_length``, so the
response's end is kept) and returns the model's single logit per sample, computed in micro-batches of
``reward.model.micro_batch_size``.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from rlplat.data.vision import text_of
from rlplat.protocol import Batch
from rlplat.utils.errors import RunError
from rlplat.workers.base import Dispatch, Worker, register


def render_for_reward_model(tokenizer, messages: list[dict], response: str, templated: bool) -> str:
    """The text a reward model scores: its chat template over the prompt's messages plus the response as
    the assistant's turn (``templated``), else the messages' contents then the response (an image as ``<image>``:
    the reward model reads text)."""
    messages = [{**m, "content": text_of(m.get("content", ""))} for m in messages]
    if templated:
        return tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": response}], tokenize=False)
    return "\n".join(str(m.get("content", "")) for m in messages) + "\n" + response


class RewardModelWorker(Worker):
    """One reward-model replica; ``score`` is data-parallel over the group's workers."""

    def __init__(self, rank: int, world_size: int, device: str, cfg: DictConfig, plan=None):
        super().__init__(rank, world_size, device)
        self.cfg = cfg
        self.model = self.tokenizer = None
        self.templated = False  # whether texts are rendered with the reward model's chat template

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        section = self.cfg.reward.model
        device = self.dist.device if self.dist is not None else torch.device("cpu")
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(section.path)
            self.model = AutoModelForSequenceClassification.from_pretrained(
                section.path, dtype=dtype, trust_remote_code=self.cfg.model.trust_remote_code)
        except (OSError, ValueError) as err:
            raise RunError(f"reward.model.path={section.path!r} is not a Hugging Face sequence-classification "
                           f"model directory: {str(err).splitlines()[0]}") from None
        if self.model.config.num_labels != 1:
            raise RunError(f"reward.model.path={section.path!r} has {self.model.config.num_labels} labels; a reward "
                           f"model gives one score per sequence (num_labels=1)")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id  # where the model finds each sequence's end
        self.tokenizer.truncation_side = "left"  # a long prompt loses its start; the response is kept
        self.tokenizer.padding_side = "right"
        self.templated = bool(section.apply_chat_template and getattr(self.tokenizer, "chat_template", None))
        self.model.to(device).eval()

    @register(Dispatch.DP_SPLIT)
    def score(self, batch: Batch) -> Batch:
        """``rm_scores`` [B]: the reward model's logit for each (``raw_prompt``, ``response_text``) row."""
        section = self.cfg.reward.model
        texts = [render_for_reward_model(self.tokenizer, list(messages), response, self.templated)
                 for messages, response in zip(batch.non_tensors["raw_prompt"], batch.non_tensors["response_text"])]
        scores = []
        with torch.no_grad():
            for start in range(0, len(texts), section.micro_batch_size):
                encoded = self.tokenizer(texts[start:start + section.micro_batch_size], return_tensors="pt",
                                         padding=True, truncation=True, max_length=section.max_length,
                                         add_special_tokens=not self.templated)  # a template has its own
                logits = self.model(**encoded.to(self.model.device)).logits
                scores.append(logits[:, 0].float().cpu())
        return Batch.from_dict({"rm_scores": torch.cat(scores) if scores else torch.zeros(0)})


class JudgeWorker(Worker):
    """A judge model served by a rollout engine (``reward.judge.model_path``; ``embedded`` = the embedded
    tiny model, for trying the plumbing on CPU; engine ``reward.judge.engine``
    with the settings of ``rollout.<engine>``); ``judge`` answers judge prompts greedily (or at
    ``reward.judge.temperature``), data-parallel over the group's workers. The prompts are rendered with the
    judge's chat template as one user message (as they are without one when it has none), left-truncated to
    ``reward.judge.max_prompt_length`` tokens; an answer is at most ``reward.judge.max_new_tokens`` long."""

    def __init__(self, rank: int, world_size: int, device: str, cfg: DictConfig, plan=None):
        super().__init__(rank, world_size, device)
        self.cfg = cfg
        self.engine = self.tokenizer = None
        self.pad_token_id = 0

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        from transformers import AutoTokenizer

        from rlplat.rollout import ROLLOUT_ENGINES, RolloutSetup

        from rlplat.models.embedded import EMBEDDED, embedded_model_dir

        judge = self.cfg.reward.judge
        path = str(embedded_model_dir()) if judge.model_path == EMBEDDED else judge.model_path
        device = self.dist.device if self.dist is not None else torch.device("cpu")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as err:
            raise RunError(f"reward.judge.model_path={judge.model_path!r} has no tokenizer: "
                           f"{str(err).splitlines()[0]}") from None
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.pad_token_id = pad
        setup = RolloutSetup(model_path=path, tokenizer_path=path, device=device,
                             dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
                             eos_token_id=self.tokenizer.eos_token_id, pad_token_id=pad,
                             max_model_len=judge.max_prompt_length + judge.max_new_tokens, seed=self.cfg.trainer.seed,
                             rank=self.rank, world_size=self.world_size,
                             trust_remote_code=self.cfg.model.trust_remote_code)
        section = self.cfg.rollout.get(judge.engine)
        if "load_format" in section:  # the judge reads its own weights; no actor sends it any
            section = OmegaConf.merge(section, {"load_format": "auto"})
        self.engine = ROLLOUT_ENGINES.get(judge.engine)(setup, section)
        if self.engine.needs_initial_weights:
            raise RunError(f"reward.judge.engine={judge.engine!r} would start from weights it does not load itself")

    def _prompt_ids(self, text: str) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                     add_generation_prompt=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        else:
            ids = self.tokenizer(text)["input_ids"]
        return list(ids)[-self.cfg.reward.judge.max_prompt_length:]

    @register(Dispatch.DP_SPLIT)
    def judge(self, batch: Batch) -> Batch:
        """``judge_output``: the judge's answer to each ``judge_prompt`` row."""
        import numpy as np

        from rlplat.rollout import SamplingParams

        judge = self.cfg.reward.judge
        rows = [self._prompt_ids(text) for text in batch.non_tensors["judge_prompt"]]
        width = max(map(len, rows), default=1)
        pad = self.pad_token_id
        prompts = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
        params = SamplingParams(max_new_tokens=judge.max_new_tokens, temperature=judge.temperature,
                                seed=self.cfg.trainer.seed)
        out = self.engine.generate(Batch.from_dict({"prompts": prompts, "prompt_mask": mask}), params)
        answers = [self.tokenizer.decode(ids[keep.bool()], skip_special_tokens=True)
                   for ids, keep in zip(out.tensors["responses"], out.tensors["response_mask"])]
        return Batch.from_dict(non_tensors={"judge_output": np.array(answers, dtype=object)})

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
