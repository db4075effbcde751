"""rlplat's packages form one-way layers: a module imports only from its own layer or the ones below,
and no modules import each other in a circle. Every import counts, wherever it stands: module level,
inside a function, or under ``if TYPE_CHECKING``. :data:`LAYERS` lists them bottom to top (README "Layout").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlplat"

LAYERS = [
    ("rlplat", "rlplat.algorithms", "rlplat.protocol", "rlplat.registry", "rlplat.sequence", "rlplat.utils"),
    ("rlplat.config",),
    ("rlplat.data", "rlplat.reward", "rlplat.models", "rlplat.agents"),
    ("rlplat.engines",),
    ("rlplat.rollout",),
    ("rlplat.workers",),
    ("rlplat.controller",),
    ("rlplat.planner",),  # the run's plan, read from the engines' declarations before any worker starts
    ("rlplat.trainer",),
    ("rlplat.tools",),  # the command-line tools (export rebuilds a model from any checkpoint)
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> int:
    """The index of the longest layer prefix that names ``module`` or one of its packages."""
    best, depth = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    assert best is not None, f"{module} is in no layer: add its package to LAYERS"
    return best


def imported_modules(module: str, path: Path) -> set[str]:
    """The rlplat modules ``module`` imports, resolved to files (``from pkg import name`` is the module
    ``pkg.name`` when that is a file, else ``pkg``), plus the packages whose ``__init__`` the import runs."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for target in targets:
            if not target.startswith("rlplat"):
                continue
            while target and target not in MODULES:  # `import rlplat.x.y` of a name inside a module
                target = target.rpartition(".")[0]
            parts = target.split(".")
            for i in range(2, len(parts) + 1):  # the import runs each enclosing package's __init__ too
                name = ".".join(parts[:i])
                if name != module and not module.startswith(name + "."):
                    found.add(name)
    return found


GRAPH = {module: imported_modules(module, path) for module, path in MODULES.items()}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer(module)


def test_no_import_goes_up_a_layer():
    upward = sorted(
        f"{src} (layer {layer(src)}) imports {dst} (layer {layer(dst)})"
        for src, targets in GRAPH.items() for dst in targets if layer(dst) > layer(src)
    )
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that reach each other (size > 1, or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_import_cycles():
    cycles = strongly_connected(GRAPH)
    assert not cycles, "modules that import each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"a"}}, [["a"]]),
])
def test_cycle_finder(graph, expected):
    assert strongly_connected(graph) == expected


def test_the_checks_see_type_only_and_local_imports(tmp_path):
    source = tmp_path / "fake.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlplat.trainer.ppo import PPOTrainer\n"
                      "def f():\n    from ..engines import dist\n")
    assert imported_modules("rlplat.utils.fake", source) == {
        "rlplat.trainer", "rlplat.trainer.ppo", "rlplat.engines", "rlplat.engines.dist"}
    assert "rlplat.trainer.sft" in GRAPH["rlplat.trainer.run"]  # imported inside resolve_model_path()
