"""What a run prints: a live progress bar with an ETA on a terminal, plain lines without control
characters in a file, and no third-party chatter (loading bars, Ray start-up lines) unless asked for."""

import os
import pty
import subprocess
import sys

import pytest

from rlplat.utils.quiet import QUIET_ENV

from .test_trainer import overrides


def command(out_dir, val_file, *extra):
    return [sys.executable, "-m", "rlplat.trainer.main", *overrides(out_dir, 3, val_file, *extra)]


def run_in_terminal(cmd) -> str:
    """Run ``cmd`` with a pseudo-terminal as its stdout and stderr; everything it wrote."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200"}
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=600) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_a_terminal_gets_a_progress_bar_with_an_eta(embedded_cache, small_val, tmp_path):
    pytest.importorskip("ray")  # Ray mode: the Quickstart's
    text = run_in_terminal(command(tmp_path / "tty", small_val))  # Ray mode, as the Quickstart runs
    assert "\x1b[" in text and "━" in text  # rich drew a bar
    assert "eta" in text and "3/3" in text and "reward" in text and "val acc" in text
    assert "Loading weights" not in text and "Started a local Ray instance" not in text  # quiet by default


def test_a_file_gets_plain_lines_without_control_characters(embedded_cache, small_val, tmp_path):
    log = tmp_path / "log.txt"
    with log.open("w") as f:
        subprocess.run(command(tmp_path / "file", small_val, "trainer.ray_address=inprocess"), stdout=f,
                       stderr=subprocess.STDOUT, check=True, timeout=600)
    text = log.read_text()
    assert "[progress] step 3/3 (100%) eta 0:00:00" in text
    assert not any(ch in text for ch in "\x1b\r"), [line for line in text.splitlines() if "\x1b" in line or "\r" in line]
    assert "Loading weights" not in text and "Writing model shards" not in text


def test_verbose_brings_third_party_output_back(embedded_cache, small_val, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in QUIET_ENV}  # an earlier in-process run set them here
    result = subprocess.run(command(tmp_path / "verbose", small_val, "trainer.ray_address=inprocess",
                                    "trainer.verbose=true", "trainer.progress=off"),
                            capture_output=True, text=True, check=True, timeout=600, env=env)
    assert "Loading weights" in result.stdout + result.stderr
    assert "[progress]" not in result.stdout
