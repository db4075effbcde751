"""LLM-as-a-judge rewards: the prompt the judge reads, the verdict parsed from what it writes, and the
client of an OpenAI-compatible judge server.

The judge is the reward function ``judge`` (``reward.judge.*``). For each sample, ``reward.judge.prompt_template``
(default in :data:`rlplat.config.schema.JUDGE_TEMPLATE`) is filled with ``{question}`` (the content of the prompt's last user message), ``{response}`` and
``{reference}`` (the row's ground truth); the judge's answer is parsed by ``reward.judge.verdict``:

* ``score``: the number after the last ``Score:`` (any case), else the last number in the answer; it must
  lie in ``[score_min, score_max]`` and is scaled to [0, 1];
* ``yes_no``: the last standalone "yes" or "no" (any case): 1.0 or 0.0.

An answer that does not parse, or a request that fails or times out, is a failed call: it scores 0, is
counted in ``reward/num_errors`` and named in the first error message, and stops the run only when
``reward.fail_fraction_to_stop`` of a step's calls fail. The judge is served by a rollout engine on judge
workers (``reward.judge.model_path``, :mod:`rlplat.workers.reward_model`) or by a server
(:class:`ServerJudge`, ``reward.judge.url``) whose API key is read from the environment variable
``reward.judge.api_key_env`` only (so it is never in the config, the logs or the trackers).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlplat.data.vision import text_of
from rlplat.reward.calls import CallOutcome, RewardFailure, RewardValue

_NUMBER = r"-?\d+(?:\.\d+)?"
_SCORE_LINE = re.compile(rf"score\s*[:=]\s*({_NUMBER})", re.IGNORECASE)
_ANY_NUMBER = re.compile(rf"(?<![\w.]){_NUMBER}(?![\w])")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_FIELDS = ("question", "response", "reference")


def question_of(messages: Sequence[Any]) -> str:
    """The content of the prompt's last user message (all messages' contents when none is a user's; an image as
    ``<image>``)."""
    messages = [dict(m) for m in messages]
    users = [m for m in messages if m.get("role") == "user"]
    return text_of((users or messages)[-1].get("content", "")) if messages else ""


def check_template(template: str) -> None:
    """A ``ValueError`` naming the key when the template has a field other than question/response/reference."""
    try:
        template.format(**{name: "" for name in _FIELDS})
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"reward.judge.prompt_template: {type(err).__name__} {err}; its fields are {{question}}, "
                         f"{{response}} and {{reference}} (write {{{{ and }}}} for literal braces)") from None


def judge_prompts(template: str, prompts: Sequence[Any], responses: Sequence[str], references: Sequence[Any]) -> list[str]:
    return [template.format(question=question_of(p), response=r, reference=str(g))
            for p, r, g in zip(prompts, responses, references)]


def parse_verdict(text: str, verdict: str, low: float, high: float, index: int) -> CallOutcome:
    """The outcome of one judge answer: its score in [0, 1], or a ``bad_value`` failure naming the sample and
    what the judge wrote."""
    shown = repr(text.strip()[-120:])
    if verdict == "yes_no":
        found = _YES_NO.findall(text)
        if not found:
            return RewardFailure("bad_value", f"the judge's answer on sample {index} has no yes or no: {shown}")
        return RewardValue(1.0 if found[-1].lower() == "yes" else 0.0)
    found = _SCORE_LINE.findall(text) or _ANY_NUMBER.findall(text)
    value = float(found[-1]) if found else None
    if value is None or not low <= value <= high:
        return RewardFailure("bad_value", f"the judge's answer on sample {index} is not a score in "
                                          f"[{low:g}, {high:g}]: {shown}")
    return RewardValue((value - low) / (high - low))


class ServerJudge:
    """Judge answers from an OpenAI-compatible server's ``/chat/completions`` (``reward.judge.url``, e.g.
    ``http://host:8000/v1``): one request per sample, ``concurrency`` in flight, each with ``timeout_s``;
    greedy unless ``temperature`` says otherwise. A failed request is that sample's error message."""

    def __init__(self, judge_cfg: Any):
        self.url = str(judge_cfg.url).rstrip("/") + "/chat/completions"
        self.model, self.timeout_s = judge_cfg.model, float(judge_cfg.timeout_s)
        self.max_tokens, self.temperature = int(judge_cfg.max_new_tokens), float(judge_cfg.temperature)
        self.key_env, self.concurrency = judge_cfg.api_key_env, int(judge_cfg.concurrency)

    def _ask(self, index: int, prompt: str) -> str | BaseException:
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": self.max_tokens, "temperature": self.temperature}
        headers = {"Content-Type": "application/json"}
        if key := os.environ.get(self.key_env or ""):
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read().decode())["choices"][0]["message"]["content"] or ""
        except urllib.error.HTTPError as err:
            return RuntimeError(f"the judge server answered {err.code} on sample {index}: "
                                f"{err.read().decode(errors='replace')[:200]}")
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
            return RuntimeError(f"the judge request for sample {index} failed ({self.url}, "
                                f"timeout {self.timeout_s:g} s): {err}")
        except (KeyError, IndexError, TypeError, ValueError) as err:
            return RuntimeError(f"the judge server's answer on sample {index} is not a chat completion: {err}")

    def answers(self, prompts: Sequence[str]) -> list[str | BaseException]:
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency), thread_name_prefix="rlplat-judge") as pool:
            return list(pool.map(self._ask, range(len(prompts)), prompts))
