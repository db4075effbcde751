"""The HF engine in an agent loop: a conversation's earlier turns kept in the cache, against run again each turn.

    .venv/bin/python benchmarks/agent_turns.py                    # 32 conversations, up to 3 turns
    .venv/bin/python benchmarks/agent_turns.py --repeats 5 --rows 32

The ``tool`` agent loop (``rlplat.rollout.agent_loop.ToolLoop``) runs ``--rows`` conversations of up to
three assistant turns with the tests' echo environment (``tests/workers/helpers.py``: a short user message
after each turn), sampled with a fixed seed, a turn ending at EOS, at a digit or after ``--new-tokens``
tokens, on a randomly initialised Qwen2 of 8 layers, hidden 512 (25M parameters) with the tests' character
tokenizer, float32 on CPU. ``kept``: the engine keeps each trajectory's keys and values between turns and
runs only the tokens added since; ``rerun``: the loop's ``continues`` hint is withheld, so every turn runs
the whole conversation. The two alternate ``--repeats`` times (the machine's speed drifts); the table gives
the median seconds of a rollout and the prompt tokens its forward passes ran (rows x width of each turn's
first pass). Both sample the same distribution (``tests/rollout/test_agent_loop.py`` checks that greedy
trajectories are the same).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

class Withheld:
    """The engine without the loop's ``continues`` hint (each turn runs the whole conversation)."""

    def __init__(self, engine):
        self.engine = engine

    def generate_ids(self, prompts, params, continues=None):
        return self.engine.generate_ids(prompts, params)

    def end_conversations(self):
        self.engine.end_conversations()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from rlplat.models.tiny import TinyModelSpec, build_tiny_model
    from rlplat.rollout.agent_loop import ToolLoop
    from rlplat.rollout.base import RolloutSetup, SamplingParams
    from rlplat.rollout.hf import HFRolloutEngine
    from rlplat.trainer.run import load_run_config
    from rlplat.utils.quiet import quiet_third_party
    from workers.helpers import ECHO_ENVIRONMENT, agent_prompts

    quiet_third_party(verbose=False)
    with tempfile.TemporaryDirectory(prefix="rlplat-agent-turns-") as tmp:
        spec = TinyModelSpec(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                             intermediate_size=1536, max_position_embeddings=2048)
        model_dir = build_tiny_model(Path(tmp) / "model", spec, seed=0)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        (Path(tmp) / "echo.py").write_text(ECHO_ENVIRONMENT)
        cfg = load_run_config(["rollout.agent.name=tool", f"rollout.agent.environment={tmp}/echo.py:Echo",
                               "rollout.agent.max_turns=3"])[0]
        setup = RolloutSetup(model_path=str(model_dir), tokenizer_path=str(model_dir), device=torch.device("cpu"),
                             dtype=torch.float32, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, max_model_len=2048, seed=0, rank=0, world_size=1)
        engine = HFRolloutEngine(setup, cfg.rollout.hf)
        prompts = agent_prompts(tokenizer, [f"{a}*{a + 7}=" for a in range(11, 11 + args.rows)])
        # random weights seldom sample EOS: a digit ends a turn too (about one token in ten)
        stops = tuple(tokenizer.convert_tokens_to_ids(list("0123456789")))
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0, stop_token_ids=stops)
        loop = ToolLoop(cfg.rollout.agent, tokenizer, response_length=3 * args.new_tokens + 64)
        ran: list[int] = []
        start = engine.forward.start
        engine.forward.start = lambda ids, *rest: ran.append(ids.numel()) or start(ids, *rest)
        seconds = {"kept": [], "rerun": []}
        tokens = {}
        for _ in range(args.repeats):
            for mode, runner in (("kept", engine), ("rerun", Withheld(engine))):
                ran.clear()
                begin = time.perf_counter()
                out = loop.run(runner, prompts, params)
                seconds[mode].append(time.perf_counter() - begin)
                tokens[mode] = sum(ran)
                turns = sum(info["agent"]["turns"] for info in out.non_tensors["extra_info"]) / args.rows
    print(f"\n{args.rows} conversations x {turns:.1f} turns, up to {args.new_tokens} tokens a turn, 8-layer hidden-512 "
          f"Qwen2, float32 on CPU ({torch.get_num_threads()} threads), median of {args.repeats}")
    print(f"{'mode':<6} {'rollout s':>10} {'prompt tokens run':>18}")
    for mode in seconds:
        print(f"{mode:<6} {statistics.median(seconds[mode]):>10.2f} {tokens[mode]:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
