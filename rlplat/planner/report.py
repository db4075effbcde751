"""Printing the plan: the run's inputs checked as a run loads them, the prompts' lengths, the batch ledger, each
phase's memory (:mod:`rlplat.planner.memory`), validation's cost and the checkpoints' size on disk."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from rlplat.models.shape import ModelShape
from rlplat.planner.memory import (
    GB, Ledger, checkpoint_bytes, engine_of, fmt, layout, ledger, phases, validation_cost,
)
from rlplat.rollout.agent_loop import prompt_tools


@dataclass(frozen=True)
class PromptLengths:
    split: str
    files: tuple[str, ...]
    lengths: tuple[int, ...]  # tokens per prompt, after the chat template
    first_over: str | None  # "file row N" of the first prompt over data.max_prompt_length

    def over(self, limit: int) -> int:
        return sum(length > limit for length in self.lengths)


def prompt_lengths(cfg: DictConfig, tokenizer, files: tuple[str, ...], split: str, images=None) -> PromptLengths:
    """The prompts' lengths in tokens (``images``: a vision-language model's image inputs, which count each
    image's tokens)."""
    from rlplat.data import resolve_files
    from rlplat.data.dataset import prompt_token_lengths

    resolved = resolve_files(list(files), split)
    rows = prompt_token_lengths(resolved, tokenizer, cfg.data.apply_chat_template, prompt_tools(cfg.rollout.agent),
                                images)
    limit = cfg.data.max_prompt_length
    first = next((where for where, length in rows if length > limit), None)
    return PromptLengths(split, tuple(str(f) for f in resolved), tuple(length for _, length in rows), first)


def check_lengths(cfg: DictConfig, scan: PromptLengths) -> str:
    """What ``data.truncation`` does to the over-long prompts of ``scan``; DataError for ``error``."""
    from rlplat.data import DataError

    limit, mode = cfg.data.max_prompt_length, cfg.data.truncation
    over = scan.over(limit)
    if not over:
        return "none longer than data.max_prompt_length"
    longest = max(scan.lengths)
    if mode == "error":
        raise DataError(f"{over} of {len(scan.lengths)} {scan.split} prompts are longer than data.max_prompt_length="
                        f"{limit} (the longest {longest} tokens; the first: {scan.first_over}); the run would stop "
                        f"there: set data.truncation=filter to drop them (verl's filter_overlong_prompts), "
                        f"left|right to cut them, or data.max_prompt_length={longest}")
    action = {"filter": "dropped", "left": "cut to their last tokens", "right": "cut to their first tokens"}[mode]
    return f"{over} longer than data.max_prompt_length={limit} (longest {longest}): {action} (data.truncation={mode})"



# ---------------------------------------------------------------------------------------------- the report

def _percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def default_device_memory(device: str) -> int:
    """The visible GPU's memory, else 80 GB; on a CPU run, this machine's memory."""
    import os

    import torch

    if device == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return 80 * GB


def missing_packages(cfg: DictConfig, plan) -> list[str]:
    """The chosen engines whose packages are not installed on this machine (planned all the same)."""
    from rlplat.engines import TRAINING_ENGINES
    from rlplat.rollout import ROLLOUT_ENGINES

    chosen = [(TRAINING_ENGINES, cfg.actor.strategy)]
    chosen += [(TRAINING_ENGINES, cfg[role].strategy) for role, used in (("critic", plan.needs_critic),
                                                                        ("ref", plan.needs_ref)) if used]
    if cfg.rollout.mode != "server":
        chosen.append((ROLLOUT_ENGINES, cfg.rollout.name))
    return list(dict.fromkeys(p for registry, name in chosen if (p := registry.missing_requirements(name))))


def colocated_scorers(cfg) -> list[str]:
    """The reward model and judge on the actor's devices, which the memory estimate does not count."""
    reward = cfg.reward
    found = [("the reward model (reward.model.path)", reward.model.path, reward.model.placement),
             ("the judge (reward.judge.model_path)", reward.judge.model_path, reward.judge.placement)]
    return [what for what, path, placement in found if path and placement == "colocated"]


def say(line: str = "") -> None:
    print(line, flush=True)


