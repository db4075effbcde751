"""Turn a verl, TRL or open-instruct GRPO command into rlplat's.

    python -m rlplat.tools.migrate --from verl run_qwen2-7b.sh          # a script: its launch line, variables expanded
    python -m rlplat.tools.migrate --from verl config.yaml              # a YAML of verl's keys (nested or dotted)
    python -m rlplat.tools.migrate --from open-instruct -- --beta 0.01 --learning_rate 5e-7 ...
    python -m rlplat.tools.migrate --from trl train_grpo.py --num_processes 8   # GRPOConfig(...), GRPOTrainer(...)
    python -m rlplat.tools.migrate --from trl -- --learning_rate 1e-6 --num_generations 8 ...

Prints ``python -m rlplat.trainer.main ...`` with rlplat's setting for each of theirs (units converted where they
differ: episodes and epochs to steps, per-device to global batches), then, as comments, what needs a hand
(a hub dataset to write as parquet, a Python reward function) and what is not carried over, with the reason. The
tables it reads are docs/migrating.md's (``rlplat/config/migration/``). Settings the command does not give keep
rlplat's defaults, which differ from theirs in places: the tables' notes say where.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rlplat.config.migration import DEFAULTS, Knob, hint, knobs_named
from rlplat.config.migration.convert import CONVERSIONS, ByHand, Theirs, hydra_value, literal
from rlplat.utils.tracking import flatten

FRAMEWORKS = {"verl": "verl", "trl": "TRL", "open-instruct": "open-instruct", "open_instruct": "open-instruct"}
# the word that marks each system's launch line in a shell script
LAUNCHERS = {"verl": ("verl.trainer.main", "main_ppo"), "open-instruct": ("grpo_fast",), "TRL": ("grpo",)}
_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_VERL_OVERRIDE = re.compile(r"^\+{0,2}([A-Za-z_][\w.]*)=(.*)$", re.DOTALL)


class Code(str):
    """A Python expression that is not a literal (``reward_funcs=[accuracy_reward]``): its source text."""


@dataclass
class Migration:
    """What one command becomes: rlplat's overrides in order, and the settings that need a hand or have none."""

    overrides: dict[str, str] = field(default_factory=dict)
    by_hand: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    defaults: list[str] = field(default_factory=list)

    def set(self, entries: list[str]) -> None:
        for entry in entries:
            key, _, value = entry.partition("=")
            self.overrides.pop(key, None)  # a later setting of the same key wins, and moves to the end
            self.overrides[key] = value

    def their_defaults(self, defaults: list[str]) -> None:
        """Their system's defaults where rlplat's differ, for the keys the command does not set."""
        self.defaults = [entry for entry in defaults if entry.split("=", 1)[0] not in self.overrides]

    def command(self) -> str:
        head = [] if "algorithm" in self.overrides else ["algorithm=grpo"]  # their GRPO documentation's preset
        if "trainer.device" not in self.overrides:
            head.append("trainer.device=cuda")  # their runs are GPU runs (verl's default device is cuda)
        entries = head + self.defaults + [f"{key}={value}" for key, value in self.overrides.items()]
        lines = ["python -m rlplat.trainer.main"] + [_quoted(entry) for entry in entries]
        return " \\\n    ".join(lines)


def _quoted(entry: str) -> str:
    """``entry`` as one shell word: as it is where that is safe, in double quotes where it holds single quotes
    (a mixture's weights: data.train_files="[a.parquet,'1.0']"), else in single quotes."""
    if "'" in entry and not any(c in entry for c in '"$`\\!'):
        return f'"{entry}"'
    return shlex.quote(entry)


# --- reading their command --------------------------------------------------------------------------------------

def shell_command(text: str, framework: str) -> list[str]:
    """The launch line of a shell script, its continuation lines joined and the script's own variables (and the
    environment's) expanded; ``$@`` and unknown variables are left out."""
    text = text.replace("\\\n", " ")
    try:
        return _launch_words(text, framework)
    except ValueError as err:  # shlex: an unclosed quote
        raise SystemExit(f"rlplat migrate: the script's launch line does not parse as shell words: {err}") from None


def _launch_words(text: str, framework: str) -> list[str]:
    variables: dict[str, str] = {}
    launch = None
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith("#") or not line:
            continue
        if match := _ASSIGNMENT.match(line):
            value = shlex.split(match.group(2))[0] if match.group(2).strip() else ""
            variables[match.group(1)] = _expand(value, variables)
        elif any(word in line for word in LAUNCHERS[framework]) and (launch is None or len(line) > len(launch)):
            launch = line
    if launch is None:
        raise SystemExit(f"rlplat migrate: no {framework} launch line (one naming {' or '.join(LAUNCHERS[framework])})"
                         " in the script")
    return [token for token in shlex.split(_expand(launch, variables)) if token not in ("$@", '"$@"')]


