"""verifiers environments in rlplat's agent loop: ``rollout.agent.environment=verifiers:<env>``.

`verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environments (the Environments Hub's) are
Python packages with a ``load_environment(**args)`` that returns an environment: its dataset, system prompt,
interaction protocol (``SingleTurnEnv``; ``MultiTurnEnv``'s ``env_response`` and ``@vf.stop`` conditions;
``ToolEnv``'s Python tools) and a rubric that scores a finished rollout. rlplat runs that protocol inside
its own tool loop (:class:`rlplat.rollout.agent_loop.ToolLoop`) with its own rollout engine:

* ``<env>`` is an installed environment's id or module (``vf.load_environment``: ``my-env`` imports
  ``my_env``) or a ``path/to/file.py`` that defines ``load_environment``; ``rollout.agent.environment_args``
  are its keyword arguments.
* The rows come from the environment's dataset (``python -m rlplat.data.verifiers``: its formatted prompt,
  system prompt included, and the row itself in ``extra_info["verifiers_row"]``).
* Each assistant turn the engine sampled is handed to the environment as verifiers' rollout loop would hand
  it a model's reply (tool calls read from the text by ``rollout.agent.parser`` become its structured
  ``tool_calls``); its stop conditions decide when the trajectory ends, and its ``env_response`` messages are
  the observations, rendered by rlplat's chat template as a suffix of the conversation. The trained ids are
  the sampled ids (:mod:`rlplat.agents.trajectory`): nothing is re-tokenized from the environment's messages.
* When the loop ends, each prompt group's rollouts are scored together by the rubric
  (``Rubric.score_group``: per-rollout functions on each, group functions on the group). Each rubric
  function with a non-zero weight becomes a reward term ``<function name>`` (its weighted value, so the
  terms add up to the rubric's reward; logged as ``reward/environment/<name>_mean``); functions of weight 0
  (verifiers' metrics: turns, tool calls) are kept in ``extra_info["agent"]["verifiers_metrics"]``.
* verifiers logs a reward function that raises or returns a non-number and scores it 0; rlplat stops the
  run instead, naming the function and the row: a silently zero reward is not trained on.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import numbers
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rlplat.agents.environment import Environment, Step
from rlplat.agents.parsers import TOOL_PARSERS
from rlplat.agents.tools import Tool
from rlplat.agents.trajectory import plain_message
from rlplat.config.errors import ConfigError
from rlplat.utils.errors import RunError
from rlplat.utils.files import import_file

ROW_KEY = "verifiers_row"  # extra_info key of the environment's own dataset row (JSON)
INSTALL = "pip install -e '.[envs]'"


class VerifiersFailed(RunError):
    """A verifiers environment or its rubric failed on a row: a bug in the environment."""


def _verifiers():
    try:
        import verifiers as vf
    except ImportError:
        raise ConfigError(f"verifiers environments need the package 'verifiers', which is not installed; install "
                          f"it with: {INSTALL}") from None
    return vf


def load(env: str, args: Mapping[str, Any] | None = None):
    """The verifiers environment ``env`` (an id, a module or ``path/to/file.py``) built with ``args``; a
    :class:`ConfigError`, one line, when it does not load. verifiers' handlers of SIGINT and SIGTERM are not
    installed: the trainer's own stop a run with its checkpoint."""
    vf, args = _verifiers(), dict(args or {})
    import datasets

    datasets.disable_progress_bars()  # the dataset's formatting would draw a bar per map
    where = f"rollout.agent.environment=verifiers:{env}"
    with _signals_kept():
        try:
            if env.endswith(".py"):
                module = import_file(env, "rlplat_verifiers_env")
                if not hasattr(module, "load_environment"):
                    raise ConfigError(f"{where}: {env} defines no load_environment(**args)")
                loaded = module.load_environment(**args)
            else:
                loaded = vf.load_environment(env, **args)
        except ConfigError:
            raise
        except FileNotFoundError as err:
            raise ConfigError(f"{where}: no such file ({err})") from None
        except ValueError as err:
            if "Could not import" not in str(err):
                raise ConfigError(f"{where}: load_environment raised ValueError: {err}") from None
            raise ConfigError(f"{where}: no installed environment or module {env!r} (install it, e.g. "
                              f"pip install <its package>, or name a path/to/file.py that defines load_environment)"
                              ) from None
        except Exception as err:  # noqa: BLE001 - the environment's own code: one line that names it
            cause = err.__cause__ or err
            raise ConfigError(f"{where}: load_environment raised {type(cause).__name__}: {cause}") from None
    if not isinstance(loaded, vf.MultiTurnEnv):
        raise ConfigError(f"{where}: load_environment returned {type(loaded).__name__}, not a verifiers "
                          f"SingleTurnEnv / MultiTurnEnv / ToolEnv (environment groups are not supported yet)")
    return loaded


