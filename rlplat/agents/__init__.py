"""Agents: environments, the tools a model may call, the parsers that find its tool calls, and token-exact
trajectories.

:mod:`rlplat.agents.environment` (the ``Environment`` interface: ``reset(row)`` / ``step(message)``, the
tool environment, user environments from files), :mod:`rlplat.agents.tools` (the ``Tool`` interface, the built-in ``calculator`` and sandboxed ``python``,
user functions as tools, :func:`call_tool` that turns every failure into an observation),
:mod:`rlplat.agents.parsers` (``hermes`` and ``llama3_json`` tool-call formats),
:mod:`rlplat.agents.trajectory` (sampled ids and observation suffixes, the loss mask, the drift check) and
:mod:`rlplat.agents.setup` (tools and each row's environment from ``rollout.agent``, and their start-up checks).
"""

from rlplat.agents.environment import Environment, Step, ToolEnvironment, load_environment
from rlplat.agents.parsers import TOOL_PARSERS, ParsedMessage
from rlplat.agents.tools import TOOLS, Tool, ToolCall, ToolError, ToolResult, call_tool, function_tool
from rlplat.agents.trajectory import Drift, Segment, TemplateNotIncremental, Trajectory, retokenize_drift

__all__ = ["TOOLS", "TOOL_PARSERS", "Drift", "Environment", "ParsedMessage", "Step", "ToolEnvironment",
           "load_environment", "Segment", "TemplateNotIncremental", "Tool", "ToolCall",
           "ToolError", "ToolResult", "Trajectory", "call_tool", "function_tool", "retokenize_drift"]
