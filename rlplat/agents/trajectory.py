"""Token-exact multi-turn trajectories: the ids the engine sampled, the observation ids between them, and a
check that says when the chat template would have rendered something else.

A trajectory is its prompt's ids followed by segments: each assistant turn is the ids the engine sampled
(trained, with their log-probs), each observation (tool results, an environment's or a simulated user's
reply) is the chat template's rendering of the new messages **as a suffix** of the conversation so far,
ending with the generation prompt of the next assistant turn (attended to, not trained). Nothing is
re-tokenized from text, so the trainer computes log-probs of exactly the tokens the policy produced.

Re-rendering a finished conversation with the template does not always give those ids back: templates of
thinking models drop earlier ``<think>`` blocks, some templates render a turn differently once it is not
the last, and BPE merges differ across a turn boundary. :func:`retokenize_drift` measures that
(``agent/retokenize_mismatch_frac`` and where the first difference is), so the drift is seen instead of
trained on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Segment:
    ids: tuple[int, ...]
    trained: bool  # True: sampled by the policy (loss, log-probs); False: an observation (attended to only)
    log_probs: tuple[float, ...] = ()  # the engine's log-probs of sampled ids (empty for observations)

    def __post_init__(self):
        if self.trained and len(self.log_probs) != len(self.ids):
            raise ValueError(f"a sampled segment needs one log-prob per id: {len(self.ids)} ids, "
                             f"{len(self.log_probs)} log-probs")
        if not self.trained and self.log_probs:
            raise ValueError("an observation segment has no log-probs: the policy did not sample it")


@dataclass
class Trajectory:
    prompt_ids: list[int]
    messages: list[dict]  # the conversation: the prompt's messages, then each assistant turn and observation
    segments: list[Segment] = field(default_factory=list)

    @property
    def response_ids(self) -> list[int]:
        return [token for segment in self.segments for token in segment.ids]

    @property
    def loss_mask(self) -> list[int]:
        """1 on sampled tokens, 0 on observation tokens (all of them are attended to)."""
        return [int(segment.trained) for segment in self.segments for _ in segment.ids]

    @property
    def rollout_log_probs(self) -> list[float]:
        """The engine's log-prob of each response token; 0.0 on observation tokens."""
        return [lp for s in self.segments for lp in (s.log_probs if s.trained else (0.0,) * len(s.ids))]

    def cut(self, width: int) -> Trajectory:
        """The trajectory with at most ``width`` response tokens (segments past it dropped, the last one cut)."""
        segments, left = [], width
        for segment in self.segments:
            if left <= 0:
                break
            segments.append(Segment(segment.ids[:left], segment.trained, segment.log_probs[:left]))
            left -= len(segment.ids)
        return Trajectory(self.prompt_ids, self.messages, segments)

    def add_sampled(self, ids: Sequence[int], log_probs: Sequence[float], text: str, **message: Any) -> None:
        """An assistant turn: the sampled ids as they are, and its decoded text as a message (``message``
        adds fields such as ``tool_calls``)."""
        self.segments.append(Segment(tuple(ids), True, tuple(float(x) for x in log_probs)))
        self.messages.append({"role": "assistant", "content": text, **message})

    def observation_ids(self, tokenizer, new_messages: Sequence[dict], tools: Sequence[dict] | None = None) -> list[int]:
        """The ids observation messages (tool results, a user's reply) would add: the template's rendering
        of the conversation with them and the next generation prompt, less its rendering without them."""
        return render_suffix(tokenizer, self.messages, list(new_messages), tools)

    def add_observation(self, tokenizer, new_messages: Sequence[dict], tools: Sequence[dict] | None = None,
                        ids: Sequence[int] | None = None) -> None:
        """Observation messages and their ids (:meth:`observation_ids`, unless already rendered)."""
        ids = self.observation_ids(tokenizer, new_messages, tools) if ids is None else ids
        self.segments.append(Segment(tuple(ids), False))
        self.messages.extend(dict(m) for m in new_messages)


def plain_message(message: Any, tool_names: Mapping[str, str] | None = None) -> dict:
    """A message from another library (a dict, or a pydantic message such as verifiers') as the chat template
    reads it: role and text content (content parts joined), a tool result named by its call (``tool_names``:
    call id -> tool name) when it does not carry its name."""
    data = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    content = data.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    out = {"role": data.get("role"), "content": content or ""}
    name = data.get("name") or (tool_names or {}).get(data.get("tool_call_id"))
    if name:
        out["name"] = name
    return out


def _render(tokenizer, messages: list[dict], generation_prompt: bool, tools: Sequence[dict] | None) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tools=list(tools) if tools else None, tokenize=True,
                                        add_generation_prompt=generation_prompt)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return list(ids)


class TemplateNotIncremental(ValueError):
    """The chat template renders the conversation's earlier turns differently once messages are added, so
    an observation cannot be rendered as a suffix of what the model saw."""


_BASE = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]  # a neutral conversation


def render_suffix(tokenizer, history: list[dict], new_messages: list[dict],
                  tools: Sequence[dict] | None = None) -> list[int]:
    """The ids that the chat template appends to a conversation ending with an assistant turn when
    ``new_messages`` follow it, up to and including the next assistant turn's generation prompt.

    Rendered after ``history`` itself when the template renders that history the same way once the
    messages follow; otherwise (a template that rewrites earlier turns, e.g. drops their reasoning) after
    a neutral two-message conversation, as verl does, and the finished trajectory's
    :func:`retokenize_drift` shows the difference. :class:`TemplateNotIncremental` when neither works."""
    for base in (history, _BASE):
        before = _render(tokenizer, base, False, tools)
        after = _render(tokenizer, base + new_messages, True, tools)
        if after[:len(before)] == before:
            return after[len(before):]
    first = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    raise TemplateNotIncremental(
        f"the chat template renders a conversation differently once {len(new_messages)} message(s) follow, even "
        f"a neutral one (first difference at token {first}: {tokenizer.decode(before[first:first + 12])!r} "
        f"became {tokenizer.decode(after[first:first + 12])!r}); observations cannot be rendered as a suffix")


@dataclass(frozen=True)
class Drift:
    mismatch_frac: float  # differing positions over the longer of the two sequences (0 = token-exact)
    first_difference: int | None  # the first differing position in the trajectory's ids, None when equal
    detail: str = ""  # the tokens around the first difference, trained vs re-rendered


def retokenize_drift(tokenizer, trajectory: Trajectory, tools: Sequence[dict] | None = None,
                     cut: bool = False) -> Drift:
    """How the ids the trainer trains on (prompt + segments) differ from the template's rendering of the
    finished conversation (``trajectory.messages``, ending after its last assistant turn). ``cut``: the
    last turn ended at the token budget, without the end-of-turn tokens the template writes after it, so
    the rendering is compared only as far as the trained ids go."""
    trained = trajectory.prompt_ids + trajectory.response_ids
    messages = trajectory.messages
    rendered = _render(tokenizer, messages, messages[-1].get("role") != "assistant", tools)
    if cut:
        rendered = rendered[:len(trained)]
    length = max(len(trained), len(rendered))
    differing = sum(a != b for a, b in zip(trained, rendered)) + abs(len(trained) - len(rendered))
    if not differing:
        return Drift(0.0, None)
    first = next((i for i, (a, b) in enumerate(zip(trained, rendered)) if a != b), min(len(trained), len(rendered)))
    detail = (f"trained {tokenizer.decode(trained[first:first + 16])!r} vs re-rendered "
              f"{tokenizer.decode(rendered[first:first + 16])!r}")
    return Drift(differing / length, first, detail)
