"""One setting of another RL system and what it is in rlplat: a row of docs/migrating.md's tables."""

from __future__ import annotations

from dataclasses import dataclass

NO_EQUIVALENT = "no equivalent"
NOT_NEEDED = "not needed"


@dataclass(frozen=True)
class Knob:
    """``names``: every spelling of one setting (verl's dotted key, TRL's field, open-instruct's ``--flag``);
    ``name=value`` where the value decides what it becomes. ``ours``: the rlplat settings it becomes (``key``,
    ``key=value`` or ``group=preset``), none when rlplat has no such setting. ``note``: one line on the units and
    defaults that differ, or, without ``ours``, why there is none ("no equivalent: ...", or "not needed: ..." for
    what does not change training). ``convert``: the name of the value's conversion, when it is not carried over as
    it is (the note says how)."""

    names: tuple[str, ...]
    ours: tuple[str, ...]
    note: str
    convert: str | None = None

    def __post_init__(self):
        if not self.names:
            raise ValueError("a knob needs at least one name")
        if not self.ours and not self.note.startswith((NO_EQUIVALENT, NOT_NEEDED)):
            raise ValueError(f"{self.names[0]}: a knob without an rlplat setting says why "
                             f"('{NO_EQUIVALENT}: ...' or '{NOT_NEEDED}: ...')")

    @property
    def keys(self) -> tuple[str, ...]:
        """Its names without the deciding values (``loss_type=dapo`` -> ``loss_type``)."""
        return tuple(dict.fromkeys(name.split("=", 1)[0] for name in self.names))

    def hint(self) -> str:
        """What to use instead, in one line: rlplat's settings and the note, or the reason there is none."""
        if not self.ours:
            return f"rlplat has {self.note}" if self.note.startswith(NO_EQUIVALENT) else f"{self.note}"
        ours = f"rlplat's is {', '.join(self.ours)}"
        return f"{ours} ({self.note})" if self.note else ours
