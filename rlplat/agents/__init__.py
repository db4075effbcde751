"""Agents: the tools a model may call and the parsers that find its tool calls.

:mod:`rlplat.agents.tools` (the ``Tool`` interface, the built-in ``calculator`` and sandboxed ``python``,
user functions as tools, :func:`call_tool` that turns every failure into an observation) and
:mod:`rlplat.agents.parsers` (``hermes`` and ``llama3_json`` tool-call formats).
"""

from rlplat.agents.parsers import TOOL_PARSERS, ParsedMessage
from rlplat.agents.tools import TOOLS, Tool, ToolCall, ToolError, ToolResult, call_tool, function_tool

__all__ = ["TOOLS", "TOOL_PARSERS", "ParsedMessage", "Tool", "ToolCall", "ToolError", "ToolResult", "call_tool",
           "function_tool"]