def _expand(text: str, variables: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        known = variables.get(name, os.environ.get(name))
        return known if known is not None else (default if default is not None else match.group(0))
    return _VARIABLE.sub(value, text)


def verl_settings(tokens: list[str]) -> dict[str, object]:
    return {match.group(1): match.group(2) for token in tokens if (match := _VERL_OVERRIDE.match(token))}


def flag_settings(tokens: list[str], dashes: bool) -> dict[str, object]:
    """``--flag value``, ``--flag v1 v2`` (a list), ``--flag`` (True) and ``--flag=value`` forms; words before
    the first flag (the launcher, the script) and a script path after a launcher's flags are left out. The keys
    keep their ``--`` when ``dashes``."""
    settings: dict[str, object] = {}
    name, values = None, []

    def close():
        if name is not None:
            settings[name if dashes else name[2:]] = "True" if not values else values[0] if len(values) == 1 \
                else list(values)
    for token in tokens:
        if token.startswith("--"):
            close()
            name, _, value = token.partition("=")
            values = [value] if value else []
        elif name is not None and not token.endswith(".py"):
            values.append(token)
        else:  # a program word, or the script after the launcher's own flags
            close()
            name, values = None, []
    close()
    return settings


def python_settings(source: str, path: str) -> dict[str, object]:
    """The keyword arguments of a script's ``GRPOConfig(...)`` and ``GRPOTrainer(...)`` calls (``args=`` left out):
    literals as values, other expressions as :class:`Code`."""
    settings: dict[str, object] = {}
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as err:
        raise SystemExit(f"rlplat migrate: {path}: line {err.lineno}: {err.msg}") from None
    for node in ast.walk(tree):
        called = getattr(node.func, "id", getattr(node.func, "attr", None)) if isinstance(node, ast.Call) else None
        if called not in ("GRPOConfig", "GRPOTrainer"):
            continue
        for keyword in node.keywords:
            if keyword.arg not in (None, "args"):
                settings[keyword.arg] = _python_value(keyword.value)
        if node.args and called == "GRPOTrainer":
            settings.setdefault("model", _python_value(node.args[0]))
    return settings


def _python_value(node: ast.AST) -> object:
    """A literal's value; a ``LoraConfig(...)`` call's literal arguments as a dict; else its source
    (:class:`Code`)."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "LoraConfig":
        return {keyword.arg: _python_value(keyword.value) for keyword in node.keywords if keyword.arg}
    try:
        return ast.literal_eval(node)
    except ValueError:
        return Code(ast.unparse(node))


def file_settings(path: Path, framework: str) -> dict[str, object]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return python_settings(text, str(path))
    if path.suffix in (".yaml", ".yml", ".json"):
        import yaml

        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise SystemExit(f"rlplat migrate: {path}: not YAML: {str(err).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise SystemExit(f"rlplat migrate: {path}: expected a mapping of settings, got {type(loaded).__name__}")
        flat = flatten(loaded) if framework == "verl" else loaded
        return {f"--{key}" if framework == "open-instruct" else key: value for key, value in flat.items()}
    return command_settings(shell_command(text, framework), framework)


def command_settings(tokens: list[str], framework: str) -> dict[str, object]:
    if framework == "verl":
        return verl_settings(tokens)
    settings = flag_settings(tokens, dashes=framework == "open-instruct")
    config = settings.pop("config", None) if framework == "TRL" else None
    return {**(file_settings(Path(config), framework) if config else {}), **settings}


# --- turning them into rlplat's ---------------------------------------------------------------------------------

def knob_for(framework: str, name: str, value: object) -> Knob | None | list[Knob]:
    """The row of ``name`` given ``value``: the row that names the value (``loss_type=dapo``) if any, else the one
    without a value; the rows themselves when the value decides and none names it."""
    knobs = knobs_named(framework, name)
    if not knobs:
        return None
    spelled = str(literal(value)).lower() if not isinstance(value, Code) else "<callable>"
    for knob in knobs:
        if any(n.split("=", 1)[1].lower() == spelled for n in knob.names if n.startswith(f"{name}=")):
            return knob
    plain = [knob for knob in knobs if name in knob.names]
    return plain[0] if len(plain) == 1 else knobs


def migrate(settings: dict[str, object], framework: str) -> Migration:
    """rlplat's overrides for ``settings`` (``name -> value`` in their system's spelling): plain rows first,
    then the rows for a setting's value (more specific), then the conversions, whose units read the other settings;
    a later one wins a key."""
    theirs = Theirs(framework, settings)
    result, by_value, converted = Migration(), [], []
    for name, value in settings.items():
        shown = f"{name}={hydra_value(value) if not isinstance(value, Code) else value}"
        knob = knob_for(framework, name, value)
        if knob is None:
            result.unknown.append(shown)
        elif isinstance(knob, list):
            result.by_hand.append(f"{shown}: {hint(knob)}")
        elif not knob.ours:
            result.dropped.append(f"{shown}: {knob.hint()}")
        elif knob.convert:
            converted.append((knob, value, shown))
        elif literal(value) is False and all("=" in entry for entry in knob.ours) and name in knob.names:
            continue  # a switch that is off: its rlplat settings are for when it is on
        elif name in knob.names:
            result.set([entry if "=" in entry else f"{entry}={_value_for(entry, value)}" for entry in knob.ours])
        else:  # the row of this value (filter_overlong_prompts=True): more specific than a plain row
            by_value.append([entry for entry in knob.ours if "=" in entry])
            if given := [entry for entry in knob.ours if "=" not in entry]:  # their value named the mode only
                result.by_hand.append(f"{shown}: give {', '.join(given)} ({knob.note})")
    for entries in by_value:
        result.set(entries)
    for knob, value, shown in converted:
        try:
            result.set(CONVERSIONS[knob.convert](knob, value, theirs))
        except ByHand as need:
            result.set(need.overrides)
            result.by_hand.append(f"{shown}: {need}")
        except (TypeError, ValueError, ZeroDivisionError):
            result.by_hand.append(f"{shown}: the value does not convert; {knob.hint()}")
    return result


@functools.cache
def _list_keys() -> frozenset[str]:
    """rlplat's keys the schema declares lists (not an ``Any`` that takes one value or several)."""
    from rlplat.config.reference import rows

    return frozenset(key for key, kind, *_ in rows() if kind.startswith("list"))


