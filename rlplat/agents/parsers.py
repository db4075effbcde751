"""Tool calls in a model's output, by format (``TOOL_PARSERS``, chosen by config).

* ``hermes`` (Hermes, Qwen2.5 / Qwen3 chat templates): each call is
  ``<tool_call>{"name": "...", "arguments": {...}}</tool_call>``; the text outside the tags is the
  message's content. ``arguments`` may also be a JSON string holding the object.
* ``llama3_json`` (Llama 3.1 / 3.2 JSON tool calling): the whole message (after an optional
  ``<|python_tag|>``) is ``{"name": "...", "parameters": {...}}``, or several such objects separated by
  ``;``; a message that does not start with ``{`` has no call.

A call that cannot be read (bad JSON, no name, arguments that are not an object, an unclosed tag) is
returned as a :class:`~rlplat.agents.tools.ToolCall` with ``error`` set, so that the model is told what
was wrong with it instead of the call being silently dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from rlplat.agents.tools import ToolCall
from rlplat.registry import Registry


@dataclass(frozen=True)
class ParsedMessage:
    content: str  # the message without its tool calls
    calls: list[ToolCall] = field(default_factory=list)


ToolParser = Callable[[str], ParsedMessage]
TOOL_PARSERS: Registry[ToolParser] = Registry("tool-call parser")


def _call_from_json(raw: str, arguments_key: str) -> ToolCall:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        return ToolCall("", raw=raw, error=f"the tool call is not valid JSON ({err.msg} at character {err.pos}): "
                                           f"{raw[:200]!r}")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return ToolCall("", raw=raw, error=f'a tool call needs a "name" string: {raw[:200]!r}')
    arguments = data.get(arguments_key, data.get("arguments", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(data["name"], raw=raw, error=f'"{arguments_key}" of a call to {data["name"]!r} must be an '
                                                    f"object, got {type(arguments).__name__}")
    return ToolCall(data["name"], arguments, raw)


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> ParsedMessage:
    calls = [_call_from_json(body.strip(), "arguments") for body in _HERMES.findall(text)]
    content = _HERMES.sub("", text)
    if "<tool_call>" in content:  # opened, never closed (cut off at the token budget, or malformed)
        start = content.index("<tool_call>")
        calls.append(ToolCall("", raw=content[start:], error="a <tool_call> without its closing </tool_call>"))
        content = content[:start]
    return ParsedMessage(content.strip(), calls)


@TOOL_PARSERS.register("llama3_json")
def parse_llama3_json(text: str) -> ParsedMessage:
    body = text.strip()
    body = body.removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return ParsedMessage(text.strip())
    decoder, calls, position = json.JSONDecoder(), [], 0
    while position < len(body):
        try:
            _, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            calls.append(_call_from_json(body[position:], "parameters"))  # reports the JSON error
            break
        calls.append(_call_from_json(body[position:end], "parameters"))
        position = end
        while position < len(body) and body[position] in " \n\t;":
            position += 1
    return ParsedMessage("", calls)
