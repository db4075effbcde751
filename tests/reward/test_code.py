"""The sandbox (rlplat.utils.sandbox) and the ``code`` reward that runs programs in it.

Every limit is checked by a program that breaks it: a loop, a memory hog, an output flood, a fork bomb, a
process that escapes its group, a write outside its directory, a network connection, a caller killed with
-9. The code reward's acceptance: right, wrong, crashing, looping, memory-hogging and flooding programs
each get their score within the limits, in the reward pool's worker processes, and scoring goes on.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from processes import all_gone, children

from rlplat.reward import REWARD_FUNCTIONS, build_reward_manager
from rlplat.reward.code import extract_program, parse_tests
from rlplat.utils.sandbox import SandboxLimits, isolation_report, run_python

# 5 s of wall clock for programs that finish: on a loaded machine (CI's two pytest workers) starting Python in
# the sandbox took over 1.5 s, and "print(input()[::-1])" timed out (fresh-clone run of 3417aa0); the deadline
# test has its own
LIMITS = SandboxLimits(timeout_s=5.0, memory_mb=256, max_output_bytes=4096)
DEADLINE = SandboxLimits(timeout_s=1.5, memory_mb=256, max_output_bytes=4096)
AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="the process-count limit and the own uid bind when started by root")


def test_a_program_reads_stdin_and_writes_stdout():
    result = run_python("print(input()[::-1])", "abc\n", LIMITS)
    assert (result.status, result.exit_code, result.stdout, result.stderr) == ("ok", 0, "cba\n", "")


@pytest.mark.parametrize("source, status, exit_code, stderr_end", [
    ("raise SystemExit(3)", "error", 3, ""),
    ("x = bytearray(1 << 30)", "error", 1, "MemoryError"),  # 1 GiB past a 256 MiB address space
    ("import ctypes; ctypes.string_at(0)", "killed", -signal.SIGSEGV, ""),
])
def test_failures_are_reported_with_their_cause(source, status, exit_code, stderr_end):
    result = run_python(source, "", LIMITS)
    assert (result.status, result.exit_code) == (status, exit_code)
    assert result.stderr.strip().endswith(stderr_end)


@pytest.mark.parametrize("source", ["while True: pass", "import time; time.sleep(60)"])
def test_a_program_past_its_time_is_killed_at_the_deadline(source):
    start = time.monotonic()
    result = run_python(source, "", DEADLINE)
    # "timeout": the wall clock stopped it (the CPU-time limit that backs it up, 2 s of CPU, says "killed"; the
    # sleeping program would run 60 s). How soon the sandbox returns after the deadline is the calling process's
    # own scheduling, not the sandbox's: 2.06 s once in CI beside the other test worker (1.50-1.51 s here with
    # four busy loops beside it), so the bound below only tells the deadline from a later one
    assert (result.status, result.exit_code) == ("timeout", None)
    assert 1.5 <= result.wall_s < 2 * 1.5 and time.monotonic() - start < 5


def test_output_past_the_limit_stops_the_program_and_keeps_the_first_bytes():
    result = run_python("while True: print('y' * 1000)", "", LIMITS)
    assert result.status == "output_limit" and result.wall_s < LIMITS.timeout_s  # stopped by the output, not the clock
    assert len(result.stdout) == 4096 and set(result.stdout) <= {"y", "\n"}


@needs_root
def test_a_fork_bomb_is_bounded_and_its_processes_are_gone_afterwards():
    bomb = ("import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time\n"
            "            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    print(n)\n")
    result = run_python(bomb, "", SandboxLimits(timeout_s=5, max_processes=16))
    assert result.ok and int(result.stdout) < 16
    uid_line = run_python("import os; print(os.getuid())", "", LIMITS)  # the next run has its full allowance
    assert uid_line.ok and int(uid_line.stdout) >= 61000


@needs_root
def test_a_process_that_escapes_its_group_is_killed_with_the_program():
    escape = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
              "print(os.getuid())\n")
    result = run_python(escape, "", LIMITS)
    assert result.ok and result.wall_s < 1.5
    uid = result.stdout.strip()
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _uid_of(pid) == uid]
    assert not left, f"processes of the sandbox's uid {uid} outlived it: {left}"


def _uid_of(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(line.split()[1] for line in status if line.startswith("Uid:"))
    except (OSError, StopIteration):
        return None


@needs_root
def test_started_by_root_the_program_cannot_write_the_callers_files(tmp_path):
    target = tmp_path / "owned_by_root.txt"
    target.write_text("keep")
    result = run_python(f"open({str(target)!r}, 'w').write('gone')", "", LIMITS)
    assert result.status == "error" and "PermissionError" in result.stderr
    assert target.read_text() == "keep"


# Whether this machine lets a process make a network namespace, probed apart from the sandbox (a child that
# calls unshare itself, as root or through a user namespace): a sandbox that fails to make one must fail the
# test below, not skip it, so the skip may not depend on the sandbox's own report.
NAMESPACE_PROBE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
NEWNET, NEWUSER = 0x40000000, 0x10000000
raise SystemExit(0 if libc.unshare(NEWNET) == 0 or libc.unshare(NEWUSER | NEWNET) == 0 else 1)
"""


