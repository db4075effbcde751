"""HF vs vLLM rollout inside rlplat's GRPO step, on the same model and workload; prints a table.

    .venv-vllm/bin/python benchmarks/rollout.py                  # both sizes, hf and vllm, 4 steps each
    .venv-vllm/bin/python benchmarks/rollout.py --sizes tiny --steps 6

Each (engine, size) runs in a fresh process (``--one``): rlplat's trainer in-process (no Ray) for
``--steps`` GRPO steps with validation off; the first step (engine warm-up, first weight sync) is
dropped and the rest averaged. Sizes: ``tiny`` is the embedded default's workload (the 0.3M-parameter
warm-started model, 64 prompts x 8 samples, up to 8 tokens); ``25m`` is a randomly initialised
25M-parameter Qwen2 (8 layers, hidden 512, head_dim 64), 8 prompts x 4 samples, up to 128 tokens.
Generated tokens/s counts the tokens actually sampled (responses end at EOS), over the generate stage.
Needs the vLLM virtualenv (scripts/setup_vllm.sh); without vllm only the hf rows run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = {
    "tiny": {"model": "embedded", "overrides": []},
    "25m": {
        "spec": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                     intermediate_size=1536, max_position_embeddings=512),
        "overrides": ["data.max_response_length=128", "data.train_batch_size_prompts=8",
                      "actor.mini_batch_size_prompts=8", "rollout.n=4", "actor.micro_batch_size_seqs_per_worker=8",
                      "actor.log_prob_micro_batch_size_seqs_per_worker=32", "actor.optim.lr=1e-5"],
    },
}


def model_path(size: str, workdir: Path) -> str:
    if SIZES[size].get("model") == "embedded":
        from rlplat.trainer.sft import ensure_embedded_model

        return str(ensure_embedded_model())
    from rlplat.models.tiny import TinyModelSpec, build_tiny_model

    return str(build_tiny_model(workdir / f"model-{size}", TinyModelSpec(**SIZES[size]["spec"]), seed=0))


def run_one(engine: str, size: str, steps: int) -> dict:
    from rlplat.data import TASKS, write_parquet
    from rlplat.trainer.run import load_run_config, run

    with tempfile.TemporaryDirectory() as tmp:
        val = write_parquet(TASKS.get("arithmetic")(8, seed=1, split="test"), Path(tmp) / "val.parquet")
        cfg, plan = load_run_config([
            f"model.path={model_path(size, Path(tmp))}", "algorithm=grpo", f"rollout={engine}",
            "trainer.ray_address=inprocess", f"trainer.total_steps={steps}", "trainer.test_freq=-1",
            f"trainer.output_dir={tmp}/out", f"data.val_files={val}", "rollout.val_n=1", *SIZES[size]["overrides"],
        ])
        run(cfg, plan)
        rows = [json.loads(line) for line in (Path(tmp) / "out" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing/step_s" in r][1:]  # the first step warms the engine up

    def mean(key: str) -> float:
        return statistics.mean(r[key] for r in rows)

    seqs = cfg.data.train_batch_size_prompts * cfg.rollout.n
    return {"engine": engine, "size": size, "steps": len(rows), "step_s": mean("timing/step_s"),
            "generate_s": mean("timing/generate_s"), "weight_sync_s": mean("timing/weight_sync_s"),
            "update_s": mean("timing/update_actor_s"),
            "gen_tok_per_s": mean("response_length/mean") * seqs / mean("timing/generate_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--one", nargs=2, metavar=("ENGINE", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(*args.one, args.steps)), flush=True)
        return
    engines = [e for e in args.engines if e != "vllm" or importlib.util.find_spec("vllm")]
    results = []
    for size in args.sizes:
        for engine in engines:
            proc = subprocess.run([sys.executable, __file__, "--one", engine, size, "--steps", str(args.steps)],
                                  capture_output=True, text=True)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                raise SystemExit(f"{engine}/{size} failed:\n{proc.stderr[-3000:]}")
            results.append(json.loads(lines[-1][len("RESULT "):]))
    print(f"machine: {platform.processor() or platform.machine()}, steps averaged: {args.steps - 1} per row")
    print(f"{'size':<6} {'engine':<6} {'step s':>8} {'generate s':>11} {'weight sync s':>14} {'update s':>9} "
          f"{'gen tok/s':>10}")
    for r in results:
        print(f"{r['size']:<6} {r['engine']:<6} {r['step_s']:>8.3f} {r['generate_s']:>11.3f} "
              f"{r['weight_sync_s']:>14.3f} {r['update_s']:>9.3f} {r['gen_tok_per_s']:>10.0f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
