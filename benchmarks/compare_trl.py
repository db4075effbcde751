"""rlplat vs TRL's GRPOTrainer on identical GRPO workloads, side by side; prints a table and a roofline.

    bash scripts/setup_bench.sh                                   # once: .venv-bench (rlplat + trl==1.16.0)
    .venv-bench/bin/python benchmarks/compare_trl.py              # 3 sizes x 2 length modes x 3 frameworks, 2 repeats
    .venv-bench/bin/python benchmarks/compare_trl.py --sizes small --steps 3 --repeats 1
    .venv-bench/bin/python benchmarks/compare_trl.py --sizes 25m --lengths fixed --frameworks rlplat-inprocess trl
    .venv-bench/bin/python benchmarks/compare_trl.py --sizes mid 25m --lengths fixed --frameworks rlplat-inprocess trl \
        --task countdown --prompts 8 --samples 4 --response-tokens 128 --micro-batch all   # long prompts too

Workloads: a randomly initialised Qwen2 built locally (rlplat.models.tiny, seed 0, tied embeddings, the
104-token character tokenizer and its chat template); prompts are rlplat's arithmetic task served in file
order, so both frameworks see the same prompts at every step; the reward is ``contains_answer`` below
(1.0 when the response contains the ground truth) in both.

    size   params   model                                        step
    small  0.32M    hidden 128, 2 layers, 4 heads / 2 kv, ffn 256    8 prompts x 8 samples x 16 tokens
    mid    3.6M     hidden 256, 4 layers, 4 heads / 2 kv, ffn 896    8 prompts x 8 samples x 48 tokens
    25m    25.3M    hidden 512, 8 layers, 8 heads / 4 kv, ffn 1536   8 prompts x 4 samples x 128 tokens

Workload options replace a size's step for every size run: ``--task`` (the built-in task whose prompts
are served, train and validation: ``arithmetic``, 7-9 prompt tokens with the chat template, or ``countdown``,
97-101), ``--prompts``, ``--samples`` (per prompt), ``--response-tokens`` (the limit) and ``--micro-batch``
(sequences per forward/backward: ``all``, the default, or a divisor of the step's sequences; rlplat
``actor.micro_batch_size_seqs_per_worker``, TRL ``per_device_train_batch_size`` with as many gradient
accumulation steps as make one step, ``steps_per_generation`` the same, so one generate() call still
samples the whole step).

Length modes: ``variable`` (a response ends at EOS) and ``fixed`` (EOS is sampled like any other token
and does not end the response, so every response has the maximum length: rlplat ``rollout.ignore_eos``;
TRL ``generation_kwargs={"eos_token_id": None}`` plus the trainer's ``eos_token_ids`` set to an id that
never occurs, which turns off TRL's cut of each completion after its first EOS). Frameworks: ``rlplat-ray``
(a local Ray cluster, one worker), ``rlplat-inprocess`` (``trainer.ray_address=inprocess``) and ``trl``.

Same settings on both sides: one AdamW update per batch (lr 1e-5 constant, no warmup, no weight decay,
grad-norm clip 1.0), the whole batch in one forward/backward and one generate() call, PPO clip 0.2 with a
per-sequence token mean (rlplat's grpo preset; TRL ``loss_type="grpo"``), group-normalised advantages,
no KL and no reference model, float32, temperature 1, top-p 1, no top-k, no gradient checkpointing,
2 torch threads (OMP_NUM_THREADS=2, which Ray passes on to its worker), TRL on its transformers
generate() path (no vLLM) with logging, saving and evaluation off. Neither framework runs a separate
old-log-prob forward here: with one update per batch both reuse the training forward's log-probs.

Each run is a fresh process (``--one``); repeats alternate the order (A B C, C B A, A B C, ...). A run's
numbers are medians over its steps after the first ``--warmup``; a row is the median over repeats.
Stage times, rlplat: its ``timing/*_s`` metrics (metrics.jsonl; ``generate`` includes the weight sync,
``logprob`` = old log-probs + reference); TRL: timers around GRPOTrainer's ``_generate`` (tokenize,
generate, decode), ``_calculate_rewards`` and ``_get_per_token_logps_and_entropies`` outside autograd,
the step from a callback's on_step_begin to on_step_end, ``update`` = step - ``_generate_and_score_completions``
(forward, backward, clip, AdamW). ``other`` is the rest of the step (advantages, padding, batching).
Decoding the responses to text counts in TRL's generate and in rlplat's score (its reward stage decodes).
Tokens/s counts prompt + response tokens (no padding) per step second; gen tok/s the sampled tokens per
step second. Start-up: process start to the first step (rlplat: less its validation of one prompt before
step 1; its validations, before step 1 and after the last, are outside every timing). Nothing is saved:
TRL save_strategy="no"; rlplat always checkpoints (and exports) after its last step, so its runs use a
PPOTrainer subclass whose save_checkpoint does nothing (run()'s trainer_cls), and skip the end-of-run report.
Memory: peak RSS summed over the run's whole process tree (Ray's gcs/raylet/dashboard/worker processes and
rlplat's reward worker processes included), sampled every 0.2 s by this parent process; also PSS (shared
pages split between processes, every 1 s), which counts a multi-process run's shared libraries once, not
once per process. The JSON has each run's RSS by process at the peak (``procs_at_peak``). The largest
single process's peak (``peak_proc_rss_mb``) is the kernel's high-water mark (``VmHWM`` in
``/proc/<pid>/status``, read at every sample, and the run's own ``getrusage`` maximum when it ends), so it
misses no peak between samples. Run it on a quiet
machine: with 2 threads on 2 cores any other load stretches steps many times over (and unevenly).
``--stage-memory`` (in-process runs) also gives the run's own peak RSS by stage (generation, log-probs, the
update's forward pass, the rest of the update, the optimizer step, all else) and the bytes the update's
forward pass saves for the backward pass (:class:`StageMemory`); it resets the kernel's high-water mark
at every stage boundary, so the parent's own memory readings of that process are only a lower bound.
``--rlplat-overrides`` appends config overrides to the rlplat runs (e.g. reward.isolation=inprocess).

Roofline: the fp32 matmul rate of this machine (1024^2 and 2048^2 matmuls, 2 threads, best of 10) against
the FLOPs each stage must do. N_body = the decoder layers' matmul weights (q, k, v, o, gate, up, down;
norms and biases ignored), N_head = vocab x hidden (the tied lm_head still is a matmul; the embedding
lookup is free). With P prompt and R response tokens per sequence (means over the step), L = P + R:
attention is 4 x hidden x layers FLOPs per (query, key) pair, causal, so attn(n) = 4 h l n(n+1)/2;
generate = 2 N_body (L - 1) + 2 N_head R + attn(L - 1) per sequence (prefill, then one forward per
sampled token but the last, logits only where a token is sampled); a log-prob forward = 2 N_body L +
2 N_head R + attn(L); an update = 3 forwards (backward = 2 forwards). The AdamW step is not counted.
Achieved fraction = (FLOPs / peak rate) / measured seconds, per stage and per step.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

SIZES = {
    "small": {"spec": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=256), "prompts": 8, "n": 8, "tokens": 16},
    "mid": {"spec": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=896), "prompts": 8, "n": 8, "tokens": 48},  # 896: 3.6M parameters
    "25m": {"spec": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                         intermediate_size=1536, max_position_embeddings=512), "prompts": 8, "n": 4, "tokens": 128},
}
LENGTHS = ("variable", "fixed")
PROMPT_TASKS = ("arithmetic", "countdown")
FRAMEWORKS = ("rlplat-ray", "rlplat-inprocess", "trl")
LR = 1e-5
THREADS = 2
STAGES = ("generate", "score", "logprob", "update", "other")
CHILD_ENV = {  # nothing in a run may reach the network
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
    "WANDB_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS), "PYTHONUNBUFFERED": "1",
}


def contains_answer(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """The reward of both frameworks (rlplat loads it from this file: reward.custom_fn.name=contains_answer)."""
    return 1.0 if str(ground_truth) in solution_str else 0.0


def trl_reward(completions, ground_truth, **kwargs) -> list[float]:
    """``contains_answer`` with TRL's reward-function signature (conversational completions)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [contains_answer("", text, truth) for text, truth in zip(texts, ground_truth)]


