"""Token-exact trajectories: sampled ids kept as they are, observations rendered as template suffixes, the
loss mask on sampled tokens only, and the drift check on a template that stays exact and one that drifts."""

import pytest

from rlplat.agents.trajectory import Segment, TemplateNotIncremental, Trajectory, render_suffix, retokenize_drift
from rlplat.models.tiny import CHAT_TEMPLATE, build_tokenizer

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
# The embedded template, but an assistant turn that is not the last loses its reasoning (as thinking
# models' templates do): re-rendering a finished conversation then differs from what was sampled.
DROPS_REASONING = CHAT_TEMPLATE.replace(
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|endoftext|>' }}",
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<|' + message['role'] + '|>' + content + '<|endoftext|>' }}")


def sampled(tok, text):
    """What an engine returns for ``text``: its ids then EOS, with a log-prob each."""
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return ids, [-0.5] * len(ids)


def tool_conversation(tok, first_turn=CALL):
    messages = [{"role": "user", "content": "What is 6*7?"}]
    prompt = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    trajectory = Trajectory(prompt, list(messages))
    ids1, lp1 = sampled(tok, first_turn)
    trajectory.add_sampled(ids1, lp1, first_turn)
    trajectory.add_observation(tok, [{"role": "tool", "content": "42"}])
    ids2, lp2 = sampled(tok, "42")
    trajectory.add_sampled(ids2, lp2, "42")
    return trajectory, ids1, ids2


def test_the_trained_sequence_is_the_sampled_ids_and_the_observation_ids_token_by_token():
    tok = build_tokenizer()
    trajectory, ids1, ids2 = tool_conversation(tok)
    observation = tok("<|tool|>42", add_special_tokens=False)["input_ids"] + [tok.eos_token_id] + \
        tok("<|assistant|>", add_special_tokens=False)["input_ids"]
    assert trajectory.response_ids == ids1 + observation + ids2
    assert trajectory.loss_mask == [1] * len(ids1) + [0] * len(observation) + [1] * len(ids2)
    assert trajectory.rollout_log_probs == [-0.5] * len(ids1) + [0.0] * len(observation) + [-0.5] * len(ids2)
    drift = retokenize_drift(tok, trajectory)
    assert (drift.mismatch_frac, drift.first_difference) == (0.0, None)  # the embedded template is exact


def test_the_drift_check_fires_on_a_template_that_drops_earlier_reasoning():
    tok = build_tokenizer()
    tok.chat_template = DROPS_REASONING
    first = "<think>6 times 7</think>" + CALL
    trajectory, ids1, _ = tool_conversation(tok, first_turn=first)
    drift = retokenize_drift(tok, trajectory)
    start = len(trajectory.prompt_ids)  # the first turn's reasoning is where they part ("<t" is shared)
    assert drift.mismatch_frac > 0.1 and drift.first_difference == start + len("<t")
    assert "hink>6 times 7" in drift.detail and trajectory.response_ids[:len(ids1)] == ids1  # trained as sampled
    exact, _, _ = tool_conversation(tok)  # without reasoning nothing is dropped: no drift
    assert retokenize_drift(tok, exact).mismatch_frac == 0.0


def test_a_template_that_is_not_incremental_at_all_is_one_clear_error():
    tok = build_tokenizer()
    tok.chat_template = "{{ messages | length }}" + CHAT_TEMPLATE  # every rendering starts differently
    with pytest.raises(TemplateNotIncremental, match="observations cannot be rendered as a suffix"):
        render_suffix(tok, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                      [{"role": "tool", "content": "c"}])


def test_segments_check_their_log_probs():
    with pytest.raises(ValueError, match="one log-prob per id"):
        Segment((1, 2), True, (0.1,))
    with pytest.raises(ValueError, match="the policy did not sample it"):
        Segment((1,), False, (0.1,))
