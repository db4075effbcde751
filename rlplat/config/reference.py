"""Print the config reference (every key, its type, default and meaning) as a Markdown table.

    python -m rlplat.config.reference              # schema defaults
    python -m rlplat.config.reference algorithm=dapo
    python -m rlplat.config.reference --write README.md   # refresh the README's table

The text comes from the schema's field comments, so the reference cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing

from omegaconf import OmegaConf

from rlplat.config.schema import RLPlatConfig

_FIELD = re.compile(r"^\s+(\w+): .*?(?:#\s*(.*))?$")


def _comments(cls: type) -> dict[str, str]:
    comments, pending = {}, []
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("# "))  # a comment line above a field describes it
            continue
        match = _FIELD.match(line)
        if match and not stripped.startswith(('"""', "def ", "@")):
            comments[match.group(1)] = " ".join(pending + [match.group(2) or ""]).strip()
        pending = []
    return comments


def _type_name(tp: typing.Any) -> str:
    text = str(tp) if typing.get_origin(tp) else getattr(tp, "__name__", str(tp))
    return text.replace("typing.", "").replace("NoneType", "None")


def rows(cls: type = RLPlatConfig, prefix: str = "", values=None) -> list[tuple[str, str, str, str]]:
    values = OmegaConf.structured(cls) if values is None else values
    hints, comments, out = typing.get_type_hints(cls), _comments(cls), []
    for f in dataclasses.fields(cls):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += rows(tp, f"{key}.", values[f.name])
            continue
        value = OmegaConf.to_container(values, resolve=False)[f.name]
        out.append((key, _type_name(tp), repr(value), comments.get(f.name, "")))
    return out


def markdown(overrides: list[str] | None = None) -> str:
    values = None
    if overrides:
        from rlplat.config.loader import compose_config

        values = compose_config(overrides)
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t} | `{d}` | {m.replace(' | ', ' / ')} |" for k, t, d, m in rows(values=values)]
    return "\n".join(lines)


START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def with_table(text: str) -> str:
    """``text`` with the table between the config-reference markers replaced by the current one."""
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{markdown()}\n{END}{tail}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        path = sys.argv[2]
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(with_table(text))
    else:
        print(markdown(sys.argv[1:]))