# ---------------------------------------------------------------- one run (a child process)
def summarize(per_step: list[dict], startup_s: float, seqs: int, threads: int) -> dict:
    """A run's medians over its measured steps."""
    med = {key: statistics.median(s[key] for s in per_step) for key in per_step[0]}
    return {"steps": len(per_step), "seqs": seqs, "step_s": med["step_s"], **{f"{k}_s": med[k] for k in STAGES},
            "weight_sync_s": med.get("weight_sync", 0.0), "completions_per_s": seqs / med["step_s"],
            "tokens_per_s": (med["prompt_tokens"] + med["gen_tokens"]) / med["step_s"],
            "gen_tokens_per_s": med["gen_tokens"] / med["step_s"], "prompt_len": med["prompt_tokens"] / seqs,
            "response_len": med["gen_tokens"] / seqs, "startup_s": startup_s, "torch_threads": threads,
            # TRL only: EOS tokens inside the kept completions (fixed mode: sampled and kept like any token)
            **({"eos_per_response": med["eos_tokens"] / seqs} if "eos_tokens" in med else {})}


class StageMemory:
    """Peak RSS of this process by stage, exactly: the kernel's high-water mark (``VmHWM``) is reset
    (``/proc/self/clear_refs``) whenever a stage begins or ends, and read before each reset, so each
    stage's peak counts only its own time, nested stages included (the innermost stage owns the time).
    Also the bytes the update's forward pass saves for the backward pass (``saved_tensors_hooks``, each
    storage counted once), the largest over the micro-batches."""

    def __init__(self):
        self.peaks: dict[str, float] = defaultdict(float)
        self.stack = ["other"]  # what no stage covers, start-up included
        self.saved_mb = 0.0
        self._close_segment()

    @staticmethod
    def _reset() -> None:
        Path("/proc/self/clear_refs").write_text("5")

    def _close_segment(self) -> None:
        self.peaks[self.stack[-1]] = max(self.peaks[self.stack[-1]], _high_water_mb(os.getpid()))
        self._reset()

    def wrap(self, owner, method: str, stage: str, when=None, saved: bool = False) -> None:
        """Count ``owner.method``'s time as ``stage`` (when ``when(args, kwargs)`` holds, for its call's
        arguments); ``saved``: also measure what its autograd graph saves."""
        inner = getattr(owner, method)

        @functools.wraps(inner)  # keeps what decorators attached (rlplat's worker-method registration)
        def measured(*args, **kwargs):
            if when is not None and not when(args, kwargs):
                return inner(*args, **kwargs)
            self._close_segment()
            self.stack.append(stage)
            try:
                if not saved:
                    return inner(*args, **kwargs)
                with self._saved_bytes():
                    return inner(*args, **kwargs)
            finally:
                self._close_segment()
                self.stack.pop()

        setattr(owner, method, measured)

    def _saved_bytes(self):
        import torch

        storages: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        class Context:
            def __enter__(ctx):
                ctx.hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
                ctx.hooks.__enter__()

            def __exit__(ctx, *exc):
                ctx.hooks.__exit__(*exc)
                self.saved_mb = max(self.saved_mb, sum(storages.values()) / 2**20)

        return Context()

    def result(self) -> dict:
        self._close_segment()
        return {"stage_peak_mb": dict(self.peaks), "saved_for_backward_mb": self.saved_mb}


