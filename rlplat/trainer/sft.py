"""Supervised fine-tuning on prompt -> answer pairs, with the same workers and engines as RL.

    python -m rlplat.trainer.sft --model PATH --data builtin:arithmetic --out DIR --steps 200

The target response of a row is ``extra_info["solution"]`` when present, else
``reward_model.ground_truth``, followed by EOS. The loss is the token-mean negative log-likelihood of the
response tokens. The result is written as a Hugging Face model (safetensors + tokenizer) to ``--out``.
This is how rlplat warm-starts its embedded tiny model before RL (RL from random init is slow):
:func:`ensure_embedded_model` builds it (:mod:`rlplat.models.embedded`), fine-tunes it here and caches it.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rlplat.config import compose_config
from rlplat.config.schema import AgentConfig
from rlplat.config.validate import resolve_device
from rlplat.controller import InProcessWorkerGroup
from rlplat.agents.trajectory import Trajectory
from rlplat.data import TASKS, PromptSampler, RLDataset, collate, resolve_files, write_parquet
from rlplat.data.synthetic import with_tool_demonstrations
from rlplat.data.dataset import ToolsOf
from rlplat.data.vision import ImageInputs
from rlplat.models.embedded import EMBEDDED, EMBEDDED_TOOLS, FURTHER, embedded_model_dir, spec_of, warm_start_of
from rlplat.models.tiny import build_tiny_model
from rlplat.models.vision import image_inputs_of
from rlplat.protocol import Batch
from rlplat.agents.setup import Environments
from rlplat.rollout.base import assemble_rollout
from rlplat.workers.roles import SFTWorker


def target_ids(item: dict, tokenizer, tools_of: ToolsOf | None = None) -> tuple[list[int], list[int]]:
    """A row's target after its prompt and the loss mask over it. ``extra_info["solution_messages"]``: a
    conversation (assistant turns, tool results, a user's replies) laid out as an agent loop lays out a
    trajectory (:class:`rlplat.agents.Trajectory`: each assistant turn's text and EOS trained, the other
    messages rendered by the chat template and not trained); else ``extra_info["solution"]``, or the
    ground truth, and EOS."""
    info = item["extra_info"] or {}
    if info.get("solution_messages"):
        trajectory = Trajectory(list(item["prompt_ids"]), [dict(m) for m in item["raw_prompt"]])
        tools = tools_of(info) if tools_of else None
        for message in info["solution_messages"]:
            if message["role"] == "assistant":
                ids = tokenizer(message["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                trajectory.add_sampled(ids, [0.0] * len(ids), message["content"])
            else:
                trajectory.add_observation(tokenizer, [{"role": message["role"], "content": message["content"]}], tools)
        return trajectory.response_ids, trajectory.loss_mask
    target = info.get("solution")
    ids = tokenizer(str(item["ground_truth"] if target is None else target), add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.eos_token_id], [1] * (len(ids) + 1)


def sft_batch(items: list[dict], targets: list[tuple[list[int], list[int]]], pad_token_id: int,
              max_response_length: int, images: ImageInputs | None = None) -> Batch:
    """Prompts left-padded, each item's target (ids and loss mask: :func:`target_ids`) right-padded to
    ``max_response_length``; the loss covers the trained tokens, the attention all of them. ``images``: a
    vision-language model's image inputs (for prompts with images)."""
    tensors, lists = collate(items, pad_token_id, images)
    prompts = Batch.from_dict(tensors, non_tensors=lists, meta={"temperature": 1.0})
    responses = torch.full((len(items), max_response_length), pad_token_id, dtype=torch.long)
    trained, attended = torch.zeros_like(responses), torch.zeros_like(responses)
    for row, (ids, mask) in enumerate(targets):
        ids, mask = ids[:max_response_length], mask[:max_response_length]
        responses[row, : len(ids)] = torch.tensor(ids)
        trained[row, : len(ids)] = torch.tensor(mask)
        attended[row, : len(ids)] = 1
    return assemble_rollout(prompts, responses, trained, torch.zeros(responses.shape), attended)


@functools.cache
def _environments() -> Environments:
    return Environments(AgentConfig())


def row_tools(extra_info) -> list[dict] | None:
    """The schemas of the tools a row offers (``extra_info["tools"]``), which its prompt shows (each tool
    made once, as the agent loop makes them)."""
    return _environments().schemas_of(extra_info)


def run_sft(
    model_path: str, data_files: list[str], out_dir: str, steps: int, batch_size: int = 64, lr: float = 1e-3,
    micro_batch_size: int = 64, max_response_length: int = 16, seed: int = 0, log_every: int = 50,
) -> dict[str, float]:
    from transformers import AutoTokenizer

    if min(steps, batch_size, micro_batch_size, max_response_length) < 1 or batch_size % micro_batch_size:
        raise ValueError(f"sft: steps, batch sizes and max_response_length must be >= 1 and the micro-batch "
                         f"({micro_batch_size}) must divide the batch ({batch_size})")
    # The typed schema's model/actor sections (the RL run's own keys and defaults); only they are read.
    cfg = compose_config([
        f"model.path={model_path}", f"trainer.seed={seed}", f"actor.optim.lr={lr}",
        "actor.optim.lr_schedule=cosine", "actor.optim.min_lr_ratio=0.0", f"actor.optim.warmup_steps={min(20, steps)}",
        f"actor.micro_batch_size_seqs_per_worker={micro_batch_size}",
    ])
    OmegaConf.resolve(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    images = image_inputs_of(model_path, tokenizer, cfg.data, cfg.model.trust_remote_code)
    data = RLDataset(resolve_files(data_files, "train"), tokenizer, cfg.data.max_prompt_length, "filter", True,
                     row_tools, images)
    sampler = PromptSampler(len(data), batch_size, shuffle=True, seed=seed)
    group = InProcessWorkerGroup(SFTWorker, resolve_device(cfg), cfg=cfg, total_steps=steps)
    # a row's target is the same in every epoch: rendered once (a tool conversation's chat template is slow)
    target_of = functools.cache(lambda index: target_ids(data[index], tokenizer, row_tools))
    metrics: dict[str, float] = {}
    try:
        group.init_model(model_path)
        start = time.perf_counter()
        for step in range(1, steps + 1):
            indices = sampler.next_batch()
            batch = sft_batch([data[i] for i in indices], [target_of(i) for i in indices], tokenizer.pad_token_id,
                              max_response_length, images)
            batch.meta["step"] = step
            metrics = group.update_sft(batch)[0]
            if step % log_every == 0 or step == steps:
                spent = time.perf_counter() - start
                print(f"[sft step {step}/{steps}] nll={metrics['sft/nll']:.4f} lr={metrics['lr']:.2e} "
                      f"({spent:.0f}s, eta {spent / step * (steps - step):.0f}s)", flush=True)
        group.export_hf(out_dir, model_path)
    finally:
        group.shutdown()
    return metrics


def ensure_embedded_model(name: str = EMBEDDED) -> Path:
    """Return the warm-started embedded model's directory, building it on first use: the tiny model of
    :data:`rlplat.models.embedded.SPEC` (``embedded-moe``: the mixture of experts of
    :data:`~rlplat.models.embedded.MOE_SPEC`; ``embedded-vl``: the vision-language model of
    :data:`~rlplat.models.embedded.VISION_SPEC`), fine-tuned per :func:`~rlplat.models.embedded.warm_start_of`; for
    ``embedded-tools`` and ``embedded-teacher``, the embedded model fine-tuned further per
    :data:`~rlplat.models.embedded.FURTHER`."""
    target = embedded_model_dir(name)
    if (target / "config.json").exists():
        return target
    base = ensure_embedded_model() if name in FURTHER else None
    return _built_once(target, lambda tmp: _build_embedded_model(name, target, base, tmp))


def embedded_model_files(name: str = EMBEDDED) -> Path:
    """A directory with the embedded model ``name``'s config and tokenizer, for what needs no trained weights
    (the plan): the built model's when it exists, else its random initialisation (built in about a second and
    kept beside it), so that planning never runs the warm start."""
    target = embedded_model_dir(name)
    if (target / "config.json").exists():
        return target
    seed = warm_start_of(name)["seed"]
    return _built_once(target.parent / f"{target.name}-init", lambda tmp: build_tiny_model(tmp / "init", spec_of(name),
                                                                                          seed=seed))


def _built_once(target: Path, build: Callable[[Path], Path]) -> Path:
    """``target``, built by ``build`` (given a temporary directory beside it, returning what it built there) unless
    it holds a model already; a second process waits for the first's build under a file lock, and a build that
    fails leaves nothing at ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
                shutil.move(str(build(Path(tmp))), str(target))
    return target


def _build_embedded_model(name: str, target: Path, base: Path | None, tmp: Path) -> Path:
    """Build ``name`` in ``tmp``, so that any process builds the same model. The dense models' warm starts come out
    bit-identical at 1 and 2 threads (measured on a 2-core AMD EPYC), so they compute with the caller's threads (a
    test worker's share of the cores). The mixture of experts' does not (its routers' top-k turns the last bit into
    other experts): it computes with the threads its warm start names (:data:`~rlplat.models.embedded.MOE_WARM_START`),
    whatever the caller computes with or the machine has."""
    threads, fixed = torch.get_num_threads(), warm_start_of(name).get("threads")
    if fixed:
        torch.set_num_threads(fixed)
    try:
        return _warm_start(name, target, base, tmp)
    finally:
        torch.set_num_threads(threads)


def _warm_start(name: str, target: Path, base: Path | None, tmp: Path) -> Path:
    warm = FURTHER[name] if base else warm_start_of(name)
    print(f"[embedded] building {name} (once, cached; {warm['steps']} supervised steps, their progress below; "
          f"ahead of a run: python -m rlplat.tools.embedded {name}) -> {target}", flush=True)
    out = tmp / "sft"
    if name == EMBEDDED_TOOLS:
        rows = with_tool_demonstrations(TASKS.get("tool_arithmetic")(warm["rows"], warm["seed"]),
                                        warm["demonstrations"], warm["seed"])
        data = write_parquet(rows, tmp / "tool_demonstrations.parquet")
        run_sft(str(base), [str(data)], str(out), warm["steps"], warm["batch_size"], warm["lr"],
                micro_batch_size=warm["batch_size"], max_response_length=warm["max_response_length"],
                seed=warm["seed"])
    else:  # from its random initialisation, or from the embedded model (the teacher): supervised steps on its task
        start = base if base is not None else build_tiny_model(tmp / "init", spec_of(name), seed=warm["seed"])
        run_sft(str(start), [warm["data"]], str(out), warm["steps"], warm["batch_size"], warm["lr"],
                micro_batch_size=warm["batch_size"], seed=warm["seed"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="HF model directory or hub id to start from")
    parser.add_argument("--data", nargs="+", required=True, help="parquet files or builtin:<task>")
    parser.add_argument("--out", required=True, help="output directory (Hugging Face format)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per optimizer step")
    parser.add_argument("--micro-batch-size", type=int, default=64, help="sequences per forward/backward")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-response-length", type=int, default=16, help="tokens, incl. EOS")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run_sft(args.model, args.data, args.out, args.steps, args.batch_size, args.lr, args.micro_batch_size,
            args.max_response_length, args.seed)
    print(f"rlplat sft: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
