"""The prompt ledger: which prompt groups (uids ``p0``, ``p1``, ...) the run has trained on, kept in every
checkpoint (``trainer.json`` ``"ledger"``), so a resumed run, asynchronous or not, can be checked to train on
every drawn prompt group once: never twice (a step that would is stopped), and none skipped except the
groups that dynamic sampling filtered out or that were still in flight at the end of the run.

Uids are numbered in the order prompts are drawn, and trained mostly in that order, so the ledger keeps
sorted, disjoint ``[start, end)`` ranges of uid numbers: a whole run is one range.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from rlplat.utils.errors import RunError


class PromptLedger:
    def __init__(self, ranges: Iterable[Iterable[int]] = ()):
        self.ranges: list[list[int]] = [list(r) for r in ranges]

    def __contains__(self, number: int) -> bool:
        at = bisect.bisect_right(self.ranges, [number, float("inf")]) - 1
        return at >= 0 and self.ranges[at][0] <= number < self.ranges[at][1]

    def count(self) -> int:
        """The prompt groups trained on so far."""
        return sum(end - start for start, end in self.ranges)

    def record(self, uids: Iterable[str], step: int) -> None:
        """Add a step's prompt groups (each uid once, however many rows it has); :class:`RunError` when one
        of them was already trained on."""
        numbers = sorted({int(uid.removeprefix("p")) for uid in uids})
        again = [n for n in numbers if n in self]
        if again:
            raise RunError(f"step {step} would train prompt group p{again[0]} again ({len(again)} groups trained on "
                           f"before); the prompt ledger stops the run (a bug: please report it)")
        for number in numbers:
            self._add(number)

    def _add(self, number: int) -> None:
        at = bisect.bisect_right(self.ranges, [number, float("inf")])
        before = self.ranges[at - 1] if at > 0 else None
        after = self.ranges[at] if at < len(self.ranges) else None
        if before is not None and before[1] == number:
            before[1] += 1
            if after is not None and after[0] == before[1]:  # the gap closed: merge
                before[1] = after[1]
                del self.ranges[at]
        elif after is not None and after[0] == number + 1:
            after[0] = number
        else:
            self.ranges.insert(at, [number, number + 1])

    def state(self) -> list[list[int]]:
        return [list(r) for r in self.ranges]