def run_rlplat(framework: str, size: str, length: str, w: dict, workdir: Path, steps: int, warmup: int, t0: float,
               extra: list[str], memory: StageMemory | None) -> dict:
    import torch

    from rlplat.trainer.ppo import PPOTrainer
    from rlplat.trainer.run import load_run_config, run

    class NoSaveTrainer(PPOTrainer):
        def save_checkpoint(self) -> None:  # rlplat always saves (and exports) after the last step; TRL saves nothing
            pass

    try:
        import rlplat.utils.report as report

        report.write_report_after_run = lambda *args, **kwargs: None  # the end-of-run plots: not part of the workload
    except ImportError:
        pass

    if memory is not None:  # in-process only: the Ray workers' stages run in other processes
        from rlplat.engines.fsdp import FSDPEngine
        from rlplat.workers.roles import ActorRolloutRefWorker

        memory.wrap(ActorRolloutRefWorker, "generate_sequences", "generate")
        memory.wrap(ActorRolloutRefWorker, "compute_log_probs", "logprob")
        memory.wrap(ActorRolloutRefWorker, "update_actor", "update")
        memory.wrap(FSDPEngine, "forward", "update_forward", when=lambda args, kwargs: kwargs.get("grad"), saved=True)
        memory.wrap(torch.optim.AdamW, "step", "optimizer")
    seqs = w["seqs"]
    out = workdir / f"out-{framework}-{size}-{length}-{os.getpid()}"
    overrides = [
        f"model.path={workdir / f'model-{size}'}", "algorithm=grpo", "algorithm.use_kl_loss=false",
        f"data.train_files={workdir / f'train-{size}.parquet'}", f"data.val_files={workdir / 'val.parquet'}",
        "data.shuffle=false", f"data.train_batch_size_prompts={w['prompts']}",
        f"actor.mini_batch_size_prompts={w['prompts']}",
        f"rollout.n={w['n']}", f"data.max_response_length={w['tokens']}", "actor.ppo_epochs=1",
        f"actor.micro_batch_size_seqs_per_worker={w['micro']}",
        f"actor.log_prob_micro_batch_size_seqs_per_worker={w['micro']}",
        f"rollout.hf.batch_size_seqs_per_worker={seqs}", f"actor.optim.lr={LR}", "actor.optim.lr_schedule=constant",
        "actor.optim.warmup_steps=0", "actor.optim.weight_decay=0.0", "actor.optim.grad_clip=1.0",
        "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.top_k=-1",
        f"reward.custom_fn.path={Path(__file__).resolve()}", "reward.custom_fn.name=contains_answer",
        f"trainer.total_steps={steps}", "trainer.test_freq=-1", "trainer.save_freq=-1", "rollout.val_n=1",
        "data.val_batch_size_prompts=1", f"trainer.output_dir={out}", "trainer.logger=[jsonl]", "trainer.progress=off",
        *(["trainer.ray_address=inprocess"] if framework == "rlplat-inprocess" else []),
        *(["rollout.ignore_eos=true"] if length == "fixed" else []), *extra,
    ]
    cfg, plan = load_run_config(overrides)
    run(cfg, plan, trainer_cls=NoSaveTrainer)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    step_rows = [r for r in rows if "timing/step_s" in r]
    initial_val_s = next((r.get("timing/validate_s", 0.0) for r in rows if r["step"] == 0), 0.0)
    # a step's row is logged right after the step (validation comes after the last step only)
    startup_s = step_rows[0]["time"] - step_rows[0]["timing/step_s"] - t0 - initial_val_s
    per_step = []
    for r in step_rows[warmup:]:
        tokens = r["perf/tokens_per_s"] * r["timing/step_s"]  # attention_mask.sum(): prompt + response, no padding
        gen = r["response_length/mean"] * seqs
        score = r.get("timing/reward_s", r.get("timing/reward_start_s", 0.0) + r.get("timing/reward_wait_s", 0.0))
        stages = {"generate": r["timing/generate_s"], "score": score,
                  "logprob": r.get("timing/old_log_probs_s", 0.0) + r.get("timing/reference_s", 0.0),
                  "update": r["timing/update_actor_s"]}
        per_step.append({"step_s": r["timing/step_s"], **stages, "other": r["timing/step_s"] - sum(stages.values()),
                         "weight_sync": r.get("timing/weight_sync_s", 0.0), "prompt_tokens": tokens - gen,
                         "gen_tokens": gen})
    return summarize(per_step, startup_s, seqs, torch.get_num_threads())


