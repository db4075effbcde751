"""The value conversions the tables name (:attr:`Knob.convert`): one function each, turning a setting of theirs
into rlplat's overrides, reading the other settings of the same command where the units depend on them.

Each function takes the knob, the value as given (a string, or a list for an open-instruct flag with several values)
and the command's settings (:class:`Theirs`), and returns ``key=value`` overrides. What cannot be converted from the
command alone (a hub dataset, a Python reward function, a file's row count that is not on this machine) raises
:class:`ByHand` with what to give instead. ``python -m rlplat.tools.migrate`` applies them.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlplat.config.migration.knob import Knob


class ByHand(Exception):
    """A setting the command alone cannot convert: the message says what to give instead; ``overrides``, what can
    be given already (a file name to write the data to)."""

    def __init__(self, message: str, overrides: list[str] | None = None):
        super().__init__(message)
        self.overrides = overrides or []


@dataclass
class Theirs:
    """One command's settings as given (``name -> value``: verl's dotted keys, TRL's fields, open-instruct's
    ``--flags``) and the system they belong to, for conversions whose units depend on other settings."""

    framework: str
    values: dict[str, object]

    def get(self, *names: str, default: object = None) -> object:
        """The first of ``names`` that the command sets, else ``default`` (their system's default)."""
        for name in names:
            if name in self.values:
                return self.values[name]
        return default

    def number(self, *names: str, default: float) -> float:
        value = self.get(*names, default=default)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ByHand(f"{names[0]}={value!r} is not a number") from None


def literal(value: object) -> object:
    """A command-line string as the Python value it spells (``'True'`` -> True, ``'1e-6'`` -> 1e-06, ``'null'``
    and ``'None'`` -> None); other strings, ``'none'`` among them, stay strings."""
    if not isinstance(value, str):
        return value
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "~") or value == "None":  # Hydra's null, Python's None; "none" is a word (a mode)
        return None
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def hydra_value(value: object) -> str:
    """``value`` as a Hydra override writes it (true, null, [a,b], 1e-06)."""
    value = literal(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    return repr(value) if isinstance(value, float) else str(value)


def _key(knob: Knob, index: int = 0) -> str:
    return knob.ours[index].split("=", 1)[0]


def _whole(number: float, what: str) -> int:
    if number <= 0 or abs(number - round(number)) > 1e-9:
        raise ByHand(f"{what} comes to {number:g}, not a whole number: give it by hand")
    return round(number)


# --- verl -------------------------------------------------------------------------------------------------------

def _verl_devices(theirs: Theirs) -> float:
    return theirs.number("trainer.n_gpus_per_node", default=8) * theirs.number("trainer.nnodes", default=1)


def _verl_optimizer_steps_per_step(theirs: Theirs) -> float:
    prompts = theirs.number("data.train_batch_size", default=1024)
    mini = theirs.number("actor_rollout_ref.actor.ppo_mini_batch_size", default=256)
    return prompts / mini * theirs.number("actor_rollout_ref.actor.ppo_epochs", default=1)


def global_to_per_worker(knob, value, theirs):
    per_worker = literal(value) / _verl_devices(theirs)
    return [f"{_key(knob)}={max(1, math.floor(per_worker))}"]


def all_linear_to_empty_list(knob, value, theirs):
    return [f"{_key(knob)}=[]" if literal(value) in ("all-linear", "all_linear", None) else
            f"{_key(knob)}={hydra_value(value)}"]


def training_steps_to_optimizer_steps(knob, value, theirs):
    steps = literal(value)
    if steps is None or steps <= 0:
        return [f"{_key(knob)}=0"]
    return [f"{_key(knob)}={round(steps * _verl_optimizer_steps_per_step(theirs))}"]


def min_lr_to_ratio(knob, value, theirs):
    lr = theirs.number("actor_rollout_ref.actor.optim.lr", "learning_rate", default=1e-6)
    return [f"{_key(knob)}={hydra_value(literal(value) / lr)}"]


def top_k_off_to_minus_one(knob, value, theirs):
    top_k = literal(value)
    return [f"{_key(knob)}={-1 if top_k in (0, None) else top_k}"]


def null_to_zero(knob, value, theirs):
    return [f"{_key(knob)}={literal(value) or 0}"]


def _training_rows(theirs: Theirs) -> int:
    files = theirs.get("data.train_files", "train_dataset")
    files = literal(files)
    paths = [Path(str(path)).expanduser() for path in (files if isinstance(files, list) else [files])]
    missing = [str(path) for path in paths if not path.is_file()]
    if files is None or missing:
        raise ByHand(f"steps = epochs x (training rows // prompts per step); the training file(s) "
                     f"{', '.join(missing) or '(none given)'} are not on this machine to count their rows")
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(path).metadata.num_rows for path in paths)