class _signals_kept:
    """verifiers installs SIGINT/SIGTERM handlers when an environment is built (and fails to outside the main
    thread): while loading, ``signal.signal`` leaves the process's handlers as they are."""

    def __enter__(self):
        self.original = signal.signal
        signal.signal = lambda signum, handler: signal.getsignal(signum)
        return self

    def __exit__(self, *exc):
        signal.signal = self.original


def tool_schema(tool) -> dict:
    """A verifiers ``vf.Tool`` as the OpenAI-style schema chat templates take (``tools=``)."""
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": tool.parameters}}


class _SchemaTool(Tool):
    """A verifiers tool's schema for the prompt's rendering; verifiers itself runs the calls."""

    def __init__(self, tool):
        self.name, self.description, self.parameters = tool.name, tool.description or "", tool.parameters
        self._schema = tool_schema(tool)

    def schema(self) -> dict:
        return self._schema

    def __call__(self, **arguments):
        raise RuntimeError(f"the verifiers tool {self.name!r} is run by its environment")


# ------------------------------------------------------------------------------------------ rubric checks
_FAILURES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("rlplat_rubric_failures", default=None)


def _record(name: str, problem: str) -> None:
    failures = _FAILURES.get()
    if failures is not None:
        failures.append(f"{name} {problem}")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real)


def _check_value(name: str, value: Any) -> Any:
    values = value if isinstance(value, list) else [value]  # a group function returns one value per rollout
    bad = next((v for v in values if not _is_number(v)), None)
    if bad is not None or not values:
        _record(name, f"returned {bad!r} ({type(bad).__name__}), not a number")
    return value


def _checked(func):
    """``func`` as the rubric calls it, recording a raise or a non-number result (verifiers scores those 0)."""
    name = getattr(func, "__name__", repr(func))

    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def wrapper(*args, **kwargs):
            try:
                return _check_value(name, await func(*args, **kwargs))
            except Exception as err:
                _record(name, f"raised {type(err).__name__}: {err}")
                raise
    else:
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            try:
                return _check_value(name, func(*args, **kwargs))
            except Exception as err:
                _record(name, f"raised {type(err).__name__}: {err}")
                raise
    return wrapper


def _rubrics(rubric) -> list:
    """The rubrics of a rubric group, nested groups flattened (a plain rubric is its own)."""
    subs = getattr(rubric, "rubrics", None)
    return [r for sub in subs for r in _rubrics(sub)] if subs else [rubric]