class TRLStageTimers:
    """Timers wrapped around one GRPOTrainer instance's methods; ``step_begin``/``step_end`` close a step."""

    def __init__(self, trainer):
        import torch

        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict] = []
        self.first_step_wall: float | None = None
        self.eos_id = trainer.processing_class.eos_token_id
        self._wrap(trainer, "_generate", "generate", count_tokens=True)
        self._wrap(trainer, "_calculate_rewards", "score")
        self._wrap(trainer, "_get_per_token_logps_and_entropies", "logprob", when=lambda: not torch.is_grad_enabled())
        self._wrap(trainer, "_generate_and_score_completions", "experience")

    def _wrap(self, trainer, method: str, key: str, when=None, count_tokens: bool = False) -> None:
        inner = getattr(trainer, method)

        def timed(*args, **kwargs):
            if when is not None and not when():
                return inner(*args, **kwargs)
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            self.current[key] += time.perf_counter() - start
            if count_tokens:  # _generate returns (prompt_ids, completion_ids, ...) as lists of id lists
                self.current["prompt_tokens"] += sum(len(ids) for ids in out[0])
                self.current["gen_tokens"] += sum(len(ids) for ids in out[1])
                self.current["eos_tokens"] += sum(ids.count(self.eos_id) for ids in out[1])
            return out

        setattr(trainer, method, timed)  # an instance attribute shadows the class's method

    def step_begin(self) -> None:
        if self.first_step_wall is None:
            self.first_step_wall = time.time()
        self.current = defaultdict(float, start=time.perf_counter())

    def step_end(self) -> None:
        c = self.current
        step = time.perf_counter() - c["start"]
        rest = c["experience"] - c["generate"] - c["score"] - c["logprob"]
        self.steps.append({"step_s": step, "generate": c["generate"], "score": c["score"], "logprob": c["logprob"],
                           "update": step - c["experience"], "other": rest, "prompt_tokens": c["prompt_tokens"],
                           "gen_tokens": c["gen_tokens"], "eos_tokens": c["eos_tokens"]})


def run_trl(size: str, length: str, w: dict, workdir: Path, steps: int, warmup: int, t0: float,
            memory: StageMemory | None) -> dict:
    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    seqs, accumulate = w["seqs"], w["seqs"] // w["micro"]
    rows = pq.read_table(workdir / f"train-{size}.parquet").to_pylist()
    data = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows])
    fixed = length == "fixed"
    args = GRPOConfig(
        output_dir=str(workdir / f"trl-{size}-{length}-{os.getpid()}"), max_steps=steps, seed=42,
        # one generation batch = one optimizer step = its micro-batches' forward/backward passes
        per_device_train_batch_size=w["micro"], gradient_accumulation_steps=accumulate,
        steps_per_generation=accumulate, num_iterations=1,
        num_generations=w["n"], max_completion_length=w["tokens"], shuffle_dataset=False,
        beta=0.0, loss_type="grpo", epsilon=0.2, scale_rewards="group",
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch",
        temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        generation_kwargs={"eos_token_id": None} if fixed else None,
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, use_vllm=False,
        model_init_kwargs={"dtype": torch.float32},
        report_to="none", save_strategy="no", eval_strategy="no", logging_strategy="no", disable_tqdm=True,
        log_completions=False, dataloader_num_workers=0, remove_unused_columns=False,
    )
    trainer = GRPOTrainer(model=str(workdir / f"model-{size}"), reward_funcs=trl_reward, args=args,
                          train_dataset=data)
    if fixed:
        trainer.eos_token_ids = [-1]  # no completion is cut after an EOS (no token id is -1)
    timers = TRLStageTimers(trainer)
    if memory is not None:
        memory.wrap(trainer, "_generate", "generate")
        memory.wrap(trainer, "_get_per_token_logps_and_entropies", "logprob",
                    when=lambda args, kwargs: not torch.is_grad_enabled())
        memory.wrap(trainer, "training_step", "update")
        memory.wrap(trainer, "compute_loss", "update_forward", saved=True)
        memory.wrap(torch.optim.AdamW, "step", "optimizer")

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            timers.step_begin()

        def on_step_end(self, args, state, control, **kwargs):
            timers.step_end()

    trainer.add_callback(StepTimes())
    trainer.train()
    shutil.rmtree(args.output_dir, ignore_errors=True)
    return summarize(timers.steps[warmup:], timers.first_step_wall - t0, seqs, torch.get_num_threads())