def epochs_to_steps(knob, value, theirs):
    if theirs.framework == "verl":
        prompts = theirs.number("data.train_batch_size", default=1024)
    else:
        prompts = _trl_prompts_per_generation(theirs)
    rows = _training_rows(theirs)
    return [f"{_key(knob)}={max(1, int(literal(value) * (rows // prompts)))}"]


def warmup_ratio_to_steps(knob, value, theirs):
    ratio = literal(value)
    if theirs.framework == "verl":
        total = theirs.get("trainer.total_training_steps")
        if total is None:
            raise ByHand("give actor.optim.warmup_steps = ratio x the run's optimizer steps (trainer.total_steps x "
                         "mini-batches per step x ppo epochs)")
        optimizer_steps = literal(total) * _verl_optimizer_steps_per_step(theirs)
    elif theirs.framework == "TRL":
        optimizer_steps = theirs.number("max_steps", default=-1)
        if optimizer_steps <= 0:
            raise ByHand("give actor.optim.warmup_steps = warmup_ratio x the run's optimizer steps")
    else:
        steps = float(_episodes_to_steps(theirs.number("--total_episodes", default=100000), theirs))
        optimizer_steps = steps * theirs.number("--num_mini_batches", default=1) * theirs.number("--num_epochs",
                                                                                                 default=1)
    return [f"{_key(knob)}={round(ratio * optimizer_steps)}"]


# --- TRL --------------------------------------------------------------------------------------------------------

def _trl_processes(theirs: Theirs) -> float:
    return theirs.number("num_processes", default=1)


def _trl_prompts_per_optimizer_step(theirs: Theirs) -> float:
    completions = (theirs.number("per_device_train_batch_size", default=8) * _trl_processes(theirs)
                   * theirs.number("gradient_accumulation_steps", default=1))
    return completions / theirs.number("num_generations", default=8)


def _trl_prompts_per_generation(theirs: Theirs) -> float:
    if "generation_batch_size" in theirs.values:
        return theirs.number("generation_batch_size", default=0) / theirs.number("num_generations", default=8)
    accumulation = theirs.number("gradient_accumulation_steps", default=1)
    per_generation = theirs.number("steps_per_generation", default=accumulation) / accumulation
    return _trl_prompts_per_optimizer_step(theirs) * per_generation


def _trl_batches(knob, value, theirs):
    """The mini-batch and the step's prompts from TRL's batch fields together (each of its batch knobs gives both)."""
    mini = _whole(_trl_prompts_per_optimizer_step(theirs), "prompts per optimizer step (per_device_train_batch_size"
                  " x processes x gradient_accumulation_steps / num_generations)")
    step = _whole(_trl_prompts_per_generation(theirs), "prompts per generation")
    return [f"actor.mini_batch_size_prompts={mini}", f"data.train_batch_size_prompts={step}"]


def optimizer_steps_to_training_steps(knob, value, theirs):
    accumulation = theirs.number("gradient_accumulation_steps", default=1)
    per_step = (theirs.number("steps_per_generation", default=accumulation) / accumulation
                * theirs.number("num_iterations", default=1))
    steps = literal(value)
    return [f"{_key(knob)}={steps if steps is None or steps <= 0 else max(1, round(steps / per_step))}"]


def per_device_completions_to_global_prompts(knob, value, theirs):
    completions = literal(value) * _trl_processes(theirs)
    generations = theirs.number("num_generations_eval", "num_generations", default=8)
    return [f"{_key(knob)}={max(1, math.floor(completions / generations))}"]


def betas(knob, value, theirs):
    first = theirs.number("adam_beta1", default=0.9)
    second = theirs.number("adam_beta2", default=0.999)
    return [f"actor.optim.betas=[{hydra_value(first)},{hydra_value(second)}]"]


def lora_config_fields(knob, value, theirs):
    fields = literal(value)
    if not isinstance(fields, dict):
        raise ByHand("give model.lora.rank, model.lora.alpha and model.lora.target_modules from the LoraConfig")
    overrides = [f"model.lora.rank={fields.get('r', 8)}", f"model.lora.alpha={fields.get('lora_alpha', 8)}"]
    if "target_modules" in fields:
        overrides += all_linear_to_empty_list(Knob(("x",), ("model.lora.target_modules",), ""),
                                              fields["target_modules"], theirs)
    return overrides


