"""Ulysses sequence parallelism on the FSDP engine: activation memory per worker and step time, U = 1 against U > 1.

    python benchmarks/ulysses.py                                 # one 8192-token sequence, ~25M parameters, U = 1, 2
    python benchmarks/ulysses.py --length 2048 --steps 1         # a quicker look

Each setting runs U workers (processes on gloo, ``torch.set_num_threads(cores / U)`` each, so every setting uses
the same cores) holding one replica, ``actor.fsdp.ulysses_size=U``, through the engine's own update (packed rows,
the token head, the gated MLP). Printed per setting: the bytes of the tensors autograd keeps for the backward pass
of one forward on worker 0 (saved-tensor hooks; parameters, gathered ones included, not counted: CPU has no
allocator peak counter), their ratio to U = 1, the median step time (forward, backward and AdamW step) over
``--steps`` steps after a warm-up step, and the seconds of it worker 0 spent in the forward pass's all-to-alls
(the backward pass moves as many bytes again).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def build_model(path: Path, length: int) -> None:
    from rlplat.models.tiny import TinyModelSpec, build_tiny_model

    # 8 layers of hidden 512 and MLP 1536 (Qwen2's ratios): 25.2M parameters in the decoder, positions for length
    spec = TinyModelSpec(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                         intermediate_size=1536, max_position_embeddings=length)
    build_tiny_model(path, spec, seed=0)


def worker(rank: int, size: int, port: int, model: str, length: int, steps: int, cores: int, out: dict) -> None:
    import torch

    import rlplat.engines.ulysses as ulysses
    from rlplat.engines import MicroBatching
    from rlplat.engines.dist import init_distributed
    from rlplat.protocol import Batch
    from rlplat.rollout.base import assemble_rollout
    from rlplat.trainer.run import load_run_config
    from rlplat.workers.engine_setup import build_training_engine

    torch.set_num_threads(max(1, cores // size))
    torch.manual_seed(0)
    cfg, _ = load_run_config([f"model.path={model}", f"trainer.workers_per_node={size}", "rollout.n=2",
                              "data.train_batch_size_prompts=16", "actor.mini_batch_size_prompts=16",
                              f"actor.fsdp.ulysses_size={size}", f"data.max_prompt_length={length // 2}",
                              f"data.max_response_length={length // 2}"])
    ctx = init_distributed(rank, size, "127.0.0.1", port, "cpu")
    engine = build_training_engine(cfg, "actor", model, ctx, cfg.actor.optim, steps + 1)
    half = length // 2
    generator = torch.Generator().manual_seed(1)
    prompt = Batch.from_dict({"prompts": torch.randint(10, 90, (1, half), generator=generator),
                              "prompt_mask": torch.ones(1, half, dtype=torch.long)})
    responses = torch.randint(10, 90, (1, half), generator=generator)
    batch = assemble_rollout(prompt, responses, torch.ones(1, half, dtype=torch.long), torch.zeros(1, half))

    def loss_fn(fwd, micro):
        return -(fwd.log_probs * micro.tensors["response_mask"]).sum() / half, {}

    kept: dict[int, int] = {}  # the storages autograd keeps for the backward pass (not parameters)

    def pack(tensor):
        if not isinstance(tensor, torch.nn.Parameter):
            kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        engine.forward(batch, grad=True)
    exchanged = [0.0]  # seconds in the forward's all-to-alls (the benchmark's own timer around the exchange)
    all_to_all = ulysses._all_to_all

    def timed(tensor, group):
        start = time.perf_counter()
        result = all_to_all(tensor, group)
        exchanged[0] += time.perf_counter() - start
        return result

    ulysses._all_to_all = timed
    times, exchange = [], []
    for step in range(steps + 1):
        exchanged[0] = 0.0
        start = time.perf_counter()
        engine.train_mini_batch(batch, loss_fn, split=MicroBatching(1))
        if step:  # the first step allocates the optimizer state
            times.append(time.perf_counter() - start)
            exchange.append(exchanged[0])
    if rank == 0:
        out[size] = {"saved_mb": sum(kept.values()) / 2**20, "step_s": statistics.median(times),
                     "all_to_all_s": statistics.median(exchange)}


def main() -> None:
    import torch.multiprocessing as mp

    from rlplat.utils.net import free_port

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 2], help="Ulysses sizes U to compare")
    parser.add_argument("--length", type=int, default=8192, help="tokens in the sequence (half prompt, half response)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="CPU cores the workers of a setting share")
    args = parser.parse_args()
    out = mp.Manager().dict()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        build_model(model, args.length)
        for size in args.sizes:
            mp.start_processes(worker, args=(size, free_port(), str(model), args.length, args.steps, args.cores, out),
                               nprocs=size, start_method="spawn")
    rows = {size: out[size] for size in args.sizes}
    print(f"one sequence of {args.length} tokens, ~25M parameters, float32, {args.cores} CPU cores per setting")
    print("| U | saved for backward per worker MB | vs U = 1 | step s | forward all-to-all s |")
    print("|---:|---:|---:|---:|---:|")
    base = rows[args.sizes[0]]["saved_mb"]
    for size, row in rows.items():
        print(f"| {size} | {row['saved_mb']:.0f} | {row['saved_mb'] / base:.2f} | {row['step_s']:.2f} | "
              f"{row['all_to_all_s']:.2f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