def run_one(framework: str, size: str, length: str, w: dict, workdir: Path, steps: int, warmup: int,
            extra: list[str], stage_memory: bool = False) -> dict:
    import resource

    import torch

    torch.set_num_threads(THREADS)
    t0 = float(os.environ["RLPLAT_BENCH_T0"])
    memory = StageMemory() if stage_memory else None
    if framework == "trl":
        result = run_trl(size, length, w, workdir, steps, warmup, t0, memory)
    else:
        result = run_rlplat(framework, size, length, w, workdir, steps, warmup, t0, extra, memory)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    if memory is not None:  # its resets lower the kernel's maximum: the stages' peaks hold the run's
        result.update(memory.result())
        peak = max(peak, *result["stage_peak_mb"].values())
    return {**result, "self_max_rss_mb": peak}


# ---------------------------------------------------------------- the parent: memory, runs, tables
class TreeMonitor(threading.Thread):
    """Peak RSS (every 0.2 s) and PSS (every 1 s) summed over a process and all its descendants, each
    process's own high-water mark (``hwm``: pid -> (label, MB)), and the CPU seconds they used (each
    process's last reading)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.done = pid, threading.Event()
        self.peak_rss = self.peak_pss = 0
        self.procs_at_peak: dict[str, float] = {}  # RSS MB by process label at the peak
        self.cpu_s: dict[int, float] = {}
        self.hwm: dict[int, tuple[str, float]] = {}

    def run(self) -> None:
        import psutil

        root, tick = psutil.Process(self.pid), 0
        while not self.done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            rss = pss = 0
            names: dict[str, float] = Counter()  # label -> RSS MB
            for proc in procs:
                try:
                    proc_rss = proc.memory_info().rss
                    rss += proc_rss
                    if tick % 5 == 0:
                        pss += proc.memory_full_info().pss
                    times = proc.cpu_times()
                    self.cpu_s[proc.pid] = times.user + times.system
                    names[_label(proc)] += proc_rss / 2**20
                    self.hwm[proc.pid] = (_label(proc), max(_high_water_mb(proc.pid), proc_rss / 2**20,
                                                             self.hwm.get(proc.pid, ('', 0.0))[1]))
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    pass
            if rss > self.peak_rss:
                self.peak_rss, self.procs_at_peak = rss, {k: round(v, 1) for k, v in names.items()}
            self.peak_pss = max(self.peak_pss, pss)
            tick += 1
            self.done.wait(0.2)


def _high_water_mb(pid: int) -> float:
    """The kernel's peak RSS of a process so far (``VmHWM``), MB; 0 where it cannot be read."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0.0
    return int(line.split()[1]) / 1024  # kB


def _label(proc) -> str:
    """A process's name; for a Python process, what it runs (a script's name or a ``-c`` import)."""
    name = proc.name()
    if not name.startswith("python"):
        return name
    args = proc.cmdline()[1:]
    if "-c" in args[:-1]:
        found = re.search(r"from ([\w.]+) import", args[args.index("-c") + 1])  # multiprocessing.spawn, ...
        return "python -c " + (found.group(1) if found else "...")
    script = next((a for a in args if not a.startswith("-")), "")
    return f"python {Path(script).name}" if script else name


def launch(framework: str, size: str, length: str, workdir: Path, args) -> dict:
    """One run in a fresh process, its process tree watched; the child's result plus memory and CPU."""
    log = workdir / f"log-{framework}-{size}-{length}-{time.time_ns()}.txt"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", framework, size, length, "--workdir", str(workdir),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--task", args.task,
           *(["--stage-memory"] if args.stage_memory else []),
           *[f"--{key}={value}" for key, value in workload_options(args).items()],
           "--rlplat-overrides", *args.rlplat_overrides]
    start = time.time()
    env = {**os.environ, **CHILD_ENV, "RLPLAT_BENCH_T0": repr(start)}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        monitor = TreeMonitor(proc.pid)
        monitor.start()
        code = proc.wait()
        monitor.done.set()
        monitor.join()
    wall = time.time() - start
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    base = {"framework": framework, "size": size, "length": length, "wall_s": wall}
    if code != 0 or not lines:
        print(f"[compare_trl] {framework}/{size}/{length} failed (exit {code}):\n{text[-3000:]}", file=sys.stderr)
        return {**base, "error": f"exit {code}"}
    result = json.loads(lines[-1][len("RESULT "):])
    label, proc_peak = max(monitor.hwm.values(), key=lambda item: item[1], default=("", 0.0))
    if result["self_max_rss_mb"] >= proc_peak:  # the run's own process, to its last page
        label, proc_peak = "run", result["self_max_rss_mb"]
    return {**base, **result, "peak_rss_mb": monitor.peak_rss / 2**20, "peak_proc_rss_mb": proc_peak,
            "peak_proc": label, "peak_pss_mb": monitor.peak_pss / 2**20, "procs_at_peak": monitor.procs_at_peak,
            "cpu_cores_mean": sum(monitor.cpu_s.values()) / wall}


