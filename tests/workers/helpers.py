"""Shared set-up for the engine tests: a small config, prompt batches, a single-process reference."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlplat.algorithms import LossDenominators
from rlplat.trainer.run import load_run_config
from rlplat.protocol import Batch
from rlplat.sequence import position_ids_from_mask, response_log_probs
from rlplat.workers.actor_loss import actor_loss
from rlplat.engines.base import ForwardOutput

PROMPTS = ["1+2=", "34+5=", "7+80=", "9+9=", "12+13=", "5+6=", "40+2=", "3+3="]


def engine_config(model_path: str, workers: int = 1, extra: list[str] | None = None, device: str = "cpu"):
    # AdamW's first step is lr * g / (|g| + eps): with the default eps a near-zero gradient whose sign
    # is decided by float rounding moves a weight by a full lr. eps=1e-4 keeps the comparison of a
    # sharded and an unsharded step about the math, not the rounding.
    overrides = [
        f"model.path={model_path}", "algorithm=grpo", "rollout.n=2", "data.train_batch_size_prompts=4",
        "actor.mini_batch_size_prompts=4", "actor.micro_batch_size_seqs_per_worker=2",
        "critic.micro_batch_size_seqs_per_worker=2", "actor.log_prob_micro_batch_size_seqs_per_worker=3",
        "data.max_response_length=8", "actor.optim.lr=1e-3", "actor.optim.eps=1e-4", "actor.optim.warmup_steps=0", "actor.shuffle=false",
        f"trainer.workers_per_node={workers}", f"trainer.device={device}",
    ]
    if workers == 1:
        overrides.append("trainer.ray_address=inprocess")
    return load_run_config(overrides + list(extra or []))


def prompt_batch(model_path: str, n: int = 8, temperature: float = 1.0) -> Batch:
    tok = AutoTokenizer.from_pretrained(model_path)
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in PROMPTS[:n]
    ]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return Batch.from_dict(
        {"prompts": enc["input_ids"], "prompt_mask": enc["attention_mask"]},
        meta={"temperature": temperature},
    )


def reference_log_probs(model, batch: Batch, temperature: float) -> torch.Tensor:
    t = batch.tensors
    logits = model(
        input_ids=t["input_ids"], attention_mask=t["attention_mask"],
        position_ids=position_ids_from_mask(t["attention_mask"]), use_cache=False,
    ).logits[:, -t["responses"].shape[1] - 1 : -1]
    return response_log_probs(logits, t["responses"], temperature)[0]


def single_process_step(model_path: str, cfg, batch: Batch, loss_scale_factor: float) -> dict[str, torch.Tensor]:
    """One AdamW step of an unsharded model on the whole batch, with the same loss and settings."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    optim = cfg.actor.optim
    opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                            weight_decay=optim.weight_decay)
    temperature = batch.meta["temperature"]
    fwd = ForwardOutput(log_probs=reference_log_probs(model, batch, temperature))
    denominators = LossDenominators.from_mask(batch.tensors["response_mask"])
    loss, _ = actor_loss(fwd, batch, cfg.algorithm, denominators, loss_scale_factor)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
    opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def with_training_fields(rollout: Batch, seed: int = 0) -> Batch:
    """Add advantages and ref/old log-probs so the batch can go through update_actor."""
    gen = torch.Generator().manual_seed(seed)
    mask = rollout.tensors["response_mask"].float()
    extra = Batch.from_dict(
        {
            "advantages": torch.randn(len(rollout), 1, generator=gen) * mask,
            "ref_log_probs": rollout.tensors["rollout_log_probs"] - 0.05 * mask,
        },
        meta=dict(rollout.meta),
    )
    return rollout.union(extra)


def check_rollout_layout(out, prompts, eos_id, pad_id, max_new_tokens):
    t = out.tensors
    b, p = prompts.tensors["prompts"].shape
    assert t["responses"].shape == (b, max_new_tokens) and t["response_mask"].shape == (b, max_new_tokens)
    assert t["input_ids"].shape == (b, p + max_new_tokens) == t["attention_mask"].shape
    torch.testing.assert_close(t["input_ids"][:, :p], prompts.tensors["prompts"])
    for row, mask in zip(t["responses"], t["response_mask"]):
        length = int(mask.sum())
        assert mask[:length].all() and not mask[length:].any()  # ones, then zeros
        eos = (row[:length] == eos_id).nonzero()
        assert len(eos) <= 1 and (len(eos) == 0 and length == max_new_tokens or eos[0, 0] == length - 1)
        assert (row[length:] == pad_id).all()
