"""verl's, TRL's and open-instruct's settings and rlplat's for each: one table per system (:mod:`.verl`, :mod:`.trl`,
:mod:`.open_instruct`), each a list of :class:`~rlplat.config.migration.knob.Knob`.

A setting of theirs given to rlplat gets rlplat's name for it, or the reason it has none, in its error
(``actor_rollout_ref.rollout.n=4`` -> "that is verl's name; rlplat's is rollout.n"). docs/migrating.md's tables
are rendered from these lists: ``python -m rlplat.config.migration --write`` rewrites them, and
``tests/config/test_migration_maps.py`` checks that the page shows what the lists hold and that every rlplat setting
they name loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlplat.config.migration.knob import NO_EQUIVALENT, NOT_NEEDED, Knob
from rlplat.config.migration.metrics import METRIC_TABLES
from rlplat.config.migration.open_instruct import OPEN_INSTRUCT, OPEN_INSTRUCT_DEFAULTS
from rlplat.config.migration.trl import TRL, TRL_DEFAULTS
from rlplat.config.migration.verl import VERL, VERL_DEFAULTS

TABLES: dict[str, list[Knob]] = {"verl": VERL, "TRL": TRL, "open-instruct": OPEN_INSTRUCT}
# each system's defaults that differ from rlplat's, as rlplat's overrides
DEFAULTS: dict[str, list[str]] = {"verl": VERL_DEFAULTS, "TRL": TRL_DEFAULTS, "open-instruct": OPEN_INSTRUCT_DEFAULTS}
DOC = Path(__file__).resolve().parents[3] / "docs" / "migrating.md"

__all__ = ["TABLES", "DEFAULTS", "Knob", "equivalent", "hint", "knobs_named", "render", "NO_EQUIVALENT", "NOT_NEEDED"]


def knobs_named(framework: str, key: str) -> list[Knob]:
    """The knobs of ``framework``'s table that ``key`` (a name, without a value) spells."""
    return [knob for knob in TABLES[framework] if key in knob.keys]


def equivalent(key: str) -> tuple[str, str] | None:
    """``(framework, hint)`` when ``key`` (a Hydra override's key; a leading ``+`` or ``++`` is ignored; an
    open-instruct flag with or without its ``--``) is a verl, TRL or open-instruct setting: the hint names rlplat's
    settings or says why there are none. None otherwise."""
    key = key.lstrip("+")
    flag = key if key.startswith("--") else f"--{key}"
    for framework, name in (("verl", key), ("TRL", key), ("open-instruct", flag)):
        if knobs := knobs_named(framework, name):
            return framework, hint(knobs)
    return None


def hint(knobs: list[Knob]) -> str:
    """What to use instead of the setting these rows spell: the row's hint, or each value's row's in turn."""
    if len(knobs) == 1 and "=" not in knobs[0].names[0]:
        return knobs[0].hint()
    # the value decides: each value's knob in turn
    return "by its value: " + "; ".join(f"{' / '.join(knob.names)}: {knob.hint()}" for knob in knobs)


def render(framework: str, metrics: bool = False) -> str:
    """``framework``'s table of settings (``metrics``: of metric names) as docs/migrating.md shows it."""
    what = "metric" if metrics else "setting"
    rows = [f"| {framework} {what} | rlplat {what} | notes |", "|---|---|---|"]
    for knob in (METRIC_TABLES if metrics else TABLES)[framework]:
        names = ", ".join(f"`{name}`" for name in knob.names)
        if knob.ours:
            rows.append(f"| {names} | {', '.join(f'`{setting}`' for setting in knob.ours)} | {_cell(knob.note)} |")
        else:
            kind, _, why = knob.note.partition(":")
            rows.append(f"| {names} | {kind} | {_cell(why.strip())} |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _marks(framework: str, metrics: bool = False) -> tuple[str, str]:
    kind = "metrics" if metrics else "table"
    start = f"<!-- {kind}: {framework} (python -m rlplat.config.migration --write) -->"
    return start, f"<!-- end of {kind}: {framework} -->"


def rendered_doc(text: str) -> str:
    """docs/migrating.md's ``text`` with each system's tables of settings and of metrics (between their marks)
    rendered anew."""
    for framework in TABLES:
        for metrics in (False, True):
            start, end = _marks(framework, metrics)
            if start not in text or end not in text:
                raise ValueError(f"docs/migrating.md has no marks for {framework}: {start} ... {end}")
            before, rest = text.split(start, 1)
            text = f"{before}{start}\n{render(framework, metrics)}\n{end}{rest.split(end, 1)[1]}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlplat.config.migration", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite docs/migrating.md's tables from the lists")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    new = rendered_doc(text)
    if args.write:
        DOC.write_text(new, encoding="utf-8")
        print(f"wrote {DOC}" if new != text else f"{DOC} is up to date")
        return 0
    print("docs/migrating.md's tables are up to date" if new == text else
          "docs/migrating.md's tables differ from the lists: python -m rlplat.config.migration --write")
    return 0 if new == text else 1