def prepare(args, workdir: Path) -> None:
    """Models (one per size) and prompt files, built once and shared by every run."""
    from rlplat.data import TASKS, write_parquet
    from rlplat.models.tiny import TinyModelSpec, build_tiny_model

    task = TASKS.get(args.task)
    write_parquet(task(1, seed=1, split="test"), workdir / "val.parquet")
    for size in args.sizes:
        build_tiny_model(workdir / f"model-{size}", TinyModelSpec(**SIZES[size]["spec"]), seed=0)
        rows = task(workload(size, args)["prompts"] * (args.steps + 1), seed=0, split="train")
        write_parquet(rows, workdir / f"train-{size}.parquet")


def workload_options(args) -> dict[str, str]:
    """The workload options given on the command line (those a run's process must see too)."""
    given = {"prompts": args.prompts, "samples": args.samples, "response-tokens": args.response_tokens,
             "micro-batch": args.micro_batch}
    return {key: str(value) for key, value in given.items() if value is not None}


def workload(size: str, args) -> dict:
    """The step run at ``size``: its defaults (``SIZES``) with the workload options in their place."""
    w = SIZES[size]
    prompts, n = args.prompts or w["prompts"], args.samples or w["n"]
    seqs = prompts * n
    micro = seqs if args.micro_batch in (None, "all") else int(args.micro_batch)
    if seqs % micro:
        raise SystemExit(f"--micro-batch {micro} does not divide the step's {seqs} sequences")
    return {"task": args.task, "prompts": prompts, "n": n, "tokens": args.response_tokens or w["tokens"],
            "seqs": seqs, "micro": micro}


def cpu_name() -> str:
    """The CPU's model name and the vector instructions torch uses (the matmul peak depends on both)."""
    import torch

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        name = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name} ({torch.backends.cpu.get_cpu_capability()})"


def rlplat_has_ignore_eos() -> bool:
    from dataclasses import fields

    from rlplat.config.schema import RolloutConfig

    return "ignore_eos" in {f.name for f in fields(RolloutConfig)}


