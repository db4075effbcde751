"""Shared set-up for the engine tests: a small config, prompt batches, a single-process reference."""

from __future__ import annotations

from dataclasses import dataclass

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


def full_weights(engine) -> list[tuple[str, torch.Tensor]]:
    """Every (name, full tensor) of a training engine, as trained: its export buckets, joined. Collective."""
    return [pair for bucket in engine.export_weights() for pair in bucket]


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


@dataclass
class UnshardedStep:
    weights: dict[str, torch.Tensor]  # after the step
    metrics: dict[str, float]  # the loss function's
    grad_norm: float  # before clipping


def unsharded_step(model_path: str, cfg, batch: Batch, loss_scale_factor: float) -> UnshardedStep:
    """One AdamW step of an unsharded model on the whole batch, with the same loss and settings."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    optim = cfg.actor.optim
    opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                            weight_decay=optim.weight_decay)
    temperature = batch.meta["temperature"]
    fwd = ForwardOutput(log_probs=reference_log_probs(model, batch, temperature))
    denominators = LossDenominators.from_mask(batch.tensors["response_mask"])
    loss, metrics = actor_loss(fwd, batch, cfg.algorithm, denominators, loss_scale_factor)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
    opt.step()
    return UnshardedStep({k: v.detach().clone() for k, v in model.state_dict().items()}, metrics, float(grad_norm))


def single_process_step(model_path: str, cfg, batch: Batch, loss_scale_factor: float) -> dict[str, torch.Tensor]:
    """The weights after :func:`unsharded_step`."""
    return unsharded_step(model_path, cfg, batch, loss_scale_factor).weights


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


# ------------------------------------------------------------------------------------------------- agents
ECHO_ENVIRONMENT = '''
from rlplat.agents.environment import Environment, Step

class Echo(Environment):
    """Answers every assistant turn with a user message naming the turn; done after three turns."""
    def reset(self, row):
        self.turns = 0
        return list(row["prompt"])

    def step(self, message):
        self.turns += 1
        if self.turns == 3:
            return Step([], done=True, rewards={"polite": 0.5}, info={"said": message["content"]})
        return Step([{"role": "user", "content": f"turn {self.turns}: go on"}], rewards={"polite": 0.25})

class Broken(Echo):
    def step(self, message):
        raise KeyError("no such state")
'''


def agent_prompts(tokenizer, questions: list[str]) -> Batch:
    """Left-padded chat prompts with the non-tensor columns an agent loop reads."""
    messages = [[{"role": "user", "content": q}] for q in questions]
    ids = [rendered(tokenizer, m, True) for m in messages]
    width = max(map(len, ids))
    tensor = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    return Batch.from_dict({"prompts": tensor, "prompt_mask": mask},
                           {"raw_prompt": messages, "data_source": ["echo"] * len(ids),
                            "ground_truth": ["-"] * len(ids), "extra_info": [{"index": k} for k in range(len(ids))]})


def rendered(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def observation_ids(tokenizer, before: list[dict], after: list[dict]) -> list[int]:
    """What the chat template appends to ``before`` to render ``after`` and the next generation prompt."""
    full, head = rendered(tokenizer, after, True), rendered(tokenizer, before, False)
    assert full[:len(head)] == head
    return full[len(head):]


def check_trajectories(out: Batch, tokenizer, stop_ids: set[int]) -> int:
    """Each row's response is its conversation token for token: every run of trained ids is an assistant
    turn (its text, then the stop id that ended it), every run of untrained ids the template's rendering of
    the message after it; the attention covers both. Returns how many rows had more than one turn."""
    t, multi_turn = out.tensors, 0
    width = t["responses"].shape[1]
    for row in range(len(out)):
        messages = out.non_tensors["extra_info"][row]["agent"]["messages"]
        ids, trained = t["responses"][row].tolist(), t["response_mask"][row].tolist()
        length = int(t["attention_mask"][row, -width:].sum())
        assert t["attention_mask"][row, -width:].tolist() == [1] * length + [0] * (width - length)
        runs, start = [], 0
        for end in range(1, length + 1):
            if end == length or trained[end] != trained[start]:
                runs.append((trained[start], ids[start:end]))
                start = end
        assert all(m == 0 for m in trained[length:])
        for index, (is_trained, run) in enumerate(runs):
            message = messages[1 + index]
            if is_trained:
                assert message["role"] == "assistant"
                text = run[:-1] if run[-1] in stop_ids else run
                assert tokenizer.decode(text) == message["content"]
            else:
                assert run == observation_ids(tokenizer, messages[:1 + index], messages[:2 + index])
        multi_turn += len(runs) > 1
    return multi_turn
