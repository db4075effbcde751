"""Every trainer command printed in the README, the docs and ``--help`` passes ``--cfg job`` as written.

A command whose block shows the output ``rlplat: config error: ...`` on the next line must fail with
exactly that error instead.
"""

import importlib.util
import re
from collections import Counter
import shlex
from pathlib import Path

import pytest

from rlplat.config import ConfigError, load_config
from rlplat.trainer.run import load_run_config
from rlplat.trainer.main import USAGE

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ENTRY = "rlplat.trainer.main"


def _blocks(text: str) -> list[list[str]]:
    """The lines of each fenced code block, continuation lines (``\\``) joined."""
    blocks = []
    for body in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE):
        blocks.append(body.replace("\\\n", " ").splitlines())
    return blocks


def commands(text: str, where: str) -> list[tuple[str, list[str], str | None]]:
    """``(where, overrides, expected config error or None)`` for each trainer command in ``text``."""
    found = []
    for lines in _blocks(text):
        for i, line in enumerate(lines):
            if ENTRY not in line:
                continue
            command = line.split(ENTRY, 1)[1].split("#", 1)[0].split("&&", 1)[0]
            command = command.split(";", 1)[0].rstrip(") ")  # inside "time (...)" or a subshell
            args = [a for a in shlex.split(command) if a != "--cfg" and a != "job"]
            if any(a.startswith("-") or "[" in a for a in args):  # a usage synopsis, not a command
                continue
            after = lines[i + 1] if i + 1 < len(lines) else ""
            expected = after.split("...", 1)[0].strip() if after.startswith("rlplat: config error") else None
            found.append((f"{where}: {line.strip()}", args, expected))
    return found


ALL = [c for doc in DOCS for c in commands(doc.read_text(encoding="utf-8"), doc.name)]
ALL += commands(f"```\n{USAGE}\n```", "--help")


# How many trainer commands each document prints. Change it with the docs: a change to how blocks are read
# that drops (or invents) a command fails here instead of quietly testing fewer commands.
PRINTED = {"README.md": 4, "concepts.md": 2, "megatron.md": 1, "migrating.md": 3, "options.md": 3,
           "performance.md": 1, "report.md": 1, "rollout.md": 5, "troubleshooting.md": 7, "--help": 3}


def test_the_docs_print_commands():
    found = Counter(where.split(":", 1)[0] for where, _, _ in ALL)
    assert dict(sorted(found.items())) == dict(sorted(PRINTED.items()))
    assert sum(expected is not None for *_, expected in ALL) == 5  # commands shown with their config error


MISSING = re.compile(r"needs the package '([\w.]+)', which is not installed")


@pytest.mark.parametrize("where, args, expected", ALL, ids=[c[0][:80] for c in ALL])
def test_documented_command_validates(where, args, expected):
    """Commands for an optional engine (vLLM) run where its package is installed (CI's vLLM virtualenv
    runs this test too); the documented "not installed" error is checked where it is not."""
    optional = MISSING.search(expected or "")
    if optional and importlib.util.find_spec(optional.group(1)):
        pytest.skip(f"shows the error of a missing {optional.group(1)!r}, which is installed here")
    if expected is None:
        try:
            load_run_config(args)
        except ConfigError as err:
            missing = MISSING.search(str(err))
            if missing is None:
                raise
            pytest.skip(f"needs the optional package {missing.group(1)!r}")
    else:
        with pytest.raises(ConfigError) as err:
            load_run_config(args)
        assert f"rlplat: config error: {err.value}".startswith(expected)


@pytest.mark.parametrize("knob", ["rollout.n=4", "rollout.n=2", "data.train_batch_size_prompts=8",
                                  "trainer.workers_per_node=8", "data.train_batch_size_prompts=24"])
def test_one_knob_changes_keep_a_valid_config(knob):
    cfg, plan = load_config([knob])
    per_worker = cfg.actor.mini_batch_size_prompts * cfg.rollout.n // plan.world_size
    assert per_worker % cfg.actor.micro_batch_size_seqs_per_worker == 0


def test_sizes_set_explicitly_are_kept_and_checked():
    cfg, _ = load_config(["actor.micro_batch_size_seqs_per_worker=16"])
    assert cfg.actor.micro_batch_size_seqs_per_worker == 16 and cfg.critic.micro_batch_size_seqs_per_worker == 16
    with pytest.raises(ConfigError, match="actor.micro_batch_size_seqs_per_worker=48 must divide"):
        load_config(["actor.micro_batch_size_seqs_per_worker=48"])
