"""Every trainer command printed in the README, the docs and ``--help`` passes ``--cfg job`` as written.

A command whose block shows the output ``rlplat: config error: ...`` on the next line must fail with
exactly that error instead. Each ``rollout=vllm`` command also trains one step with tiny knobs where vllm
is installed; scripts/test.sh runs those (``-k vllm``) in the vLLM virtualenv, where a missing vllm fails.
"""

import importlib.util
import json
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlplat.config import ConfigError
from rlplat.planner import planned_device
from rlplat.trainer.run import load_run_config, run
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
            if any(a.startswith(("-", "[")) for a in args):  # a usage synopsis, not a command
                continue
            after = lines[i + 1] if i + 1 < len(lines) else ""
            expected = after.split("...", 1)[0].strip() if after.startswith("rlplat: config error") else None
            found.append((f"{where}: {line.strip()}", args, expected))
    return found


ALL = [c for doc in DOCS for c in commands(doc.read_text(encoding="utf-8"), doc.name)]
ALL += commands(f"```\n{USAGE}\n```", "--help")


# How many trainer commands each document prints. Change it with the docs: a change to how blocks are read
# that drops (or invents) a command fails here instead of quietly testing fewer commands.
PRINTED = {"README.md": 4, "agents.md": 1, "async.md": 5, "concepts.md": 2, "distillation.md": 2, "environments.md": 4,
           "long_context.md": 1, "lora.md": 2, "megatron.md": 1, "migrating.md": 6, "moe.md": 5, "options.md": 4,
           "performance.md": 1, "plan.md": 1, "report.md": 1, "rewards.md": 1, "rollout.md": 5, "troubleshooting.md": 7,
           "vision.md": 1, "--help": 3}


def test_the_docs_print_commands():
    found = Counter(where.split(":", 1)[0] for where, _, _ in ALL)
    assert dict(sorted(found.items())) == dict(sorted(PRINTED.items()))
    assert sum(expected is not None for *_, expected in ALL) == 6  # commands shown with their config error


MISSING = re.compile(r"needs the package '([\w.]+)', which is not installed")


def validates(args: list[str], skip_missing) -> None:
    """``args`` pass start-up validation as ``--cfg job`` validates them (a GPU run's config is planned for
    ``trainer.device=cuda`` on a machine without one), or the test skips (fails where required) for a missing
    engine."""
    try:
        load_run_config(args, planned_device(args))
    except ConfigError as err:
        missing = MISSING.search(str(err))
        if missing is None:
            raise
        skip_missing(missing.group(1))


@pytest.mark.parametrize("where, args, expected", ALL, ids=[c[0][:80] for c in ALL])
def test_documented_command_validates(where, args, expected, skip_missing):
    """Commands for an optional engine (vLLM) run where its package is installed (the vLLM virtualenv runs
    them in test_documented_vllm_command_runs); the documented "not installed" error is checked where it
    is not."""
    optional = MISSING.search(expected or "")
    if optional and importlib.util.find_spec(optional.group(1)):
        pytest.skip(f"shows the error of a missing {optional.group(1)!r}, which is installed here")
    if expected is None:
        validates(args, skip_missing)
    else:
        with pytest.raises(ConfigError) as err:
            load_run_config(args)
        assert f"rlplat: config error: {err.value}".startswith(expected)


def key(arg: str) -> str:
    return arg.split("=", 1)[0]


# Each documented rollout=vllm command (one of each set of arguments), run for one step with the knobs below
# replacing its own: its rollout.vllm.* and algorithm settings reach a real vLLM engine. Server mode needs
# a running server: tests/rollout/test_vllm_server.py runs it; here it is validated only.
VLLM = list({tuple(args): (where, args) for where, args, expected in ALL
             if "rollout=vllm" in args and expected is None}.values())


