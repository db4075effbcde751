"""Agent tools and tool-call parsers: exact arithmetic, the sandboxed Python tool breaking each limit, user
functions as tools, and every kind of failed call becoming an observation."""

import json
import os
import socket
import time

import pytest

from rlplat.agents import TOOL_PARSERS, TOOLS, ToolCall, call_tool, function_tool
from rlplat.agents.tools import Calculator, FunctionTool, PythonTool, ToolError, exact_value
from rlplat.utils.sandbox import SandboxLimits, isolation_report

CALC = {"calculator": Calculator()}


@pytest.mark.parametrize("expression, expected", [
    ("123456789 * 987654321", "121932631112635269"),
    ("(2 + 3) ** 4 / 5", "125"),
    ("7 / 3", "7/3 (= 2.33333333333)"),
    ("0.1 + 0.2", "3/10 (= 0.3)"),  # exact decimals
    ("-2 ** 3 // 3 % 5", "2"),  # Python's precedence and floor division: (-(2 ** 3) // 3) % 5
    ("10 ** 100", "1" + "0" * 100),
])
def test_the_calculator_is_exact(expression, expected):
    assert Calculator()(expression=expression) == expected


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('true')", "not Call"),
    ("x + 1", "not Name"),
    ("1 / 0", "division by zero"),
    ("2 ** 0.5", "whole number"),
    ("9 ** 9 ** 9", "under ~1,200 digits"),
    ("(" * 400 + "1" + ")" * 400, "too many nested parentheses"),
    ("-" * 5000 + "1", "nested too deeply"),
    ("1 +", "not an arithmetic expression"),
])
def test_the_calculator_refuses_what_is_not_arithmetic(expression, message):
    with pytest.raises(ToolError, match=message.replace("(", r"\(").replace("*", r"\*")):
        exact_value(expression)


@pytest.mark.parametrize("text, calls, content", [
    ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>',
     [("calculator", {"expression": "2*3"}, None)], "Let me compute."),
    ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>{"name": "b"}</tool_call>',
     [("a", {"x": 1}, None), ("b", {}, None)], ""),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', [("", {}, "not valid JSON")], ""),
    ('<tool_call>{"arguments": {}}</tool_call>', [("", {}, 'needs a "name"')], ""),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', [("f", {}, "must be an object")], ""),
    ('answer: 6 <tool_call>{"name": "f"', [("", {}, "without its closing")], "answer: 6"),
    ("The answer is 6.", [], "The answer is 6."),
])
def test_hermes_tool_calls(text, calls, content):
    parsed = TOOL_PARSERS.get("hermes")(text)
    assert parsed.content == content and len(parsed.calls) == len(calls)
    for call, (name, arguments, error) in zip(parsed.calls, calls):
        assert (call.name, call.arguments) == (name, arguments)
        assert call.error is None if error is None else error in call.error


def test_llama3_json_tool_calls():
    parse = TOOL_PARSERS.get("llama3_json")
    parsed = parse('<|python_tag|>{"name": "calculator", "parameters": {"expression": "1+1"}}; {"name": "b", "parameters": {}}')
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calculator", {"expression": "1+1"}), ("b", {})]
    assert parse("The answer is {x}.").calls == [] and parse("The answer is 2.").content == "The answer is 2."
    broken = parse('{"name": "calculator", "parameters": {')
    assert len(broken.calls) == 1 and "not valid JSON" in broken.calls[0].error


def test_every_failed_call_is_an_observation():
    tools = {**CALC, "slow": FunctionTool(sleeps, name="slow", timeout_s=0.3), "boom": FunctionTool(raises, name="boom")}
    cases = [
        (ToolCall("", raw="{", error="the tool call is not valid JSON"), "error", "not valid JSON"),
        (ToolCall("search", {"q": "x"}), "error", "no tool named 'search'; the tools are ['boom', 'calculator', 'slow']"),
        (ToolCall("calculator", {}), "error", "missing ['expression']"),
        (ToolCall("calculator", {"expression": "1", "base": 2}), "error", "unknown ['base']"),
        (ToolCall("calculator", {"expression": 12}), "error", "'expression' must be string, got int"),
        (ToolCall("calculator", {"expression": "1/0"}), "error", "division by zero"),
        (ToolCall("boom", {"x": 1}), "error", "boom raised RuntimeError: no luck"),
        (ToolCall("slow", {"seconds": 5.0}), "timeout", "slow did not finish within 0.3 s"),
        (ToolCall("calculator", {"expression": "6*7"}), "ok", "42"),
    ]
    for call, status, text in cases:
        result = call_tool(call, tools)
        assert result.status == status and text in result.observation, (call, result)
        assert result.seconds < 2


