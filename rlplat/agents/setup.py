"""Setting up agents from ``rollout.agent``: the tools named in config or in a row, and each row's environment
(the rollout's agent loop, the dataset's prompt rendering and the SFT warm start make them the same way)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rlplat.agents.environment import Environment, ToolEnvironment, load_environment
from rlplat.agents.parsers import TOOL_PARSERS
from rlplat.agents.tools import TOOLS, Tool, function_tool
from rlplat.config.errors import ConfigError
from rlplat.registry import Registry


def build_tools(specs) -> list[Tool]:
    """Tools named in config or in a row's ``extra_info["tools"]``: built-in names (``TOOLS``),
    ``path/to/file.py:function`` or ``package.module:function``."""
    return [function_tool(spec) if ":" in spec else TOOLS.get(spec)() for spec in specs]


class ClassEnvironments:
    """A user's :class:`Environment` subclass (``path/to/file.py:Class`` or ``package.module:Class``): one
    instance per trajectory, made with ``rollout.agent.environment_args`` as keyword arguments."""

    def __init__(self, spec: str, args: Mapping[str, Any], agent_cfg=None):
        self.cls, self.args = load_environment(spec), dict(args)
        self.tools = list(self.cls.tools)

    def make(self, row: Mapping[str, Any]) -> Environment:
        return self.cls(**self.args)

    def finish(self, envs, groups, conversations) -> None:
        """Its environments score each trajectory as they step: nothing is left to do when the loop ends."""
        return None


# Environments of other libraries, by the prefix of rollout.agent.environment (verifiers:<env>, ...): each
# a class built with (the rest of the spec, rollout.agent.environment_args, rollout.agent) that has the
# ClassEnvironments interface (tools, make, finish)
ENVIRONMENT_SOURCES: Registry[type] = Registry("environment library")
ENVIRONMENT_SOURCES.add_lazy("verifiers", "rlplat.agents.verifiers_env:VerifiersEnvironments",
                             requires=("verifiers",), install="pip install -e '.[envs]'")
ENVIRONMENT_SOURCES.add_lazy("openenv", "rlplat.agents.openenv_env:OpenEnvEnvironments",
                             requires=("openenv",), install="pip install -e '.[envs]'")


_SOURCES: dict[tuple[str, str, str], Any] = {}  # one per (spec, args, parser) and process: the start-up checks, the prompts'
# rendering and the agent loop all ask for it, and a library's environment loads its dataset (or starts a server)


def environment_source(agent_cfg):
    """The source of ``rollout.agent.environment``'s environments: a library's (its prefix), else a class; made
    once per process for the same spec, arguments and tool-call parser."""
    spec, args = agent_cfg.environment, dict(agent_cfg.get("environment_args") or {})
    key = (spec, json.dumps(args, sort_keys=True, default=str), agent_cfg.parser)
    if key not in _SOURCES:
        _SOURCES[key] = _new_source(spec, args, agent_cfg)
    return _SOURCES[key]


def _new_source(spec: str, args: dict, agent_cfg):
    prefix, sep, rest = spec.partition(":")
    if sep and prefix in ENVIRONMENT_SOURCES:
        problem = ENVIRONMENT_SOURCES.missing_requirements(prefix)
        if problem:
            raise ConfigError(f"rollout.agent.environment={spec!r}: {problem}")
        return ENVIRONMENT_SOURCES.get(prefix)(rest, args, agent_cfg)
    return ClassEnvironments(spec, args, agent_cfg)


class Environments:
    """Makes each row's environment: the user's (``rollout.agent.environment``: ``file.py:Class``,
    ``package.module:Class`` or a library's, e.g. ``verifiers:<env>``), else tools (the row's
    ``extra_info["tools"]``, else ``rollout.agent.tools``) with the configured parser and call limit.
    Built-in tools are made once and shared (the python tool holds a sandbox's settings, not a process)."""

    def __init__(self, agent_cfg):
        self.cfg = agent_cfg
        self.user = environment_source(agent_cfg) if agent_cfg.environment else None
        self._tools: dict[str, Tool] = {}
        self.default_tools = list(agent_cfg.tools)

    def tools_of(self, extra_info: Mapping | None) -> list[Tool]:
        if self.user is not None:
            return list(self.user.tools)
        names = (extra_info or {}).get("tools") or self.default_tools
        missing = [name for name in names if name not in self._tools]
        for name, tool in zip(missing, build_tools(missing)):
            self._tools[name] = tool
        return [self._tools[name] for name in names]

    def schemas_of(self, extra_info: Mapping | None) -> list[dict] | None:
        """The tools' schemas for the chat template (``tools=``) of a row; None when it has none."""
        return [tool.schema() for tool in self.tools_of(extra_info)] or None

    def make(self, row: Mapping[str, Any]) -> Environment:
        if self.user is not None:
            return self.user.make(row)
        return ToolEnvironment(self.tools_of(row.get("extra_info")), self.cfg.parser, self.cfg.max_tool_calls)

    def finish(self, envs: list[Environment], groups: list, conversations: list[list[dict]]):
        """After the loop: reward terms and info per trajectory from environments that score rollouts together
        (a verifiers rubric scores a prompt group at once), else None."""
        return self.user.finish(envs, groups, conversations) if self.user is not None else None


def check_environment_config(agent_cfg) -> None:
    """Start-up checks of ``rollout.agent``'s parser, tools and environment (one ConfigError line each)."""
    if agent_cfg.parser not in TOOL_PARSERS:
        raise ConfigError(f"rollout.agent.parser={agent_cfg.parser!r} is not registered; "
                          f"{TOOL_PARSERS.suggestion(agent_cfg.parser)}")
    for spec in agent_cfg.tools:
        if ":" not in spec and spec not in TOOLS.names():
            raise ConfigError(f"rollout.agent.tools entry {spec!r} is not a built-in tool ({TOOLS.suggestion(spec)}) "
                              f"nor path/to/file.py:function or package.module:function")
    try:
        Environments(agent_cfg).tools_of(None)
    except ConfigError:
        raise
    except (ValueError, OSError) as err:
        raise ConfigError(f"rollout.agent: {err}") from None
