"""The actor update's throughput and model FLOPs utilisation (MFU), and the weight gather of a colocated sync.

    python benchmarks/mfu.py                                          # a GPU: Qwen2.5-0.5B's shape, every engine
    python benchmarks/mfu.py --size tiny --device cpu --strategies fsdp   # a dry run on CPU (what CI runs)
    python benchmarks/mfu.py --strategies fsdp --micro-batch 16 --set actor.fsdp.pack_sequences=false --profile
    python benchmarks/mfu.py --strategies fsdp fsdp-eager fsdp-fused fsdp-compile-chunked fsdp-liger --micro-batch 8 32

**The model**: Qwen2.5-0.5B's architecture from its published config (hidden 896, 24 layers, 14 query / 2
key-value heads, MLP 4864, vocabulary 151,936, tied embeddings; 494M parameters) with random weights, built
here (the GPU machine has no hub access) and saved in Hugging Face format, so the engine loads it as a run
does. ``--size tiny`` is a 2-layer model for dry runs.

**The update**: ``ActorRolloutRefWorker.update_actor`` in-process (world size 1, rlplat's GPU defaults:
fp32 weights and AdamW, bf16 compute) on a synthetic GRPO batch of fixed-length sequences: random prompt
and response tokens, one advantage per sequence from N(0, 1), π_old given (so no log-prob pass), no KL;
one optimizer step per update, in micro-batches of ``--micro-batch`` sequences (default: rlplat's own, which
for these 32 sequences is all of them in one; Megatron's 8 at 0.5B: without TransformerEngine its attention
keeps every layer's ``[heads, T, T]`` scores and its output layer computes logits at every position, 54 GiB
at 8 sequences, so 32 would not fit an 80 GB GPU). The first ``--warmup``
updates are left out; the table gives the median of the rest.

**Model FLOPs** per update: the arithmetic the update needs (attention counted over the causal half;
activation recomputation not counted, so it lowers MFU rather than raising it):

    6 · (N − V·h) · T  +  6 · V·h · R  +  3 · Σ_sequences 4 · L · h · n (n + 1) / 2

N = every parameter (the tied embedding / output layer once); T = tokens in the update; R = the response
tokens, the only positions whose output-layer logits the loss needs (V vocabulary rows of hidden size h);
n = a sequence's length; L layers; the 3 is the forward pass and the backward pass's two. The output layer
is counted at the response positions only: the FSDP engine computes logits only there, and an engine that
computes them at every position (Megatron's) does work the update does not need, which shows as lower MFU.
(The usual 6 · N · T would charge the output layer at the 512 prompt positions too, ~13% more FLOPs at
this shape.) **MFU** = model FLOPs / median update seconds / peak, the peak
being the best of this machine's own square matmuls in the compute dtype (bf16 8192³ on a GPU, fp32
2048³ on CPU), measured in the same run.

**Weight gather**: ``export_weights(bfloat16, rollout.weight_sync_bucket_mb)`` drained on the device
(what a colocated sync hands the rollout engine; no disk, no copy to the host), median of 3, seconds.

**Where the time goes** (``--profile``): one more update under ``torch.profiler``, then the operators with the
most device time (self time: a kernel counts once, under the operator that launched it) and the device's
busy time against the update's wall time: a busy share well under 100% means the host does not launch
work fast enough (launch overhead, synchronisations), one near 100% points at the kernels themselves.

**Strategies** (default the first three): ``fsdp`` (rlplat's defaults: on a GPU the fused output-layer
head and compiled decoder layers), ``megatron`` (fp32 weights, bf16 compute) and ``megatron-bf16``
(``actor.megatron.params_dtype=bf16``: bf16 weights, fp32 gradients, fp32 master copies and moments in the
optimizer); and the FSDP variants ``fsdp-eager`` (the chunked head in eager torch, eager layers),
``fsdp-fused`` (the fused head, eager layers), ``fsdp-compile-chunked`` (compiled layers, the chunked head),
``fsdp-liger`` (compiled layers, liger-kernel's head; a GPU). ``--micro-batch 8 16 32`` sweeps the
micro-batch: a row per strategy and value. Beside peak memory, the table gives the training state the engine holds between updates:
weights, their master copies and AdamW's moments (GiB).

The last line is ``MFU_JSON {...}`` with every figure (scripts/gpu_check.sh collects it).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

STRATEGIES = {"fsdp": [], "megatron": ["actor=megatron"],  # --strategies: the overrides of each
              "megatron-bf16": ["actor=megatron", "actor.megatron.params_dtype=bf16"],
              # the FSDP engine's output-layer heads and compiled decoder layers (rlplat.engines.token_head);
              # "fsdp" is rlplat's defaults: on a GPU the fused head and compiled layers
              "fsdp-eager": ["actor.fsdp.token_head=chunked", "actor.fsdp.compile=false"],
              "fsdp-fused": ["actor.fsdp.token_head=fused", "actor.fsdp.compile=false"],
              "fsdp-compile-chunked": ["actor.fsdp.token_head=chunked", "actor.fsdp.compile=true"],
              "fsdp-liger": ["actor.fsdp.token_head=liger", "actor.fsdp.compile=true"]}
DEFAULT_STRATEGIES = ["fsdp", "megatron", "megatron-bf16"]
SIZES = {
    "0.5b": {"config": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                            num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                            rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
             "prompts": 8, "n": 4, "prompt_len": 512, "response_len": 512,
             "micro": {"megatron": 8, "megatron-bf16": 8}},
    "tiny": {"config": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, vocab_size=512, max_position_embeddings=256,
                            tie_word_embeddings=True),
             "prompts": 4, "n": 2, "prompt_len": 16, "response_len": 16},
}


def build_model(out: Path, config: dict) -> int:
    """A random Qwen2 of ``config`` with rlplat's tiny tokenizer (its ids fit any vocabulary), saved to
    ``out``; returns the parameter count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlplat.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                         bos_token_id=tokenizer.bos_token_id, **config))
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)  # half the disk; loaded as fp32
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def synthetic_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0):
    """Fixed-length sequences with random tokens and what update_actor reads."""
    from rlplat.protocol import Batch
    from rlplat.sequence import position_ids_from_mask

    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(8, vocab, (rows, prompt_len), generator=gen)
    responses = torch.randint(8, vocab, (rows, response_len), generator=gen)
    input_ids = torch.cat([prompts, responses], dim=1)
    mask = torch.ones_like(input_ids)
    return Batch.from_dict({
        "prompts": prompts, "responses": responses, "input_ids": input_ids, "attention_mask": mask,
        "position_ids": position_ids_from_mask(mask), "response_mask": torch.ones_like(responses),
        # a random model's log-prob of any token is about -log(vocab): the ratio starts near 1
        "old_log_probs": torch.full((rows, response_len), -float(torch.log(torch.tensor(float(vocab))))),
        "advantages": torch.randn(rows, 1, generator=gen).expand(rows, response_len).contiguous(),
    }, meta={"temperature": 1.0})