def dataset_to_parquet(knob, value, theirs):
    path = literal(value)
    if isinstance(path, str) and path.endswith(".parquet"):
        return [f"{_key(knob)}={path}"]
    raise ByHand(f"write the dataset as parquet rows in the RLHF schema (docs/migrating.md, From TRL) and give "
                 f"{_key(knob)}=<file>.parquet")


def plus_one(knob, value, theirs):
    rounds = literal(value)
    if rounds is None:
        raise ByHand(f"{knob.names[0]}=None (no limit) has no equivalent: give {_key(knob)}")
    return [f"{_key(knob)}={rounds + 1}"]


def host_port_to_url(knob, value, theirs):
    """The server's URL from its host and port (and, for vllm_mode=server, the server mode itself)."""
    host = theirs.get("vllm_server_host", default="0.0.0.0")
    port = theirs.get("vllm_server_port", default=8000)
    url = theirs.get("vllm_server_base_url", default=f"http://{host}:{port}")
    return [entry for entry in knob.ours if "=" in entry] + [f"rollout.server.url={url}"]


def init_kwargs(knob, value, theirs):
    kwargs = literal(value)
    if not isinstance(kwargs, dict):
        raise ByHand(knob.hint())
    names = {"attn_implementation": "model.attn_implementation", "trust_remote_code": "model.trust_remote_code"}
    return [f"{names[key]}={hydra_value(item)}" for key, item in kwargs.items() if key in names]


def processes_to_workers(knob, value, theirs):
    machines = theirs.number("num_machines", default=1)
    return [f"trainer.workers_per_node={_whole(literal(value) / machines, 'processes per machine')}",
            f"trainer.nnodes={int(machines)}"]


def cispo_cap_minus_one(knob, value, theirs):
    cap = theirs.get("epsilon_high")
    overrides = ["algorithm=cispo"]
    return overrides + ([f"algorithm.clip_ratio_high={hydra_value(literal(cap) - 1)}"] if cap is not None else [])


def batch_reward_fn_to_compute_score(knob, value, theirs):
    raise ByHand("pass the reward functions to rlplat.trainer.GRPOTrainer(reward_funcs=[...]) as they are "
                 "(docs/python_api.md), or register them by name in a module trainer.imports loads and list the names "
                 "in reward.functions")


# --- open-instruct ----------------------------------------------------------------------------------------------

def _episodes_to_steps(episodes: float, theirs: Theirs) -> int:
    per_step = (theirs.number("--num_unique_prompts_rollout", default=16)
                * theirs.number("--num_samples_per_prompt_rollout", default=4))
    return max(1, math.floor(episodes / per_step))


def tool_call_limits(knob, value, theirs):
    overrides = []
    if "--max_tool_calls" in theirs.values:
        overrides.append(f"rollout.agent.max_tool_calls={theirs.get('--max_tool_calls')}")
    if "--max_steps" in theirs.values:
        overrides.append(f"rollout.agent.max_turns={int(theirs.number('--max_steps', default=0)) + 1}")
    return overrides


def episodes_to_steps(knob, value, theirs):
    return [f"{_key(knob)}={_episodes_to_steps(literal(value), theirs)}"]


def mini_batches_to_prompts(knob, value, theirs):
    prompts = theirs.number("--num_unique_prompts_rollout", default=16)
    return [f"{_key(knob)}={_whole(prompts / literal(value), 'prompts per mini-batch')}"]


def memory_budget_to_checkpointing(knob, value, theirs):
    return [f"{_key(knob)}={hydra_value(literal(value) < 1.0)}"]


def peft_rank(knob, value, theirs):
    if not literal(theirs.get("--use_peft", default=False)):
        return []
    return [f"{_key(knob)}={int(theirs.number('--lora_r', default=16))}"]