def report(cfg: DictConfig, plan, device_memory: int, model_path: Callable[[], str],
           teacher_path: Callable[[], str] | None = None) -> bool:
    """Run the checks and print the plan; True when every phase fits ``device_memory``. ``model_path`` checks
    ``model.path`` and gives the model's directory (the embedded model is built then if it is not cached), after
    the rewards were checked; ``teacher_path`` gives ``teacher.model_path``'s (a run that distills). Raises the
    run's own errors (ConfigError, DataError, RewardConfigError, RegistryError, RunError) for what would stop it."""
    shape, tokenizer, images = check_inputs(cfg, plan, model_path)
    scans = report_data(cfg, plan, tokenizer, images)
    kept = {split: len(s.lengths) - (s.over(cfg.data.max_prompt_length) if cfg.data.truncation == "filter" else 0)
            for split, s in scans.items()}
    if not kept["train"]:
        from rlplat.data import DataError

        raise DataError(f"every train prompt is longer than data.max_prompt_length={cfg.data.max_prompt_length} and "
                        f"data.truncation=filter drops them all: raise data.max_prompt_length")
    led = report_ledger(cfg, plan, scans["train"], kept["train"], shape)
    teacher = teacher_shape(cfg, teacher_path(), tokenizer) if plan.needs_teacher else None
    fits = report_memory(shape, cfg, plan, led, device_memory, teacher)
    report_validation_and_disk(shape, cfg, plan, scans["test"], kept["test"])
    say("\nplan: every phase fits" if fits else "\nplan: a phase does not fit the device (see above)")
    return fits


def check_inputs(cfg: DictConfig, plan, model_path: Callable[[], str]) -> tuple[ModelShape, object, object]:
    """Load what the run loads first (imports, reward functions, the model's config, tokenizer and image
    processor) and print the plan's header; returns the model's shape, tokenizer and image inputs (None: a
    text model)."""
    from transformers import AutoConfig

    from rlplat.config.imports import import_user_modules
    from rlplat.models.tokenizer import load_tokenizer
    from rlplat.models.vision import image_inputs_of
    from rlplat.reward import build_reward_manager

    import_user_modules(cfg.trainer.imports)
    build_reward_manager(cfg.reward, cfg.algorithm.overlong_buffer, cfg.data.max_response_length).close()
    path = model_path()
    config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
    shape = ModelShape.from_config(config)
    tokenizer = load_tokenizer(cfg.model, path)
    images = image_inputs_of(path, tokenizer, cfg.data, cfg.model.trust_remote_code)
    rollout = cfg.rollout
    pool = (f" on {rollout.nnodes * rollout.workers_per_node} worker(s) of its own, "
            f"{cfg.trainer.async_steps} step(s) ahead" if rollout.mode == "separate" else "")
    moe = (f" in {shape.experts} experts per layer, top-{shape.top_k}: {shape.active_params / 1e6:.1f}M active per "
           f"token" if shape.experts else "")
    vision = f", {shape.vision_params / 1e6:.1f}M of them its vision encoder" if shape.vision_params else ""
    how = engine_of(cfg, "actor").describe(cfg.actor.get(cfg.actor.strategy), plan.device, shape)
    say(f"rlplat plan: {cfg.algorithm.adv_estimator} on {plan.world_size} worker(s) ({plan.device}), "
        f"actor {cfg.actor.strategy}{f' ({how})' if how else ''}, rollout {rollout.name}{pool}; model {cfg.model.path} "
        f"({shape.params / 1e6:.1f}M parameters{moe}{vision}, {shape.layers} layers, hidden {shape.hidden}, "
        f"vocabulary {shape.vocab})")
    say("config, reward functions and imports: ok")
    for problem in missing_packages(cfg, plan):
        say(f"note: {problem}; the run needs it where it runs")
    return shape, tokenizer, images


def report_data(cfg: DictConfig, plan, tokenizer, images=None) -> dict[str, PromptLengths]:
    """Scan the train and test prompts' lengths and print them; returns the scans by split."""
    say("\ndata (tokens per prompt, after the chat template" + (", images' tokens included)" if images else ")"))
    scans = {}
    for split, files in (("train", plan.train_files), ("test", plan.val_files)):
        scan = prompt_lengths(cfg, tokenizer, files, split, images)
        scans[split] = scan
        lengths = list(scan.lengths)
        say(f"  {split}: {len(lengths)} prompts from {', '.join(scan.files)}; min {min(lengths)}, median "
            f"{int(statistics.median(lengths))}, p99 {_percentile(lengths, 0.99)}, max {max(lengths)}; "
            f"{check_lengths(cfg, scan)}")
    return scans


