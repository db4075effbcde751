"""No block of five or more consecutive code lines is copied within the library: shared logic lives in one
function. Lines are compared without indentation and comments; imports and blank lines do not count."""

from __future__ import annotations

import io
import tokenize
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rlplat"
WINDOW = 5


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text without comments and indentation) of each line that holds code."""
    text = path.read_text()
    comments = {tok.start for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                if tok.type == tokenize.COMMENT}
    lines = []
    for number, line in enumerate(text.splitlines(), start=1):
        cut = next((col for (row, col) in comments if row == number), len(line))
        code = line[:cut].strip()
        if code and not code.startswith(("import ", "from ", ")", "]", "}")):
            lines.append((number, code))
    return lines


def repeated_blocks() -> list[str]:
    seen: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = code_lines(path)
        for i in range(len(lines) - WINDOW + 1):
            block = tuple(code for _, code in lines[i : i + WINDOW])
            seen[block].append(f"{path.relative_to(PACKAGE.parent)}:{lines[i][0]}")
    return [" = ".join(places) for places in seen.values() if len(places) > 1]


def test_no_block_is_repeated():
    repeats = repeated_blocks()
    assert not repeats, f"blocks of {WINDOW} lines that repeat:\n" + "\n".join(repeats)