def one_step_knobs(model: str, data: str, out: Path) -> list[str]:
    """A tiny model, 2 prompts x 2 responses of up to 8 tokens, one worker, one step, in-process on CPU."""
    return [f"model.path={model}", f"data.train_files={data}", f"data.val_files={data}", "data.max_prompt_length=128",
            "data.max_response_length=8", "data.train_batch_size_prompts=2", "actor.mini_batch_size_prompts=2",
            "rollout.n=2", "rollout.val_n=1", "actor.micro_batch_size_seqs_per_worker=4",
            "actor.log_prob_micro_batch_size_seqs_per_worker=4", "ref.log_prob_micro_batch_size_seqs_per_worker=4",
            "critic.micro_batch_size_seqs_per_worker=4", "trainer.workers_per_node=1", "trainer.nnodes=1",
            "rollout.workers_per_node=1", "rollout.nnodes=1",
            "trainer.total_steps=1", "trainer.test_freq=0", "trainer.device=cpu", "trainer.ray_address=inprocess",
            "trainer.logger=[console,jsonl]",  # what the run logs to reaches no engine (trackers: the main venv's)
            f"trainer.output_dir={out}"]


TRAINED: dict[str, str] = {}  # the run settings (all but the output folder) of the commands trained so far -> where


@pytest.mark.slow
@pytest.mark.parametrize("where, args", VLLM, ids=[w[:80] for w, _ in VLLM])
def test_documented_vllm_command_runs(where, args, skip_missing, tiny_model_path, small_val, tmp_path):
    validates(args, skip_missing)  # as written
    if "rollout.mode=server" in args:
        return
    knobs = one_step_knobs(tiny_model_path, small_val, tmp_path)
    if "rollout.mode=separate" in args:  # a pool of rollout workers of its own: on Ray (a local cluster)
        knobs.remove("trainer.ray_address=inprocess")
    replaced = {key(k) for k in knobs}
    config = load_run_config([a for a in args if key(a) not in replaced] + knobs)
    settings = OmegaConf.to_container(config[0])  # interpolations left as written: only the output folder differs
    del settings["trainer"]["output_dir"]
    settings = json.dumps(settings, sort_keys=True)
    if settings in TRAINED:  # another documented command reaches the engine with the same settings: trained there
        pytest.skip(f"the same settings as {TRAINED[settings]!r}, trained for one step there")
    TRAINED[settings] = where
    summary = run(*config)
    assert summary["steps"] == 1
    step = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["step"] == 1 and step["timing/generate_s"] > 0 and step["response_length/mean"] > 0


def test_the_docs_print_vllm_commands():
    assert len(VLLM) == 10 and sum("rollout.mode=server" in args for _, args in VLLM) == 1
    assert sum("rollout.mode=separate" in args for _, args in VLLM) == 3


@pytest.mark.parametrize("knob", ["rollout.n=4", "rollout.n=2", "data.train_batch_size_prompts=8",
                                  "trainer.workers_per_node=8", "data.train_batch_size_prompts=24"])
def test_one_knob_changes_keep_a_valid_config(knob):
    cfg, plan = load_run_config([knob])
    per_worker = cfg.actor.mini_batch_size_prompts * cfg.rollout.n // plan.world_size
    assert per_worker % cfg.actor.micro_batch_size_seqs_per_worker == 0


def test_sizes_set_explicitly_are_kept_and_checked():
    cfg, _ = load_run_config(["actor.micro_batch_size_seqs_per_worker=16"])
    assert cfg.actor.micro_batch_size_seqs_per_worker == 16 and cfg.critic.micro_batch_size_seqs_per_worker == 16
    with pytest.raises(ConfigError, match="actor.micro_batch_size_seqs_per_worker=48 must divide"):
        load_run_config(["actor.micro_batch_size_seqs_per_worker=48"])


def test_the_docs_bare_python_without_rlplats_dependencies_says_which_python_to_use():
    # the docs print `python -m ...`: a Python whose site-packages lack rlplat's dependencies (-S: none at all), run
    # from the repository root, ends in one line that names the virtualenv, not in a traceback
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-S", "-m", ENTRY, "algorithm=grpo"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"rlplat: 'omegaconf' is not installed in this Python ({sys.executable}); rlplat's dependencies are in the "
        f"project's virtualenv: run `bash scripts/setup.sh`, then use `.venv/bin/python` (or `source "
        f".venv/bin/activate`, after which the docs' `python` is that one)"]