def mixer_list_to_files(knob, value, theirs):
    """Hub ids become parquet files under data/ (written by hand: the message says so); weights carry over."""
    items = value if isinstance(value, list) else str(value).split()
    if len(items) % 2:
        raise ByHand(f"{knob.names[0]} takes pairs of dataset and weight, got {items}")
    pairs = list(zip(items[::2], items[1::2]))
    files = [name if name.endswith(".parquet") else f"data/{name.rsplit('/', 1)[-1]}.parquet" for name, _ in pairs]
    hub = [name for name, _ in pairs if not name.endswith(".parquet")]
    weights = [str(weight) for _, weight in pairs]
    needs = [f"write {', '.join(hub)} as parquet rows in the RLHF schema (the dataset column as data_source, "
             f"ground_truth as reward_model.ground_truth) to {', '.join(files)}"] if hub else []
    if _key(knob) == "data.val_files":  # validation scores every row of its files: no weights
        value = files[0] if len(files) == 1 else "[" + ",".join(files) + "]"
        if any(literal(weight) != 1.0 for weight in weights):
            needs.append(f"rlplat validates on every row: write only the rows the weights {weights} select")
    else:
        value = files[0] if len(files) == 1 and literal(weights[0]) == 1.0 else \
            "[" + ",".join(f"{file},'{weight}'" for file, weight in zip(files, weights)) + "]"
    override = f"{_key(knob)}={value}"
    if needs:
        raise ByHand("; ".join(needs), [override])
    return [override]


def loss_fn_to_policy_loss(knob, value, theirs):
    if value == "cispo":
        return ["algorithm.policy_loss=cispo", "algorithm.clip_ratio_low=1.0"]
    if value == "dapo":
        return ["algorithm.policy_loss=ppo", "algorithm.clip_ratio_c=1e9"]
    raise ByHand(f"--loss_fn {value}: rlplat's policy losses are listed by python -m rlplat.trainer.main --help")


def loss_denominator_to_agg(knob, value, theirs):
    if value == "token":
        return ["algorithm.loss_agg_mode=token-mean"]
    sequences = theirs.number("--num_unique_prompts_rollout", default=16) / theirs.number(
        "--num_mini_batches", default=1) * theirs.number("--num_samples_per_prompt_rollout", default=4)
    return ["algorithm.loss_agg_mode=seq-mean-token-sum-norm",
            f"algorithm.loss_scale_factor={hydra_value(literal(value) / sequences)}"]


def adv_norm_type(knob, value, theirs):
    scales = {"standard": "group", "centered": "none"}
    if value not in scales:
        raise ByHand(f"--advantage_normalization_type {value}: rlplat has group, batch and none "
                     "(algorithm.norm_adv_scale)")
    return [f"{_key(knob)}={scales[value]}"]


def rho_to_off_policy(knob, value, theirs):
    if not literal(theirs.get("--use_rho_correction", default=True)):
        return ["algorithm.off_policy.correction=none"]
    clamp_low = theirs.number("--rho_clamp_lower_bound", default=0)
    clamp_high = theirs.number("--rho_clamp_upper_bound", default=2.0)
    mask_low = theirs.number("--rho_mask_lower_bound", default=0)
    mask_high = theirs.number("--rho_mask_upper_bound", default=0)
    level = "geometric" if literal(theirs.get("--rho_mask_sequence_level", default=False)) else "token"
    masks = mask_low > 0 or mask_high > 0
    if clamp_low > 0 or (masks and clamp_high > 0):
        raise ByHand("a clamp with a lower bound, or clamp and mask together, has no equivalent: rlplat applies one "
                     "correction (algorithm.off_policy.*)")
    if masks:
        return ["algorithm.off_policy.correction=mis", f"algorithm.off_policy.low={hydra_value(mask_low)}",
                f"algorithm.off_policy.high={hydra_value(mask_high or 1e9)}", f"algorithm.off_policy.level={level}"]
    if clamp_high > 0:
        return ["algorithm.off_policy.correction=tis", f"algorithm.off_policy.cap={hydra_value(clamp_high)}"]
    return ["algorithm.off_policy.correction=none"]


def beta_to_kl_loss(knob, value, theirs):
    beta = literal(value)
    return ["algorithm.use_kl_loss=false"] if not beta else [
        "algorithm.use_kl_loss=true", f"algorithm.kl_loss_coef={hydra_value(beta)}"]


def kl_estimator(knob, value, theirs):
    estimators = {0: "k1", 1: "k2", 2: "k3"}
    number = literal(value)
    if number not in estimators:
        raise ByHand(f"--kl_estimator {value} (ratio-weighted k1) has no equivalent: rlplat has k1, k2, k3, "
                     "low_var_kl (algorithm.kl_loss_type)")
    return [f"{_key(knob)}={estimators[number]}"]


def lr_scheduler_name(knob, value, theirs):
    if value in ("linear", "cosine"):
        return [f"actor.optim.lr_schedule={value}", "actor.optim.min_lr_ratio=0.0"]
    if value == "constant":
        return ["actor.optim.lr_schedule=constant", "actor.optim.warmup_steps=0"]
    if value == "constant_with_warmup":
        return ["actor.optim.lr_schedule=constant"]
    raise ByHand(f"--lr_scheduler_type {value} has no equivalent: rlplat has constant, linear and cosine")