def sleeps(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "slept"


def raises(x: int) -> str:
    raise RuntimeError("no luck")


USER_TOOLS = '''
def lookup(city: str, days: int = 1, metric: bool = True) -> str:
    """Look up the weather forecast of a city.

    Args:
        city: the city's name
        days (int): how many days ahead
    """
    return f"{city}: sunny for {days} day(s)"
'''


def test_a_user_function_is_a_tool_with_a_schema_from_its_hints_and_docstring(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text(USER_TOOLS)
    tool = function_tool(f"{path}:lookup")
    assert tool.schema() == {"type": "function", "function": {
        "name": "lookup", "description": "Look up the weather forecast of a city.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "the city's name"},
            "days": {"type": "integer", "description": "how many days ahead"},
            "metric": {"type": "boolean"}}}}}
    assert call_tool(ToolCall("lookup", {"city": "Oslo", "days": 2}), {"lookup": tool}).observation == "Oslo: sunny for 2 day(s)"
    for spec, message in [(f"{path}:nope", "defines no 'nope'"), ("missing.py:f", "no such file"),
                          ("my_tools:lookup", "no module 'my_tools'"), ("lookup", "expected 'path/to/file.py:name'")]:
        with pytest.raises(ValueError, match=message):
            function_tool(spec)


def test_a_tools_value_is_shown_to_the_model_as_json_unless_it_is_text():
    def forecast(city: str):
        return {"city": city, "days": [1, 2], "sunny": True, "rain_mm": None}

    def words(city: str):
        return "sunny, 21°C"

    tools = {"forecast": FunctionTool(forecast), "words": FunctionTool(words)}
    shown = call_tool(ToolCall("forecast", {"city": "Tromsø"}), tools).observation
    assert shown == '{"city": "Tromsø", "days": [1, 2], "sunny": true, "rain_mm": null}'
    assert call_tool(ToolCall("words", {"city": "Oslo"}), tools).observation == "sunny, 21°C"
    assert TOOL_PARSERS["hermes"] is TOOL_PARSERS.get("hermes")  # docs/agents.md reads a registry by name too


def test_builtins_are_registered_with_their_schemas():
    assert set(TOOLS.names()) >= {"calculator", "python"}
    schema = TOOLS.get("python")().schema()["function"]
    assert schema["name"] == "python" and schema["parameters"]["required"] == ["code"]


# ------------------------------------------------------------------------------ the Python tool's sandbox
@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 and ``connected()``: whether anyone connected to it so far. The kernel
    queues each completed connection until it is accepted, so one made at any time before the check is seen
    (a program that connected and exited included)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)

    def connected() -> bool:
        try:
            server.accept()[0].close()
            return True
        except BlockingIOError:
            return False

    yield server.getsockname()[1], connected
    server.close()


def test_the_python_tool_runs_a_program_and_clips_its_output():
    tool = PythonTool(SandboxLimits(timeout_s=2), max_output_chars=50)
    assert call_tool(ToolCall("python", {"code": "print(sum(range(10)))"}), {"python": tool}).observation == "45\n"
    long = call_tool(ToolCall("python", {"code": "print('y' * 500)"}), {"python": tool}).observation
    assert long.startswith("y" * 50) and "[451 more characters cut]" in long


@pytest.mark.skipif(os.geteuid() != 0, reason="as CI runs it: as root, where the sandbox's own uid binds")
def test_the_python_tool_as_root_turns_each_escape_into_an_error_observation(tmp_path, listener):
    port, connected = listener
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    before = sorted(p.name for p in tmp_path.iterdir())
    tool = PythonTool(SandboxLimits(timeout_s=2, memory_mb=256, max_processes=16))
    programs = {
        "loop": ("while True:\n    pass", "timeout", "ran out of time"),
        "10 GB": ("x = bytearray(10 * 2**30)", "error", "MemoryError"),
        "fork bomb": ("import os\nwhile True:\n    os.fork()", "error", "BlockingIOError"),
        "write outside": (f"open({str(outside)!r}, 'w').write('gone')", "error", "PermissionError"),
        "connect": (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", "error",
                    "Network is unreachable" if isolation_report()["network_cut"] else "Error"),
    }
    for name, (code, status, text) in programs.items():
        start = time.monotonic()
        result = call_tool(ToolCall("python", {"code": code}), {"python": tool})
        assert result.status == status and text in result.observation, (name, result)
        assert time.monotonic() - start < 6, name
    assert not connected(), "the sandboxed program reached a listener on 127.0.0.1"
    assert outside.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == before
    json.dumps(tool.schema())  # the schema is plain JSON for the chat template