def _value_for(key: str, value: object) -> str:
    """``value`` as rlplat's ``key`` takes it: a single value given to a list setting becomes a one-item list
    (verl's ``external_lib=pkg`` is ``trainer.imports=[pkg]``)."""
    if key in _list_keys() and not isinstance(literal(value), (list, tuple)):
        return hydra_value([value])
    return hydra_value(value)


def report(result: Migration, framework: str, total: int) -> str:
    carried = total - len(result.by_hand) - len(result.dropped) - len(result.unknown)
    lines = [f"# from {framework}: {total} settings; {carried} carried over, {len(result.by_hand)} need a hand, "
             f"{len(result.dropped)} have no rlplat setting, {len(result.unknown)} are not in the {framework} table"]
    if result.defaults:
        lines.append(f"# {', '.join(result.defaults)}: {framework}'s defaults where rlplat's differ (--no-defaults "
                     "leaves them out)")
    lines.append(result.command())
    for title, entries in (("by hand", result.by_hand), ("not carried over", result.dropped),
                           (f"not in rlplat's {framework} table (docs/migrating.md): check the spelling",
                            result.unknown)):
        if entries:
            lines.append(f"# {title}:")
            lines += [f"#   {entry}" for entry in entries]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlplat.tools.migrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="framework", required=True, choices=sorted(FRAMEWORKS),
                        help="the system the command is for")
    parser.add_argument("--no-defaults", action="store_true",
                        help="leave out their defaults where rlplat's differ (rlplat's own apply then)")
    parser.add_argument("source", nargs=argparse.REMAINDER,
                        help="a script, YAML or Python file (.sh, .yaml, .py), then (or only) their command line")
    args = parser.parse_args(argv)
    framework = FRAMEWORKS[args.framework]
    source = args.source[1:] if args.source[:1] == ["--"] else args.source
    if not source:
        parser.error("give a file, or the command after --")
    settings: dict[str, object] = {}
    if source[0].endswith((".sh", ".yaml", ".yml", ".json", ".py")) and "=" not in source[0]:
        path = Path(source[0])
        if not path.is_file():
            raise SystemExit(f"rlplat migrate: {path}: no such file")
        settings, source = file_settings(path, framework), source[1:]  # what follows the file adds to it
    settings.update(command_settings(source, framework) if source else {})
    if not settings:
        raise SystemExit(f"rlplat migrate: no {framework} settings found in {' '.join(source)[:200]!r}")
    result = migrate(settings, framework)
    if not args.no_defaults:
        result.their_defaults(DEFAULTS[framework])
    print(report(result, framework, len(settings)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