def stop_strings_to_token_ids(knob, value, theirs):
    raise ByHand("give rollout.stop_token_ids: each stop string's token id in the model's tokenizer "
                 "(tokenizer.convert_tokens_to_ids); a string of several tokens has no equivalent")


def pass_rate_threshold_to_scoring(knob, value, theirs):
    threshold = literal(value)
    if threshold in (0, 1):
        return [f"{_key(knob)}={'fraction' if threshold == 0 else 'all'}"]
    raise ByHand(f"--code_pass_rate_reward_threshold {value}: only 0 (fraction) and 1.0 (all) have an equivalent")


def learners_per_node(knob, value, theirs):
    counts = [int(literal(count)) for count in (value if isinstance(value, list) else [value])]
    if len(set(counts)) != 1:
        raise ByHand(f"--num_learners_per_node {counts}: unequal nodes have no equivalent (one count per node)")
    sequences = (theirs.number("--num_unique_prompts_rollout", default=16) / theirs.number("--num_mini_batches",
                 default=1) * theirs.number("--num_samples_per_prompt_rollout", default=4))
    workers = counts[0]
    while workers > 1 and (sequences / (workers * len(counts))) % 1:
        workers -= 1
    overrides = [f"trainer.workers_per_node={workers}", f"trainer.nnodes={len(counts)}"]
    if workers != counts[0]:
        raise ByHand(f"rlplat splits each mini-batch's {sequences:g} sequences evenly over the training workers, "
                     f"which {counts[0]} per node do not divide: {workers} per node (give the other devices to "
                     "rollout.workers_per_node)", overrides)
    return overrides


def by_hand(knob, value, theirs):
    """A setting whose rlplat key depends on what the user means (a classifier or a judge, say)."""
    raise ByHand(knob.hint())


def deepspeed_stage(knob, value, theirs):
    return [f"{_key(knob)}={hydra_value(literal(value) == 3)}"]


CONVERSIONS: dict[str, Callable[[Knob, object, Theirs], list[str]]] = {
    "global_to_per_worker": global_to_per_worker, "all_linear_to_empty_list": all_linear_to_empty_list,
    "training_steps_to_optimizer_steps": training_steps_to_optimizer_steps, "min_lr_to_ratio": min_lr_to_ratio,
    "top_k_off_to_minus_one": top_k_off_to_minus_one, "null_to_zero": null_to_zero,
    "epochs_to_steps": epochs_to_steps, "warmup_ratio_to_steps": warmup_ratio_to_steps,
    "accumulation_to_mini_batch_prompts": _trl_batches, "completions_to_prompts": _trl_batches,
    "steps_per_generation_to_mini_batch_prompts": _trl_batches,
    "optimizer_steps_to_training_steps": optimizer_steps_to_training_steps,
    "per_device_completions_to_global_prompts": per_device_completions_to_global_prompts,
    "into_betas_first": betas, "into_betas_second": betas, "lora_config_fields": lora_config_fields,
    "dataset_to_parquet": dataset_to_parquet, "plus_one": plus_one, "host_port_to_url": host_port_to_url,
    "cispo_cap_minus_one": cispo_cap_minus_one, "batch_reward_fn_to_compute_score": batch_reward_fn_to_compute_score,
    "episodes_to_steps": episodes_to_steps, "mini_batches_to_prompts": mini_batches_to_prompts,
    "memory_budget_to_checkpointing": memory_budget_to_checkpointing, "peft_rank": peft_rank,
    "mixer_list_to_files": mixer_list_to_files, "loss_fn_to_policy_loss": loss_fn_to_policy_loss,
    "loss_denominator_to_agg": loss_denominator_to_agg, "adv_norm_type": adv_norm_type,
    "rho_to_off_policy": rho_to_off_policy, "beta_to_kl_loss": beta_to_kl_loss, "kl_estimator": kl_estimator,
    "lr_scheduler_name": lr_scheduler_name, "stop_strings_to_token_ids": stop_strings_to_token_ids,
    "pass_rate_threshold_to_scoring": pass_rate_threshold_to_scoring, "learners_per_node": learners_per_node,
    "deepspeed_stage": deepspeed_stage, "init_kwargs": init_kwargs, "processes_to_workers": processes_to_workers,
    "tool_call_limits": tool_call_limits, "by_hand": by_hand,
}