def test_the_network_is_cut_where_the_machine_allows_a_namespace():
    if subprocess.run([sys.executable, "-c", NAMESPACE_PROBE]).returncode != 0:
        pytest.skip(f"no network namespace on this machine: {isolation_report()}")
    result = run_python("import socket\nsocket.create_connection(('10.255.255.1', 80), timeout=1)", "", LIMITS)
    assert result.status == "error" and "Network is unreachable" in result.stderr


# The caller runs a sandboxed program that sleeps, prints its pid, and is then killed with -9.
KILLED_CALLER = """
import sys
from rlplat.utils.sandbox import SandboxLimits, run_python
print("started", flush=True)
run_python("import os, time\\nprint(os.getpid(), flush=True)\\ntime.sleep(60)", "", SandboxLimits(timeout_s=60))
"""


def test_a_program_dies_with_its_killed_caller():
    caller = subprocess.Popen([sys.executable, "-c", KILLED_CALLER], stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 10
        while not (started := children(caller.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started
        time.sleep(0.3)  # the program is running
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    assert all_gone(started, within_s=5), "a sandboxed program outlived its caller"


def test_limits_are_checked():
    with pytest.raises(ValueError, match="memory_mb must be >= 64"):
        SandboxLimits(memory_mb=16)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        SandboxLimits(timeout_s=0)


# ------------------------------------------------------------------------------------------- the code reward
SUM_TESTS = json.dumps({"inputs": ["1 2\n", "3 4\n", "10 -3\n"], "outputs": ["3\n", "7\n", "7"]})
PROGRAMS = {  # response -> expected score against SUM_TESTS
    "right": ("Here it is:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```", 1.0),
    "wrong": ("```python\na, b = map(int, input().split())\nprint(a * b)\n```", 0.0),
    "right once": ("```python\na, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n```", 2 / 3),
    "crashing": ("```python\nraise RuntimeError('no')\n```", 0.0),
    "looping": ("```python\nwhile True:\n    pass\n```", 0.0),
    "memory hog": ("```python\nx = [0] * (10 ** 10)\n```", 0.0),
    "flooding": ("```python\nwhile True:\n    print('y' * 10000)\n```", 0.0),
}


def test_the_code_reward_scores_each_kind_of_program_in_the_reward_pool():
    # 3 s of wall clock per test: the looping program's cost. 1 s was too little on a loaded machine (CI, two
    # pytest workers and this pool's two): a right program's first test timed out starting Python, and scored 0
    manager = build_reward_manager({"functions": ["code"], "num_workers": 2, "timeout_s": 20,
                                    "code": {"timeout_s": 3.0, "memory_mb": 256, "max_output_bytes": 4096}})
    try:
        responses = [text for text, _ in PROGRAMS.values()]
        start = time.monotonic()
        result = manager.score(responses, ["code"] * len(responses), [SUM_TESTS] * len(responses),
                               [None] * len(responses), [10] * len(responses))
        elapsed = time.monotonic() - start
        assert result.num_errors == 0, result.first_error
        assert result.scores == pytest.approx([score for _, score in PROGRAMS.values()])
        assert result.extras["code/timeouts"] == [0, 0, 0, 0, 1, 0, 0]  # the loop stopped after its first test
        assert elapsed < 15
        again = manager.score([responses[0]], ["code"], [SUM_TESTS], [None], [10])  # the pool goes on
        assert again.scores == [1.0]
    finally:
        manager.close()


def test_all_or_nothing_scoring_and_the_other_test_forms():
    code = REWARD_FUNCTIONS.get("code").configured({"code": {"scoring": "all", "timeout_s": 2}})
    assert code("code", PROGRAMS["right once"][0], SUM_TESTS)["score"] == 0.0
    add = "def add(a, b):\n    print('chatter is fine')\n    return a + b\n"
    asserts = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
    assert code("code", add, json.dumps(asserts))["score"] == 1.0
    assert code("code", add, {"asserts": asserts + ["assert add(2, 2) == 5"]})["score"] == 0.0
    calls = {"fn_name": "add", "inputs": [[1, 2], [[1], [2]]], "outputs": [3, [1, 2]]}
    assert code("code", add, json.dumps(calls))["score"] == 1.0
    pairs = [{"input": "1 2", "output": "3"}]
    assert code("code", "print(sum(map(int, input().split())))", pairs)["acc"] == 1.0


def test_the_program_is_the_last_fenced_block():
    assert extract_program("a\n```python\nx = 1\n```\nthen\n```py\nx = 2\n```\n") == "x = 2\n"
    assert extract_program("```\nprint(3)\n```") == "print(3)\n"
    assert extract_program("print(4)") == "print(4)"


@pytest.mark.parametrize("ground_truth", ["not json", "[]", '{"inputs": ["1"], "outputs": []}', '[1, 2]', "{}"])
def test_tests_in_no_known_form_are_a_data_error_naming_the_forms(ground_truth):
    with pytest.raises(ValueError, match="stdin/stdout.*assert statements"):
        parse_tests(ground_truth)


def test_code_rows_are_routed_by_auto_with_the_configured_limits():
    manager = build_reward_manager({"functions": ["auto"], "isolation": "inprocess",
                                    "code": {"scoring": "all", "timeout_s": 1.0}})
    auto = manager.functions[0][0]
    assert auto.code.scoring == "all" and auto.code.limits.timeout_s == 1.0
    result = manager.score([PROGRAMS["right once"][0], "\\boxed{5}"], ["code/apps", "math"], [SUM_TESTS, "5"],
                           [None, None], [10, 10])
    assert result.scores == [0.0, 1.0]


@needs_root
def test_without_an_interpreter_the_sandbox_user_can_run_the_code_reward_stops_at_start_up(monkeypatch):
    import rlplat.utils.sandbox as sandbox
    from rlplat.reward import RewardConfigError

    monkeypatch.setattr(sandbox, "_runnable_by_others", lambda path: False)
    with pytest.raises(RewardConfigError, match=r"reward.functions\[0\]=code: .* no python3 in /usr/local/bin"):
        build_reward_manager({"functions": ["code"], "isolation": "inprocess"})


def test_the_scorer_docs_rewards_md_shows_scores_as_it_says(capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "rewards.md").read_text(encoding="utf-8")
    (code,) = [block for block in re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
               if block.startswith("from rlplat.reward.code import CodeScorer")]
    exec(code, {})
    assert capsys.readouterr().out.strip() == code.strip().splitlines()[-1].removeprefix("# ")
    assert REWARD_FUNCTIONS["code"].__class__.__name__ == "CodeScorer"  # the class the docs name
