"""The ``code`` reward: run the response's program against the row's tests in the sandbox.

The program is the content of the response's LAST fenced code block (```` ```python ````, ```` ```py ````
or a bare ```` ``` ````), or the whole response when it has none. The tests are the row's
``reward_model.ground_truth``, a JSON string (or the parsed object) in one of the public code-RL datasets'
conventions:

* **stdin/stdout** (APPS, TACO, CodeContests, DeepCoder): ``{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}``
  or ``[{"input": "1 2\\n", "output": "3\\n"}, ...]``; the program reads the input and must print the output
  (compared line by line with trailing spaces and trailing empty lines ignored).
* **function calls** (APPS/TACO call-based): ``{"fn_name": "add", "inputs": [[1, 2], ...], "outputs": [3, ...]}``;
  ``add(*inputs[i])`` must equal ``outputs[i]`` (compared after a JSON round trip, so tuples equal lists).
* **assert statements** (MBPP, HumanEval-style, open-instruct's code sets): ``["assert add(1, 2) == 3", ...]``
  or ``{"asserts": [...]}``; the program followed by one statement must exit cleanly.

Each test is one sandboxed run (:mod:`rlplat.utils.sandbox`: time, memory and output limits, its own user
when started by root, no network). Score: the fraction of tests passed (``reward.code.scoring=fraction``)
or 1.0 only when all pass (``all``). Once a test runs out of time the remaining tests are not run and count
as failed (a program that loops on one input usually loops on the others). The result's ``acc`` is 1.0
when every test passed. A ground truth that is not one of the forms above is a data error: the call fails
with a message naming the expected forms (counted as a reward error, not scored 0 silently).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from rlplat.utils.sandbox import SandboxLimits, SandboxResult, run_python

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_FORMS = ('{"inputs": [...], "outputs": [...]} (stdin/stdout), [{"input": ..., "output": ...}], '
          '{"fn_name": ..., "inputs": [[args]...], "outputs": [...]}, or a list of assert statements')


def extract_program(response: str) -> str:
    """The last fenced code block of ``response`` (python, py or no language), else the whole response."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


@dataclass(frozen=True)
class Test:
    kind: str  # stdio | call | assert
    payload: Any  # (stdin, expected stdout) | (fn_name, args, expected) | statement


def parse_tests(ground_truth: Any) -> list[Test]:
    """The tests of a row (see the module doc); ``ValueError`` naming the expected forms otherwise."""
    data = ground_truth
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as err:
            raise ValueError(f"code tests: reward_model.ground_truth is not JSON ({err}); expected {_FORMS}") from None
    if isinstance(data, dict) and "asserts" in data:
        data = data["asserts"]
    if isinstance(data, list) and data and all(isinstance(t, str) for t in data):
        return [Test("assert", t) for t in data]
    if isinstance(data, list) and data and all(isinstance(t, dict) and {"input", "output"} <= set(t) for t in data):
        return [Test("stdio", (str(t["input"]), str(t["output"]))) for t in data]
    if isinstance(data, dict) and isinstance(data.get("inputs"), list) and isinstance(data.get("outputs"), list) \
            and len(data["inputs"]) == len(data["outputs"]) and data["inputs"]:
        if data.get("fn_name"):
            return [Test("call", (str(data["fn_name"]), args if isinstance(args, list) else [args], out))
                    for args, out in zip(data["inputs"], data["outputs"])]
        return [Test("stdio", (str(i), str(o))) for i, o in zip(data["inputs"], data["outputs"])]
    shown = repr(data)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise ValueError(f"code tests: reward_model.ground_truth {shown} is none of the expected forms: {_FORMS}")


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


# Appended to the program for a call-based test: the call's result is the last line of stdout.
_CALL = """
import json as _rlplat_json, sys as _rlplat_sys
_rlplat_args = _rlplat_json.loads(_rlplat_sys.stdin.read())
_rlplat_result = {fn}(*_rlplat_args)
print()
print(_rlplat_json.dumps(_rlplat_result))
"""


def run_test(program: str, test: Test, limits: SandboxLimits) -> tuple[bool, SandboxResult]:
    """Whether ``program`` passes ``test``, and the sandbox's result."""
    if test.kind == "stdio":
        stdin, expected = test.payload
        result = run_python(program, stdin, limits)
        return result.ok and _lines(result.stdout) == _lines(expected), result
    if test.kind == "call":
        fn, args, expected = test.payload
        result = run_python(program + "\n" + _CALL.format(fn=fn), json.dumps(args), limits)
        if not result.ok or not result.stdout.strip():
            return False, result
        try:
            got = json.loads(result.stdout.strip().splitlines()[-1])
        except json.JSONDecodeError:
            return False, result
        return got == json.loads(json.dumps(expected)), result
    result = run_python(program + "\n\n" + test.payload + "\n", "", limits)
    return result.ok, result


@dataclass
class CodeScorer:
    """The ``code`` reward function (a callable with the reward signature; its settings travel with it to
    the reward worker processes). ``scoring``: ``fraction`` of tests passed, or ``all`` (1.0 or 0.0)."""

    limits: SandboxLimits = field(default_factory=lambda: SandboxLimits(timeout_s=5.0))
    scoring: str = "fraction"
    __name__ = "code"

    def __post_init__(self):
        if self.scoring not in ("fraction", "all"):
            raise ValueError(f"reward.code.scoring={self.scoring!r}: expected fraction or all")

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any,
                 extra_info: dict | None = None) -> dict[str, float]:
        tests = parse_tests(ground_truth)
        program = extract_program(solution_str)
        passed = timeouts = 0
        for test in tests:
            ok, result = run_test(program, test, self.limits)
            passed += ok
            if result.status == "timeout":
                timeouts += 1
                break
            if not ok and self.scoring == "all":
                break
        fraction = passed / len(tests)
        score = fraction if self.scoring == "fraction" else float(passed == len(tests))
        return {"score": score, "acc": float(passed == len(tests)), "pass_fraction": fraction,
                "tests": float(len(tests)), "timeouts": float(timeouts)}

    def configured(self, reward_cfg: Any) -> CodeScorer:
        """This scorer with the ``reward.code`` section's settings (``timeout_s``, ``memory_mb``,
        ``max_output_bytes``, ``scoring``); missing keys keep this scorer's values."""
        code_cfg = getattr(reward_cfg, "code", None) if not isinstance(reward_cfg, dict) else reward_cfg.get("code")

        def get(key: str, default: Any) -> Any:
            value = None if code_cfg is None else (code_cfg.get(key) if isinstance(code_cfg, dict)
                                                   else getattr(code_cfg, key, None))
            return default if value is None else value

        limits = SandboxLimits(timeout_s=float(get("timeout_s", self.limits.timeout_s)),
                               memory_mb=int(get("memory_mb", self.limits.memory_mb)),
                               max_output_bytes=int(get("max_output_bytes", self.limits.max_output_bytes)))
        return CodeScorer(limits, str(get("scoring", self.scoring)))