# -------------------------------------------------------------------------------------------- the source
class VerifiersEnvironments:
    """The environment source ``verifiers:<env>`` (see the module doc): the environment loaded once, an
    adapter per trajectory (:meth:`make`), and the rubric's scoring of the finished groups (:meth:`finish`)."""

    def __init__(self, env: str, args: Mapping[str, Any], agent_cfg):
        self.name, self.env = env, load(env, args)
        self.parse = TOOL_PARSERS.get(agent_cfg.parser)
        self.tools = [_SchemaTool(tool) for tool in (self.env.tool_defs or [])]
        self.weights: dict[str, float] = {}
        for rubric in _rubrics(self.env.rubric):
            rubric.funcs = [_checked(f) for f in rubric.funcs]
            for func, weight in zip(rubric.funcs, rubric.weights):
                self.weights[func.__name__] = self.weights.get(func.__name__, 0.0) + float(weight)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="rlplat-verifiers", daemon=True).start()

    def run(self, coroutine):
        """Run a coroutine of the environment on its event loop (one thread; callers may be many)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def make(self, row: Mapping[str, Any]) -> VerifiersEnvironment:
        return VerifiersEnvironment(self)

    def finish(self, envs: Sequence[Environment], groups: Sequence[Any], conversations: Sequence[list[dict]]
               ) -> list[tuple[dict[str, float], dict[str, Any]]]:
        """Each trajectory's reward terms and info: the rubric's scores of its rollout, a prompt group at a time."""
        for env, messages in zip(envs, conversations):
            env.close(messages)
        by_group: dict[Any, list[int]] = {}
        for i, group in enumerate(groups):
            by_group.setdefault(group, []).append(i)
        for members in by_group.values():
            failures: list[str] = []
            self.run(self._score([envs[i].state for i in members], failures))
            if failures:
                first = members[0]
                raise VerifiersFailed(
                    f"verifiers environment {self.name!r}: its rubric function {failures[0]} on row "
                    f"{envs[first].index} (group of {len(members)}); rlplat does not train on a reward the rubric "
                    f"could not compute (verifiers would score it 0): fix the function")
        out = []
        for env in envs:
            metrics = dict(env.state.get("metrics") or {})
            terms = {name: self.weights[name] * float(value) for name, value in metrics.items()
                     if self.weights.get(name, 0.0) != 0.0}
            calls = int(metrics.get("total_tool_calls", 0))  # a ToolEnv's count, as rlplat's tool loop counts
            out.append((terms, {"tool_calls": calls, "verifiers_reward": float(env.state.get("reward") or 0.0),
                                "verifiers_metrics": {k: float(v) for k, v in metrics.items()},
                                "verifiers_stop": env.state.get("stop_condition")}))
        return out

    async def _score(self, states: list, failures: list[str]) -> None:
        token = _FAILURES.set(failures)
        try:
            await self.env.rubric.score_group(states)
        finally:
            _FAILURES.reset(token)


class VerifiersEnvironment(Environment):
    """One trajectory of a verifiers environment, driven as its rollout loop would drive it."""

    def __init__(self, source: VerifiersEnvironments):
        self.source, self.env = source, source.env
        self.state: Any = None
        self.index: Any = None
        self.prompt_messages: list = []
        self.turns = 0

    def reset(self, row: Mapping[str, Any]) -> list[dict]:
        info = row.get("extra_info") or {}
        self.index = info.get("index")
        if not isinstance(info.get(ROW_KEY), str):
            raise VerifiersFailed(f"verifiers environment {self.source.name!r}: the row has no extra_info[{ROW_KEY!r}] "
                                  f"(the environment's own row); write the rows with python -m rlplat.data.verifiers "
                                  f"--env {self.source.name}")
        task = {**json.loads(info[ROW_KEY]), "prompt": [dict(m) for m in row["prompt"]]}
        vf = _verifiers()
        self.state = self.source.run(self._start(task, vf.OpenAIChatCompletionsClient(None)))
        self.prompt_messages = list(self.state["prompt"])
        return list(row["prompt"])

    async def _start(self, task: dict, client):
        state = await self.env.init_state(task, client=client, model="rlplat")
        state["timing"].generation.start = time.time()
        return (await self.env.setup_state(state)) or state

    def step(self, message: dict) -> Step:
        self.turns += 1
        return self.source.run(self._step(self._assistant(message)))

    def _assistant(self, message: dict, truncated: bool = False):
        """The sampled turn as verifiers' assistant message: tool calls parsed from the text, as its API
        client would have returned them (a call that does not parse keeps its raw text as the arguments, and
        the environment answers with the error)."""
        vf = _verifiers()
        text = message.get("content") or ""
        calls = [] if truncated or not self.env.tool_defs else self.source.parse(text).calls
        tool_calls = [vf.ToolCall(id=f"call_{self.turns}_{k}", name=call.name or "unknown",
                                  arguments=call.raw if call.error else json.dumps(call.arguments))
                      for k, call in enumerate(calls)]
        return vf.AssistantMessage(content=text, tool_calls=tool_calls or None)

    def _append(self, reply, truncated: bool = False) -> None:
        from verifiers.types import TrajectoryStep

        self.state["trajectory"].append(TrajectoryStep(
            prompt=self.prompt_messages, completion=[reply], response=None, tokens=None, reward=None,
            advantage=None, is_truncated=truncated, trajectory_id=self.state["trajectory_id"], extras={}))

    async def _step(self, reply) -> Step:
        vf, env, state = _verifiers(), self.env, self.state
        self._append(reply)
        if await env.is_completed(state):
            return Step([], done=True)
        try:
            messages = await env.get_prompt_messages(state)
        except vf.Error as err:  # verifiers' loop records it, and its has_error stop ends the rollout
            state["error"] = err
            await env.is_completed(state)
            return Step([], done=True)
        if state.get("final_env_response") is not None or await env.is_completed(state):
            return Step([], done=True)
        new = messages[len(self.prompt_messages) + 1:]
        self.prompt_messages = list(messages)
        names = {call.id: call.name for call in reply.tool_calls or []}
        return Step([plain_message(m, names) for m in new])

    def close(self, conversation: list[dict]) -> None:
        """Before scoring: a last assistant turn the environment has not seen (cut at the token budget) is
        added as verifiers adds a truncated reply, and the rollout's completion is rendered (its cleanup)."""
        sampled = sum(m.get("role") == "assistant" for m in conversation)
        if sampled > len(self.state["trajectory"]) and conversation[-1].get("role") == "assistant":
            self._append(self._assistant(conversation[-1], truncated=True), truncated=True)
            self.state["is_truncated"] = True
        self.source.run(self.env.cleanup(self.state))

