"""LoRA against full fine-tuning on the FSDP engine: trainable parameters, optimizer state, peak memory and step time.

    python benchmarks/lora.py                       # a ~25M-parameter Qwen2 shape, full vs LoRA rank 8 and 16
    python benchmarks/lora.py --ranks 8 --steps 5 --seqs 4 --length 128     # a quicker look

Each setting trains in a fresh process (one worker, float32 on CPU, the engine's own update: packed
micro-batches, the token head, the gated MLP): ``--steps`` optimizer steps on ``--seqs`` random sequences of
``--length`` tokens (half prompt, half response) after one warm-up step. Printed per setting: the parameters
the optimizer updates, AdamW's state bytes (its two moments), the tensors autograd keeps for the backward
pass of one forward (saved-tensor hooks, parameters not counted), how far the training steps raise the
process's peak resident memory above what imports, model and batch took (CPU has no allocator peak counter:
``ru_maxrss``, with glibc's mmap threshold fixed: :data:`MALLOC`; importing peft alone takes ~100 MB, so
whole-process peaks would not compare), and the median step time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: glibc's allocator raises its mmap threshold after large frees and then keeps freed memory in its heap, so the
#: resident size follows the order of allocations more than what is live (it put LoRA 300 MB above full
#: fine-tuning here, with fewer tensors alive); a fixed threshold returns every large block when it is freed
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def build_model(path: Path) -> None:
    from rlplat.models.tiny import TinyModelSpec, build_tiny_model

    # 8 layers of hidden 512 and MLP 1536 (Qwen2's ratios): 25.2M parameters in the decoder
    spec = TinyModelSpec(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                         intermediate_size=1536)
    build_tiny_model(path, spec, seed=0)


def timed_updates(engine, batch, loss_fn, steps: int, split) -> tuple[float, float]:
    """``steps`` updates of ``engine`` on ``batch`` after a warm-up one (which allocates the optimizer state): how far
    they raise the process's peak resident memory (MB) above what it held before, and the median step time (s)."""
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # imports, model, batch
    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        engine.train_mini_batch(batch, loss_fn, split=split)
        if step:
            times.append(time.perf_counter() - start)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - start_rss, statistics.median(times)


def measure(model: str, rank: int, steps: int, seqs: int, length: int) -> dict:
    """One setting, in this process: the engine, a batch, timed updates."""
    import torch

    from rlplat.engines import MicroBatching
    from rlplat.engines.dist import init_distributed
    from rlplat.utils.net import free_port
    from rlplat.protocol import Batch
    from rlplat.rollout.base import assemble_rollout
    from rlplat.trainer.run import load_run_config
    from rlplat.workers.engine_setup import build_training_engine

    torch.manual_seed(0)
    cfg, _ = load_run_config([f"model.path={model}", "trainer.ray_address=inprocess", f"model.lora.rank={rank}",
                              f"model.lora.alpha={2 * max(rank, 1)}"])
    ctx = init_distributed(0, 1, "127.0.0.1", free_port(), "cpu")
    engine = build_training_engine(cfg, "actor", model, ctx, cfg.actor.optim, steps + 1)
    half = length // 2
    prompt = Batch.from_dict({"prompts": torch.randint(10, 90, (seqs, half)),
                              "prompt_mask": torch.ones(seqs, half, dtype=torch.long)})
    responses = torch.randint(10, 90, (seqs, half))
    batch = assemble_rollout(prompt, responses, torch.ones(seqs, half, dtype=torch.long), torch.zeros(seqs, half))
    tokens = float(seqs * half)

    def loss_fn(fwd, micro):
        mask = micro.tensors["response_mask"]
        return -(fwd.log_probs * mask).sum() / tokens, {}

    kept: dict[int, int] = {}  # the storages autograd keeps for the backward pass (not the parameters)

    def pack(tensor):
        kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        engine.forward(batch, grad=True)
    params = {p.untyped_storage().data_ptr() for p in engine.model.parameters()}
    saved = sum(size for ptr, size in kept.items() if ptr not in params)
    rss_growth_mb, step_s = timed_updates(engine, batch, loss_fn, steps, MicroBatching(seqs))
    state = sum(t.numel() * t.element_size() for s in engine.optim.optimizer.state.values()
                for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    return {"setting": f"LoRA rank {rank}" if rank else "full fine-tuning",
            "trained": sum(p.numel() for p in engine.optim.params),
            "all": sum(p.numel() for p in engine.model.parameters()),
            "optimizer_mb": state / 2**20,
            "saved_mb": saved / 2**20,
            "rss_growth_mb": rss_growth_mb, "step_s": step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[8, 16], help="LoRA ranks to compare with full")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "RANK"), help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.steps, args.seqs, args.length)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        build_model(model)
        rows = []
        for rank in [0, *args.ranks]:
            out = subprocess.run([sys.executable, __file__, "--one", str(model), str(rank), "--steps", str(args.steps),
                                  "--seqs", str(args.seqs), "--length", str(args.length)],
                                 check=True, capture_output=True, text=True, env={**os.environ, **MALLOC}).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"{args.seqs} sequences x {args.length} tokens per step, {args.steps} steps, float32, one CPU worker; "
          f"{rows[0]['all'] / 1e6:.1f}M parameters")
    print("| setting | trained parameters | AdamW state MB | saved for backward MB | peak RSS growth MB | step s |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['setting']} | {row['trained']:,} | {row['optimizer_mb']:.1f} | {row['saved_mb']:.0f} | "
              f"{row['rss_growth_mb']:.0f} | {row['step_s']:.3f} |")


if __name__ == "__main__":
    main()
