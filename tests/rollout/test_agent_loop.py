"""The multi-turn agent loop on the HF engine: every trained sequence is the sampled ids and the observation
ids between them, token for token; the loss mask covers exactly the sampled ids while the observations are
attended to; the rollout's log-probs are the trainer's; environments end trajectories, give reward terms,
and a failing environment is one clear error."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlplat.models.embedded import embedded_model_dir
from rlplat.rollout.agent_loop import AGENT_LOOPS, EnvironmentFailed, ToolLoop
from rlplat.rollout.base import RolloutSetup, SamplingParams, prompt_token_lists
from rlplat.rollout.hf import HFRolloutEngine
from rlplat.sequence import position_ids_from_mask, response_log_probs
from rlplat.trainer.run import load_run_config
from workers.helpers import ECHO_ENVIRONMENT, agent_prompts, check_trajectories, observation_ids

class Recording:
    """The engine, with each turn's prompts and samples kept (``continuing=False``: the loop's ``continues``
    not passed on, so every turn runs the whole conversation)."""

    def __init__(self, engine, continuing: bool = True):
        self.engine, self.calls, self.continuing, self.ended = engine, [], continuing, 0

    def generate_ids(self, prompts, params, continues=None):
        samples = self.engine.generate_ids(prompts, params, continues if self.continuing else None)
        self.calls.append((prompts, samples))
        return samples

    def end_conversations(self):
        self.ended += 1
        self.engine.end_conversations()


def agent_setup(model_path, tmp_path, *overrides):
    (tmp_path / "echo.py").write_text(ECHO_ENVIRONMENT)
    cfg = load_run_config(["rollout.agent.name=tool", f"rollout.agent.environment={tmp_path}/echo.py:Echo",
                           *overrides])[0]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    setup = RolloutSetup(model_path=model_path, tokenizer_path=model_path, device=torch.device("cpu"),
                         dtype=torch.float32, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, max_model_len=512, seed=0, rank=0, world_size=1)
    return cfg, tokenizer, HFRolloutEngine(setup, cfg.rollout.hf)


def test_trajectories_are_the_sampled_and_observation_ids_token_for_token(embedded_cache, tmp_path):
    model_path = str(embedded_model_dir())
    cfg, tokenizer, engine = agent_setup(model_path, tmp_path)
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    loop, recording = ToolLoop(cfg.rollout.agent, tokenizer, response_length=64), Recording(engine)
    prompts = agent_prompts(tokenizer, ["12+5=", "3+4=", "20+22=", "9+9="])
    torch.manual_seed(0)
    out = loop.run(recording, prompts, params)
    t = out.tensors
    assert t["responses"].shape == (4, 64) and len(recording.calls) <= 3
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                       position_ids=position_ids_from_mask(t["attention_mask"])).logits
    trainer_log_probs, _ = response_log_probs(logits[:, prompts.tensors["prompts"].shape[1] - 1:-1], t["responses"], 1.0)
    multi_turn = 0
    for row in range(4):
        agent = out.non_tensors["extra_info"][row]["agent"]
        messages = agent["messages"]
        expected, trained = [], []
        turn_samples = samples_of(prompt_token_lists(prompts)[row], recording)
        for turn, sample in enumerate(turn_samples):
            expected += sample.ids
            trained += [1] * len(sample.ids)
            if 2 + 2 * turn < len(messages):  # an observation followed this turn
                observation = observation_ids(tokenizer, messages[:2 + 2 * turn], messages[:3 + 2 * turn])
                expected += observation
                trained += [0] * len(observation)
        length = len(expected)
        assert t["responses"][row, :length].tolist() == expected
        assert t["response_mask"][row].tolist() == trained + [0] * (64 - length)
        assert t["attention_mask"][row, -64:].tolist() == [1] * length + [0] * (64 - length)
        keep = t["response_mask"][row].bool()
        torch.testing.assert_close(t["rollout_log_probs"][row][keep], trainer_log_probs[row][keep], atol=1e-5, rtol=0)
        assert agent["retokenize_mismatch_frac"] == 0.0 and agent["retokenize_first_difference"] is None
        assert agent["turns"] == len(turn_samples) and agent["ended"] in ("done", "truncated", "budget")
        if agent["ended"] == "done":
            assert agent["turns"] == 3 and agent["rewards"] == {"polite": 1.0} and "said" in agent
        multi_turn += agent["turns"] > 1
        assert out.non_tensors["response_text"][row] == messages[-1 if messages[-1]["role"] == "assistant" else -2]["content"]
        assert bool(t["truncated"][row]) == (agent["ended"] == "truncated")
    assert multi_turn >= 2  # the check above covered observations between turns
    assert check_trajectories(out, tokenizer, {tokenizer.eos_token_id}) == multi_turn  # the vLLM test's check agrees


def samples_of(prompt_ids, recording):
    """The samples the engine drew, turn by turn, for the trajectory that starts with ``prompt_ids``."""
    return [sample for prompts, samples in recording.calls for ids, sample in zip(prompts, samples)
            if ids[:len(prompt_ids)] == prompt_ids]


def test_single_turn_is_the_engine_generate_and_the_default(tiny_model_path, tmp_path):
    cfg, tokenizer, engine = agent_setup(tiny_model_path, tmp_path, "rollout.agent.name=single_turn",
                                         "rollout.agent.environment=null")  # single_turn refuses an environment
    assert load_run_config([])[0].rollout.agent.name == "single_turn"
    loop = AGENT_LOOPS.get("single_turn")(cfg.rollout.agent, tokenizer, response_length=8)
    prompts = agent_prompts(tokenizer, ["hello", "12+5="])
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
    assert loop.run(engine, prompts, params).tensors["responses"].equal(engine.generate(prompts, params).tensors["responses"])


def test_an_environment_that_raises_is_one_error_naming_it_and_the_row(tiny_model_path, tmp_path):
    cfg, tokenizer, engine = agent_setup(tiny_model_path, tmp_path, f"rollout.agent.environment={tmp_path}/echo.py:Broken")
    stops = tuple(tokenizer.convert_tokens_to_ids(list("0123456789abcdefghijklmnopqrstuvwxyz")))
    loop = ToolLoop(cfg.rollout.agent, tokenizer, response_length=64)
    with pytest.raises(EnvironmentFailed, match=r"Broken.step\(\) raised on row \d \(echo\): KeyError"):
        loop.run(engine, agent_prompts(tokenizer, ["hi"] * 4), SamplingParams(max_new_tokens=8, stop_token_ids=stops))


def test_an_observation_that_does_not_fit_ends_the_trajectory_with_nothing_of_it_kept(tiny_model_path, tmp_path):
    cfg, tokenizer, engine = agent_setup(tiny_model_path, tmp_path)
    stops = tuple(tokenizer.convert_tokens_to_ids(list("0123456789abcdefghijklmnopqrstuvwxyz")))
    loop, recording = ToolLoop(cfg.rollout.agent, tokenizer, response_length=12), Recording(engine)
    prompts = agent_prompts(tokenizer, ["hi", "12+5="])
    out = loop.run(recording, prompts, SamplingParams(max_new_tokens=8, stop_token_ids=stops))
    assert len(recording.calls) == 1  # "turn 1: go on" and its role tokens do not fit beside a turn in 12 tokens
    for row, sample in enumerate(recording.calls[0][1]):
        agent = out.non_tensors["extra_info"][row]["agent"]
        assert agent["ended"] == "budget" and agent["turns"] == 1 and agent["rewards"] == {"polite": 0.25}
        assert agent["messages"][-1]["role"] == "assistant"  # no observation left half-added
        assert out.tensors["responses"][row, :len(sample.ids)].tolist() == sample.ids
        assert out.tensors["attention_mask"][row, -12:].tolist() == [1] * len(sample.ids) + [0] * (12 - len(sample.ids))


def test_the_hf_engine_runs_only_each_turns_new_tokens_and_samples_as_when_rerunning(embedded_cache, tmp_path):
    """The dense forward keeps each trajectory's cache between turns: a later turn's forward runs only the
    tokens added since (the last sampled token and the observation), and the trajectories, their ids and
    log-probs, are those of running every conversation whole each turn (greedy, so no draw can differ)."""
    model_path = str(embedded_model_dir())
    cfg, tokenizer, engine = agent_setup(model_path, tmp_path)
    prompts = agent_prompts(tokenizer, ["12+5=", "3+4=", "20+22=", "9+9="])
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    widths = []  # the tokens per row each forward pass starts with
    start = engine.forward.start
    engine.forward.start = lambda ids, *args: widths.append(ids.shape[1]) or start(ids, *args)
    runs = []
    for continuing in (True, False):
        widths.clear()
        recording = Recording(engine, continuing)
        out = ToolLoop(cfg.rollout.agent, tokenizer, response_length=64).run(recording, prompts, params)
        runs.append((out, recording.calls, list(widths)))
        assert recording.ended == 1 and engine._kept is None  # the caches are dropped after the loop
    (kept, kept_calls, kept_widths), (rerun, rerun_calls, rerun_widths) = runs
    assert len(kept_calls) == len(rerun_calls) >= 2
    for (prompts_kept, samples_kept), (prompts_rerun, samples_rerun) in zip(kept_calls, rerun_calls):
        assert prompts_kept == prompts_rerun and [s.ids for s in samples_kept] == [s.ids for s in samples_rerun]
        for a, b in zip(samples_kept, samples_rerun):
            torch.testing.assert_close(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5, rtol=0)
    assert kept.tensors["responses"].equal(rerun.tensors["responses"])
    for turn, (conversations, samples) in enumerate(kept_calls[1:], start=1):
        previous = {tuple(p + s.ids) for p, s in zip(*kept_calls[turn - 1])}
        added = [len(p) - max(len(q) for q in previous if tuple(p[:len(q)]) == q) + 1 for p in conversations]
        assert kept_widths[turn] == max(added) < rerun_widths[turn] == max(len(p) for p in conversations)