def model_flops(params: int, config: dict, rows: int, prompt_len: int, response_len: int) -> float:
    """The module docstring's count for one update of ``rows`` sequences of ``prompt_len + response_len``."""
    length, head = prompt_len + response_len, config["vocab_size"] * config["hidden_size"]
    attention = 4 * config["num_hidden_layers"] * config["hidden_size"] * length * (length + 1) / 2
    return 6 * (params - head) * rows * length + 6 * head * rows * response_len + 3 * rows * attention


def matmul_peak(device: str) -> tuple[float, str]:
    """The best FLOP/s of square matmuls in the compute dtype on ``device``, and that dtype."""
    dtype, n, reps = (torch.bfloat16, 8192, 20) if device == "cuda" else (torch.float32, 2048, 3)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = 0.0
    for _ in range(3):
        sync(device)
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync(device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - start))
    return best, str(dtype).removeprefix("torch.")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile_update(group, batch, device: str, rows: int = 25) -> dict:
    """One update under torch.profiler: prints the operators with the most self device time (CPU time on
    CPU) and returns the update's wall seconds and the device's busy seconds (None on CPU)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        group.update_actor(batch)
        sync(device)
        wall = time.perf_counter() - start
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70), flush=True)
    busy = None
    if device == "cuda":  # the union of the kernels' intervals (kernels of two streams may overlap)
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type != torch.autograd.DeviceType.CPU)
        busy, end = 0.0, float("-inf")
        for lo, hi in spans:
            busy += max(0.0, hi - max(lo, end))
            end = max(end, hi)
        busy /= 1e6
        print(f"[profile] update {wall:.3f} s wall, device busy {busy:.3f} s ({busy / wall:.0%}), "
              f"{len(spans)} kernels", flush=True)
    return {"profile_wall_s": wall, "profile_busy_s": busy}


def measure(strategy: str, size: str, device: str, model_dir: Path, params: int, steps: int, warmup: int,
            out_dir: Path, micro: int | None = None, extra: tuple[str, ...] = (), profile: bool = False) -> dict:
    from rlplat.controller import InProcessWorkerGroup
    from rlplat.trainer.run import load_run_config
    from rlplat.workers.roles import ActorRolloutRefWorker

    w = SIZES[size]
    rows = w["prompts"] * w["n"]
    micro = micro or w.get("micro", {}).get(strategy)
    overrides = [
        f"model.path={model_dir}", "algorithm=grpo", "algorithm.use_kl_loss=false", f"rollout.n={w['n']}",
        f"data.train_batch_size_prompts={w['prompts']}", f"actor.mini_batch_size_prompts={w['prompts']}",
        *([f"actor.micro_batch_size_seqs_per_worker={micro}"] if micro else []),
        f"data.max_prompt_length={w['prompt_len']}",
        f"data.max_response_length={w['response_len']}", "actor.ppo_epochs=1", "actor.shuffle=false",
        "actor.optim.warmup_steps=0", f"trainer.total_steps={steps}", f"trainer.device={device}",
        "trainer.ray_address=inprocess", f"trainer.output_dir={out_dir}",
        *STRATEGIES[strategy], *extra,
    ]
    cfg, plan = load_run_config(overrides)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device=device, cfg=cfg, plan=plan)
    try:
        group.init_model(str(model_dir), with_ref=False)
        batch = synthetic_batch(rows, w["prompt_len"], w["response_len"], w["config"]["vocab_size"])
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds = []
        for _ in range(steps):
            sync(device)
            start = time.perf_counter()
            (metrics,) = group.update_actor(batch)  # one rank's
            sync(device)
            seconds.append(time.perf_counter() - start)
        profiled = profile_update(group, batch, device) if profile else {}
        if not all(torch.isfinite(torch.tensor(v)) for v in metrics.values()):
            raise RuntimeError(f"{strategy}: a metric of the last update is not finite: {metrics}")
        peak_mem = (torch.cuda.max_memory_allocated() / 2**30 if device == "cuda"
                    else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
        state = training_state_gib(group.worker.actor)
        bucket = cfg.rollout.weight_sync_bucket_mb * 2**20
        gather = []
        for _ in range(3):
            sync(device)
            start = time.perf_counter()
            for _pieces in group.worker.actor.export_weights(torch.bfloat16, bucket):
                pass
            sync(device)
            gather.append(time.perf_counter() - start)
    finally:
        group.shutdown()
    update_s = statistics.median(seconds[warmup:])
    length = w["prompt_len"] + w["response_len"]
    flops = model_flops(params, w["config"], rows, w["prompt_len"], w["response_len"])
    return {"strategy": strategy, "size": size, "device": device, "params": params, "rows": rows,
            "tokens": rows * length,
            "micro_batch": cfg.actor.micro_batch_size_seqs_per_worker, "update_s": update_s, "update_s_all": seconds,
            "tokens_per_s": rows * length / update_s, "model_tflops_per_update": flops / 1e12,
            "achieved_tflops": flops / update_s / 1e12, "peak_memory_gib": peak_mem,
            "gather_bf16_s": statistics.median(gather), "pg_loss": metrics.get("actor/pg_loss"), **state,
            "overrides": list(extra), **profiled}


def training_state_gib(engine) -> dict[str, float]:
    """The engine's weights, fp32 master copies (bf16 weights only) and AdamW moments on this device, GiB."""
    gib = lambda tensors: sum(t.numel() * t.element_size() for t in tensors) / 2**30  # noqa: E731
    optim = engine.optim
    moments = [t for s in optim.local_state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
    return {"weights_gib": gib(p.to_local() if hasattr(p, "to_local") else p for p in engine.model.parameters()),
            "masters_gib": gib(optim.masters.values()) if optim.masters else 0.0,
            "moments_gib": gib(t.to_local() if hasattr(t, "to_local") else t for t in moments)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), default=DEFAULT_STRATEGIES)
    parser.add_argument("--steps", type=int, default=6, help="updates per strategy, warm-up included")
    parser.add_argument("--warmup", type=int, default=2, help="first updates left out of the median")
    parser.add_argument("--micro-batch", type=int, nargs="+", default=[None],
                        help="sequences per micro-batch, one row per value and strategy (default: rlplat's, the "
                             "whole mini-batch up to 128)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every strategy's run (repeatable)")
    parser.add_argument("--profile", action="store_true",
                        help="one more update under torch.profiler: the top operators and the device's busy share")
    args = parser.parse_args()
    from rlplat.utils.quiet import quiet_third_party

    quiet_third_party(verbose=False)  # no loading bars
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible (use --device cpu for a dry run)")
    peak, dtype = matmul_peak(args.device)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlplat-mfu-") as tmp:
        model_dir = Path(tmp) / "model"
        params = build_model(model_dir, SIZES[args.size]["config"])
        for strategy in args.strategies:
            for micro in args.micro_batch:
                row = measure(strategy, args.size, args.device, model_dir, params, args.steps, args.warmup,
                              Path(tmp) / f"out-{strategy}-{micro}", micro, tuple(args.set), args.profile)
                row["mfu"] = row["achieved_tflops"] * 1e12 / peak
                rows.append(row)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"\n{name}, torch {torch.__version__}; peak {peak / 1e12:.1f} TFLOP/s ({dtype} matmuls); "
          f"{args.size}: {params / 1e6:.0f}M parameters{'; ' + ' '.join(args.set) if args.set else ''}")
    print(f"{'strategy':<18} {'seqs x tokens':>13} {'micro':>5} {'update s':>9} {'tokens/s':>9} {'TFLOP/s':>8} "
          f"{'MFU':>6} {'peak mem GiB':>12} {'weights/masters/moments GiB':>27} {'gather bf16 s':>13}")
    for r in rows:
        state = f"{r['weights_gib']:.3f} / {r['masters_gib']:.3f} / {r['moments_gib']:.3f}"
        print(f"{r['strategy']:<18} {r['rows']:>5} x {r['tokens'] // r['rows']:<5} {r['micro_batch']:>5} "
              f"{r['update_s']:>9.3f} {r['tokens_per_s']:>9.0f} {r['achieved_tflops']:>8.1f} {r['mfu']:>6.1%} "
              f"{r['peak_memory_gib']:>12.2f} {state:>27} {r['gather_bf16_s']:>13.3f}")
    print("MFU_JSON " + json.dumps({"device": name, "torch": torch.__version__, "peak_tflops": peak / 1e12,
                                    "peak_dtype": dtype, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
