"""A mixture of experts against a dense model of equal active parameters on the FSDP engine, and what routing
replay costs: parameters, peak memory and update step time.

    python benchmarks/moe.py                        # 8 layers of hidden 512: dense MLP 1536 vs 8 experts of 768, top-2
    python benchmarks/moe.py --steps 3 --seqs 4 --length 128                  # a quicker look

Each setting trains in a fresh process (one worker, float32 on CPU, the engine's own update: packed
micro-batches, the token head; the MoE's routers add their load-balancing loss): ``--steps`` optimizer steps on
``--seqs`` random sequences of ``--length`` tokens (half prompt, half response) after one warm-up step. The two
models share their attention, embeddings and depth; the MoE's two chosen experts together are as wide as the
dense MLP, so a token costs the same multiply-adds in both (the active parameters) while the MoE holds 4x the
MLP weights. ``r3`` replays a recorded routing (random distinct experts per token and layer, the batch field a
rollout would give) in every forward; ``r2`` replays one just as cheaply in the update, but adds the actor's
log-prob pass, which a run without it may skip. Printed per setting: all and active parameters, how far the
training steps raise the process's peak resident memory above what imports, model and batch took (as
benchmarks/lora.py measures it), and the median step time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lora import MALLOC, timed_updates  # noqa: E402  the same allocator setting and timing, so the peaks compare

SETTINGS = {"dense": ("dense", "none"), "moe": ("moe", "none"), "moe r3": ("moe", "r3")}


def build_models(root: Path) -> None:
    from rlplat.models.tiny import TinyModelSpec, TinyMoESpec, build_tiny_model

    shared = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4)
    build_tiny_model(root / "dense", TinyModelSpec(intermediate_size=1536, **shared), seed=0)
    build_tiny_model(root / "moe", TinyMoESpec(moe_intermediate_size=768, **shared), seed=0)


def measure(model: str, replay: str, steps: int, seqs: int, length: int) -> dict:
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
    cfg, _ = load_run_config([f"model.path={model}", "trainer.ray_address=inprocess",
                              f"actor.moe.router_replay={replay}"])
    ctx = init_distributed(0, 1, "127.0.0.1", free_port(), "cpu")
    engine = build_training_engine(cfg, "actor", model, ctx, cfg.actor.optim, steps + 1)
    half = length // 2
    prompt = Batch.from_dict({"prompts": torch.randint(10, 90, (seqs, half)),
                              "prompt_mask": torch.ones(seqs, half, dtype=torch.long)})
    batch = assemble_rollout(prompt, torch.randint(10, 90, (seqs, half)), torch.ones(seqs, half, dtype=torch.long),
                             torch.zeros(seqs, half))
    active = sum(p.numel() for p in engine.model.parameters())
    if engine.routing is not None:
        tap = engine.routing.tap  # a token uses top_k of each layer's experts (and all the rest)
        expert_weights = sum(p.numel() for name, p in engine.model.named_parameters() if ".experts." in name)
        active -= expert_weights - expert_weights * tap.top_k // tap.num_experts
        chosen = torch.rand(seqs, length, len(tap.routers), tap.num_experts).argsort(-1)[..., :tap.top_k]
        batch = batch.union(Batch.from_dict({"routed_experts": chosen.to(torch.int16)}))
    tokens = float(seqs * half)

    def loss_fn(fwd, micro):
        loss = -(fwd.log_probs * micro.tensors["response_mask"]).sum() / tokens
        return loss + (fwd.router_loss if fwd.router_loss is not None else 0), {}

    rss_growth_mb, step_s = timed_updates(engine, batch, loss_fn, steps, MicroBatching(seqs))
    return {"all": sum(p.numel() for p in engine.model.parameters()), "active": active,
            "rss_growth_mb": rss_growth_mb, "step_s": step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "REPLAY"), help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], args.one[1], args.steps, args.seqs, args.length)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        build_models(Path(tmp))
        rows = {}
        for name, (model, replay) in SETTINGS.items():
            out = subprocess.run([sys.executable, __file__, "--one", str(Path(tmp) / model), replay,
                                  "--steps", str(args.steps), "--seqs", str(args.seqs), "--length", str(args.length)],
                                 check=True, capture_output=True, text=True, env={**os.environ, **MALLOC}).stdout
            rows[name] = json.loads(out.strip().splitlines()[-1])
    print(f"{args.seqs} sequences x {args.length} tokens per step, {args.steps} steps, float32, one CPU worker")
    print("| setting | parameters | active parameters | peak RSS growth MB | step s | vs dense |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {row['all'] / 1e6:.1f}M | {row['active'] / 1e6:.1f}M | {row['rss_growth_mb']:.0f} | "
              f"{row['step_s']:.3f} | {row['step_s'] / rows['dense']['step_s']:.2f}x |")
    print(f"r3's cost: {rows['moe r3']['step_s'] / rows['moe']['step_s'] - 1:+.1%} of the MoE's step")


if __name__ == "__main__":
    main()