def matmul_gflops() -> dict[int, float]:
    """fp32 matmul rate (GFLOP/s) of n x n products for n = 1024, 2048: THREADS threads, best of 10 each."""
    import torch

    torch.set_num_threads(THREADS)
    rates = {}
    for n in (1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(10):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        rates[n] = 2 * n**3 / best / 1e9
    return rates


def step_flops(size: str, seqs: int, vocab: int, prompt_len: float, response_len: float) -> dict[str, float]:
    """FLOPs per step by stage (module docstring: the counting)."""
    s = SIZES[size]["spec"]
    h, layers = s["hidden_size"], s["num_hidden_layers"]
    kv = s["num_key_value_heads"] * h // s["num_attention_heads"]
    body = layers * (2 * h * h + 2 * h * kv + 3 * h * s["intermediate_size"])
    head = vocab * h
    length, r = prompt_len + response_len, response_len

    def attn(n: float) -> float:
        return 4 * h * layers * n * (n + 1) / 2

    forward = seqs * (2 * body * length + 2 * head * r + attn(length))
    generate = seqs * (2 * body * (length - 1) + 2 * head * r + attn(length - 1))
    return {"generate": generate, "forward": forward, "update": 3 * forward}


def median_rows(runs: list[dict]) -> list[dict]:
    """One row per (size, length, framework): the median of every number over the repeats."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["size"], r["length"], r["framework"])].append(r)
    rows = []
    for (size, length, framework), group in groups.items():
        ok = [r for r in group if "error" not in r]
        row = {"size": size, "length": length, "framework": framework, "repeats": len(ok),
               "errors": len(group) - len(ok), "runs": group}
        if ok:
            for key, value in ok[0].items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    row[key] = statistics.median(r[key] for r in ok)
            if "stage_peak_mb" in ok[0]:
                row["stage_peak_mb"] = {stage: statistics.median(r["stage_peak_mb"].get(stage, 0.0) for r in ok)
                                        for stage in ok[0]["stage_peak_mb"]}
        rows.append(row)
    return rows


def add_roofline(rows: list[dict], peak_gflops: float, vocab: int) -> None:
    for row in rows:
        if not row["repeats"]:
            continue
        f = step_flops(row["size"], row["seqs"], vocab, row["prompt_len"], row["response_len"])
        logprob = f["forward"] if row["logprob_s"] > 0 else 0.0
        total = f["generate"] + logprob + f["update"]
        ideal = {"generate": f["generate"], "logprob": logprob, "update": f["update"], "step": total}
        row["gflop_per_step"] = {k: v / 1e9 for k, v in ideal.items()}
        row["peak_fraction"] = {k: (v / (peak_gflops * 1e9)) / row[f"{k}_s"] if row[f"{k}_s"] > 0 and v else None
                                for k, v in ideal.items()}


def ratios(rows: list[dict]) -> list[dict]:
    by_key = {(r["size"], r["length"], r["framework"]): r for r in rows if r["repeats"]}
    out = []
    for (size, length, framework), row in by_key.items():
        trl = by_key.get((size, length, "trl"))
        if framework == "trl" or trl is None:
            continue
        out.append({"size": size, "length": length, "framework": framework,
                    "speed": row["completions_per_s"] / trl["completions_per_s"],
                    "rss": row["peak_rss_mb"] / trl["peak_rss_mb"], "pss": row["peak_pss_mb"] / trl["peak_pss_mb"],
                    "proc_rss": row["peak_proc_rss_mb"] / trl["peak_proc_rss_mb"]})
    return out


def print_tables(rows: list[dict], rats: list[dict], peak_gflops: float) -> None:
    print("memory: peak RSS summed over each run's whole process tree (driver, Ray gcs/raylet/workers, reward "
          "workers); PSS splits shared pages; proc MB: the largest single process's peak RSS")
    print(f"{'size':<6} {'length':<8} {'framework':<16} {'steps':>5} {'s/step':>7} {'compl/s':>8} {'tok/s':>7} "
          f"{'gen tok/s':>9} {'resp len':>8} {'gen s':>7} {'score s':>7} {'logp s':>6} {'update s':>8} {'other s':>7} "
          f"{'start s':>7} {'RSS MB':>7} {'PSS MB':>7} {'proc MB':>7}")
    for r in rows:
        head = f"{r['size']:<6} {r['length']:<8} {r['framework']:<16}"
        if not r["repeats"]:
            print(f"{head} failed ({r['errors']} runs)")
            continue
        print(f"{head} {r['steps']:>5.0f} {r['step_s']:>7.3f} {r['completions_per_s']:>8.1f} {r['tokens_per_s']:>7.0f} "
              f"{r['gen_tokens_per_s']:>9.0f} {r['response_len']:>8.1f} {r['generate_s']:>7.3f} {r['score_s']:>7.3f} "
              f"{r['logprob_s']:>6.3f} {r['update_s']:>8.3f} {r['other_s']:>7.3f} {r['startup_s']:>7.1f} "
              f"{r['peak_rss_mb']:>7.0f} {r['peak_pss_mb']:>7.0f} {r['peak_proc_rss_mb']:>7.0f}")
    if rats:
        print("\nrlplat / TRL: speed = completions/s ratio (> 1: rlplat faster); memory = peak summed RSS, PSS, "
              "largest process's RSS ratio (< 1: rlplat smaller)")
        print(f"{'size':<6} {'length':<8} {'framework':<16} {'speed':>6} {'RSS':>6} {'PSS':>6} {'proc':>6}")
        for q in rats:
            print(f"{q['size']:<6} {q['length']:<8} {q['framework']:<16} {q['speed']:>6.2f} {q['rss']:>6.2f} "
                  f"{q['pss']:>6.2f} {q['proc_rss']:>6.2f}")
    staged = [r for r in rows if r["repeats"] and "stage_peak_mb" in r]
    if staged:
        names = ("generate", "logprob", "update_forward", "update", "optimizer", "other")
        print("\npeak RSS of the run's own process by stage, MB (update_forward: the update's forward pass, update: "
              "the rest of it but the optimizer step; other: start-up and all else); saved MB: what the update's "
              "forward pass saves for the backward pass")
        print(f"{'size':<6} {'length':<8} {'framework':<16} " + " ".join(f"{n:>14}" for n in names) + f" {'saved MB':>8}")
        for r in staged:
            peaks = r["stage_peak_mb"]
            print(f"{r['size']:<6} {r['length']:<8} {r['framework']:<16} "
                  + " ".join(f"{peaks.get(n, 0.0):>14.0f}" for n in names) + f" {r['saved_for_backward_mb']:>8.0f}")
    print(f"\nroofline: fp32 matmul peak {peak_gflops:.1f} GFLOP/s ({THREADS} threads); GFLOP per step and the "
          f"fraction of the peak achieved (counting: module docstring)")
    print(f"{'size':<6} {'length':<8} {'framework':<16} {'gen GF':>7} {'upd GF':>7} {'step GF':>7} {'gen %':>6} "
          f"{'upd %':>6} {'step %':>6}")
    for r in rows:
        if not r["repeats"]:
            continue
        g, p = r["gflop_per_step"], r["peak_fraction"]

        def pct(key: str) -> str:
            return f"{100 * p[key]:>6.1f}" if p[key] is not None else f"{'-':>6}"

        print(f"{r['size']:<6} {r['length']:<8} {r['framework']:<16} {g['generate']:>7.2f} {g['update']:>7.2f} "
              f"{g['step']:>7.2f} {pct('generate')} {pct('update')} {pct('step')}")


def run_matrix(args, workdir: Path, with_trl: bool, rlplat_fixed: bool) -> list[dict]:
    """Every (size, length, framework) run, ``--repeats`` times, the framework order reversed every other repeat."""
    runs = []
    for size in args.sizes:
        for length in args.lengths:
            frameworks = [f for f in args.frameworks
                          if (f != "trl" or with_trl) and (f == "trl" or length != "fixed" or rlplat_fixed)]
            for repeat in range(args.repeats):
                for framework in frameworks if repeat % 2 == 0 else frameworks[::-1]:
                    print(f"[compare_trl] {size} {length} {framework} (repeat {repeat + 1}/{args.repeats})", flush=True)
                    result = launch(framework, size, length, workdir, args)
                    runs.append({**result, "repeat": repeat})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--lengths", nargs="+", default=list(LENGTHS), choices=LENGTHS)
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--repeats", type=int, default=2, help="runs per row, in alternating order (median shown)")
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="first steps of each run left out of its medians")
    parser.add_argument("--task", default="arithmetic", choices=PROMPT_TASKS, help="the prompts (module docstring)")
    parser.add_argument("--prompts", type=int, help="prompts per step (default: the size's)")
    parser.add_argument("--samples", type=int, help="responses per prompt (default: the size's)")
    parser.add_argument("--response-tokens", type=int, help="response length limit (default: the size's)")
    parser.add_argument("--micro-batch", help="sequences per forward/backward: all (default) or a divisor of the step")
    parser.add_argument("--stage-memory", action="store_true",
                        help="also measure each stage's peak RSS and the update's saved tensors (in-process runs)")
    parser.add_argument("--rlplat-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra rlplat config overrides for the rlplat runs (e.g. reward.isolation=inprocess)")
    parser.add_argument("--one", nargs=3, metavar=("FRAMEWORK", "SIZE", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    ray_run = args.one[0] == "rlplat-ray" if args.one else "rlplat-ray" in args.frameworks  # --one: a run's child
    if args.stage_memory and ray_run:
        parser.error("--stage-memory measures the run's own process: in Ray mode the stages run in the workers; "
                     "leave rlplat-ray out of --frameworks")
    if args.one:
        framework, size, length = args.one
        result = run_one(framework, size, length, workload(size, args), args.workdir, args.steps, args.warmup,
                         args.rlplat_overrides, args.stage_memory)
        print("RESULT " + json.dumps(result), flush=True)
        return

    import torch
    import transformers

    try:
        import trl

        trl_version = trl.__version__
    except ImportError:
        trl_version = None
    skipped = []
    if "trl" in args.frameworks and trl_version is None:
        skipped.append("trl: not installed in this environment (bash scripts/setup_bench.sh)")
    has_ignore_eos = rlplat_has_ignore_eos()
    if "fixed" in args.lengths and not has_ignore_eos:
        skipped.append("rlplat fixed-length rows: this rlplat has no rollout.ignore_eos")
    for note in skipped:
        print(f"[compare_trl] skipping {note}", flush=True)
    rates = matmul_gflops()
    peak = max(rates.values())
    with tempfile.TemporaryDirectory(prefix="compare_trl-") as tmp:
        workdir = Path(tmp)
        prepare(args, workdir)
        from transformers import AutoTokenizer

        vocab = len(AutoTokenizer.from_pretrained(workdir / f"model-{args.sizes[0]}"))
        runs = run_matrix(args, workdir, with_trl=trl_version is not None, rlplat_fixed=has_ignore_eos)
    rows = median_rows(runs)
    add_roofline(rows, peak, vocab)
    rats = ratios(rows)
    print(f"\nmachine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, trl {trl_version}, {THREADS} threads; {args.steps} steps per run "
          f"(first {args.warmup} dropped), medians over steps then over {args.repeats} repeats")
    for size in args.sizes:
        w = workload(size, args)
        print(f"workload {size}: {w['task']} prompts, {w['prompts']} x {w['n']} sequences, {w['tokens']} response "
              f"tokens at most, micro-batches of {w['micro']}")
    print_tables(rows, rats, peak)
    print(json.dumps({
        "settings": {**vars(args), "workdir": None, "lr": LR, "threads": THREADS,
                     "sizes_spec": {s: SIZES[s] for s in args.sizes},
                     "workloads": {s: workload(s, args) for s in args.sizes}},
        "cpu": cpu_name(), "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                        "trl": trl_version},
        "matmul_gflops": rates, "matmul_peak_gflops": peak, "skipped": skipped, "rows": rows, "ratios": rats,
    }))


if __name__ == "__main__":
    main()