def report_ledger(cfg: DictConfig, plan, train: PromptLengths, kept: int, shape: ModelShape) -> Ledger:
    """Print the batch ledger of one training step over the ``kept`` train prompts (and, for a mixture of experts,
    the routing the batch carries)."""
    replicas = layout(cfg, "actor", plan.world_size).replicas
    led = ledger(cfg, plan, kept, replicas, min(cfg.data.max_prompt_length, max(train.lengths)))
    say("\nbatch ledger (per training step)")
    say(f"  {led.prompts} prompts x rollout.n={cfg.rollout.n} = {led.sequences} sequences over {led.replicas} "
        f"data-parallel replica(s): {led.sequences_per_replica} per replica")
    say(f"  tokens: at most {led.max_tokens:,} ({led.max_prompt} prompt + {led.max_response} response per sequence: "
        f"the longest prompt, padded to, and a full response); mean prompt {statistics.mean(train.lengths):.0f}")
    say(f"  {led.mini_batches} mini-batch(es) x actor.ppo_epochs={cfg.actor.ppo_epochs} = {led.optimizer_steps} "
        f"optimizer step(s); {led.micro_batches} micro-batch(es) of {led.micro_seqs} sequences "
        f"(at most {led.micro_tokens:,} tokens) per mini-batch and worker")
    say(f"  {led.steps_per_epoch:.1f} steps per epoch of {kept} prompts; trainer.total_steps="
        f"{cfg.trainer.total_steps} = {led.epochs:.2f} epochs")
    fields = ["routed_experts"] * plan.rollout_routing + ["old_routed_experts"] * (cfg.actor.moe.router_replay == "r2")
    if shape.experts and fields:  # int16 per (token, sparse layer, choice)
        per_sequence = len(fields) * led.length * shape.sparse_layers * shape.top_k * 2
        say(f"  routing: {' and '.join(fields)} [sequences, tokens, {shape.sparse_layers} layers, top-{shape.top_k}] "
            f"int16, at most {fmt(per_sequence * led.sequences)} per step, "
            f"{fmt(per_sequence * led.sequences_per_replica)} per replica")
    return led


def teacher_shape(cfg: DictConfig, path: str, tokenizer) -> ModelShape:
    """On-policy distillation's teacher (in the directory ``path``): its shape, once its tokenizer gives the
    student's tokens (``tokenizer``'s) their ids; a RunError otherwise, as at the run's start."""
    from transformers import AutoConfig

    from rlplat.models.tokenizer import check_teacher_tokenizer

    shape = ModelShape.from_config(AutoConfig.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code))
    check_teacher_tokenizer(tokenizer, path, f"teacher.model_path={cfg.teacher.model_path!r}",
                            cfg.model.trust_remote_code)
    say(f"teacher {cfg.teacher.model_path} ({shape.params / 1e6:.1f}M parameters, {shape.layers} layers, "
        f"{cfg.teacher.placement}): tokenizer matches the student's")
    return shape


def report_memory(shape: ModelShape, cfg: DictConfig, plan, led: Ledger, device_memory: int,
                  teacher: ModelShape | None = None) -> bool:
    """Print each phase's memory estimate; True when every phase fits ``device_memory``."""
    say(f"\nmemory per {'device' if plan.device == 'cuda' else 'worker (CPU)'} (estimate, docs/plan.md) against "
        f"{device_memory / GB:.0f} GB")
    fits = True
    for phase in phases(shape, cfg, plan, led, device_memory, teacher):
        over = phase.total > device_memory
        fits &= not over
        say(f"  {phase.name}: {fmt(phase.total)}{'  DOES NOT FIT: ' + phase.knob if over else ''}")
        for name, nbytes in phase.parts.items():
            if nbytes:
                say(f"    {name:<52} {fmt(nbytes):>12}")
    if uncounted := colocated_scorers(cfg):
        say(f"  not counted: {' and '.join(uncounted)}, placed on these devices too (colocated)")
    return fits


def report_validation_and_disk(shape: ModelShape, cfg: DictConfig, plan, test: PromptLengths, kept: int) -> None:
    """Print what validation costs (over the ``kept`` test prompts) and what checkpoints take on disk."""
    val = validation_cost(cfg, kept, min(cfg.data.max_prompt_length, max(test.lengths)) + plan.response_length)
    say(f"\nvalidation: {val['prompts']} prompts x rollout.val_n={cfg.rollout.val_n} = {val['responses']} responses "
        f"in {val['calls']} call(s) of data.val_batch_size_prompts={cfg.data.val_batch_size_prompts}, "
        f"{val['validations']} time(s) (trainer.test_freq={cfg.trainer.test_freq}): at most {val['tokens']:,} "
        f"tokens each, at rollout.val_temperature={cfg.rollout.val_temperature:g}")
    disk = checkpoint_bytes(shape, cfg, plan)
    keep = cfg.trainer.max_checkpoints
    kept_bytes = f": {fmt(disk['checkpoint'] * keep)}" if keep > 0 else ""
    say(f"disk: {fmt(disk['checkpoint'])} per checkpoint (trainer.max_checkpoints={keep} kept{kept_bytes}), "
        f"{fmt(disk['hf_export'])} for hf_export")


def planned_device(overrides: list[str]) -> str | None:
    """``cuda`` when the overrides name ``trainer.device=cuda`` (a GPU run planned anywhere), else None (the
    run's own resolution)."""
    return "cuda" if "trainer.device=cuda" in overrides else None
