import itertools
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from rlplat.data import DataError, builtin_path, generate, resolve_files, write_parquet
from rlplat.data.synthetic import main, task_digest

REPO = Path(__file__).resolve().parents[2]


def check_schema(rows, source, split):
    for i, row in enumerate(rows):
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == source and isinstance(row["ability"], str)
        assert [set(m) for m in row["prompt"]] == [{"role", "content"}] and row["prompt"][0]["role"] == "user"
        assert row["reward_model"]["style"] == "rule" and isinstance(row["reward_model"]["ground_truth"], str)
        assert row["extra_info"]["index"] == i and row["extra_info"]["split"] == split


def solve(content):
    """Parse ``a+b=`` / ``a-b=`` and compute the answer independently of the generator."""
    a, op, b = re.fullmatch(r"(\d+)([+-])(\d+)=", content).groups()
    return int(a), op, int(b), int(a) + int(b) if op == "+" else int(a) - int(b)


def prompts(rows):
    return [row["prompt"][0]["content"] for row in rows]


@pytest.mark.parametrize("options", [{}, {"ops": "+-"}, {"digits": 3, "ops": "+-"}, {"digits": 1}])
def test_arithmetic_answers_schema_and_determinism(options):
    rows = generate("arithmetic", 300, seed=3, **options)
    check_schema(rows, "rlplat/arithmetic", "train")
    assert rows == generate("arithmetic", 300, seed=3, **options)
    assert prompts(rows) != prompts(generate("arithmetic", 300, seed=4, **options))
    top = 10 ** options.get("digits", 2)
    for content, truth in zip(prompts(rows), (r["reward_model"]["ground_truth"] for r in rows)):
        a, op, b, answer = solve(content)
        assert truth == str(answer) and answer >= 0 and a < top and b < top and op in options.get("ops", "+")
    if "-" in options.get("ops", "+"):
        assert {solve(p)[1] for p in prompts(rows)} == {"+", "-"}


@pytest.mark.parametrize("options, train_num", [({}, 20_000), ({"ops": "+-"}, 5000), ({"digits": 3}, 5000)])
def test_arithmetic_test_split_never_repeats_a_train_problem(options, train_num):
    train = set(prompts(generate("arithmetic", train_num, seed=0, **options)))
    test = prompts(generate("arithmetic", 256, seed=1, split="test", **options))
    assert len(set(test)) == 256 and not train & set(test)
    other_seed = set(prompts(generate("arithmetic", train_num, seed=7, **options)))
    assert not other_seed & set(test)  # the held-out problems do not depend on the train seed


def test_arithmetic_repeats_evenly_once_every_train_problem_is_used():
    # 1 digit "+": 100 problems, 50 held out for test -> 50 train problems; 120 rows use each 2 or 3 times.
    rows = generate("arithmetic", 120, seed=0, digits=1)
    counts = Counter(prompts(rows))
    assert len(counts) == 50 and set(counts.values()) == {2, 3}
    assert not set(counts) & set(prompts(generate("arithmetic", 50, seed=0, split="test", digits=1)))


def reachable(numbers, target):
    """Every value of every parenthesisation of every order of ``numbers`` under + - *."""

    def values(nums):
        if len(nums) == 1:
            return {nums[0]}
        out = set()
        for i in range(1, len(nums)):
            for x in values(nums[:i]):
                for y in values(nums[i:]):
                    out |= {x + y, x - y, x * y}
        return out

    return any(target in values(list(order)) for order in itertools.permutations(numbers))


@pytest.mark.parametrize("options", [{}, {"count": 4, "max_number": 9}])
def test_countdown_targets_are_reachable_with_the_stored_numbers(options):
    rows = generate("countdown", 60, seed=0, **options)
    check_schema(rows, "rlplat/countdown", "train")
    assert rows == generate("countdown", 60, seed=0, **options)
    count, high = options.get("count", 3), options.get("max_number", 20)
    for row in rows:
        info = row["extra_info"]
        assert len(info["numbers"]) == count and all(1 <= n <= high for n in info["numbers"])
        assert 1 <= info["target"] <= 100 and row["reward_model"]["ground_truth"] == str(info["target"])
        assert reachable(info["numbers"], info["target"])
        assert sorted(map(int, re.findall(r"\d+", info["solution"]))) == sorted(info["numbers"])
    assert not reachable([2, 3], 7)  # the brute force can say no


def test_countdown_prompt_text_with_and_without_think_format():
    plain = generate("countdown", 5, seed=0)
    think = generate("countdown", 5, seed=0, think_format=True)
    for a, b in zip(plain, think):
        numbers, target = a["extra_info"]["numbers"], a["extra_info"]["target"]
        assert a["extra_info"] == b["extra_info"]  # same problems, only the instructions differ
        text, think_text = a["prompt"][0]["content"], b["prompt"][0]["content"]
        listed = ", ".join(map(str, numbers))
        assert f"[{listed}]" in text and f"make {target}." in text and "expression only" in text
        assert "<think>" not in text and "<answer>" not in text
        assert f"[{listed}]" in think_text and f"equals {target}." in think_text
        assert "<think></think>" in think_text and "<answer></answer>" in think_text


@pytest.mark.parametrize("digits", [3, 5])
def test_tool_arithmetic_products_splits_and_tools(digits):
    from rlplat.reward import REWARD_FUNCTIONS

    rows = generate("tool_arithmetic", 400, seed=2, digits=digits)
    check_schema(rows, "rlplat/tool_arithmetic", "train")
    assert rows == generate("tool_arithmetic", 400, seed=2, digits=digits)
    for row in rows:
        a, b = map(int, re.fullmatch(r"(\d+)\*(\d+)=", row["prompt"][0]["content"]).groups())
        assert 10 ** (digits - 1) <= min(a, b) and max(a, b) < 10**digits
        assert row["reward_model"]["ground_truth"] == str(a * b) and row["extra_info"]["tools"] == ["calculator"]
        assert len(str(a * b)) == 2 * digits  # one answer length
    test = generate("tool_arithmetic", 100, seed=1, split="test", digits=digits)
    assert len(set(prompts(test))) == 100 and not set(prompts(rows)) & set(prompts(test))
    auto = REWARD_FUNCTIONS.get("auto")  # scored by the arithmetic rules: the exact product
    assert auto("rlplat/tool_arithmetic", rows[0]["reward_model"]["ground_truth"], rows[0]["reward_model"]["ground_truth"], None) == 1.0
    with pytest.raises(DataError, match="option digits must be an integer from 2 to 9"):
        generate("tool_arithmetic", 5, 0, digits=1)


def test_more_tool_problems_than_exist_repeat_rather_than_hang():
    rows = generate("tool_arithmetic", 6000, seed=0, digits=2)  # 68 x 68 operand pairs, 1 in 100 held out
    assert len(rows) == 6000 and len(set(prompts(rows))) <= 68 * 68


def test_bad_options_are_named():
    with pytest.raises(DataError, match=r"arithmetic: unknown option 'digit'; did you mean 'digits'\?"):
        generate("arithmetic", 5, 0, digit=3)
    with pytest.raises(DataError, match=r"option ops must be '\+', '-' or '\+-', got '\*'"):
        generate("arithmetic", 5, 0, ops="*")
    with pytest.raises(DataError, match="option count must be an integer >= 2"):
        generate("countdown", 5, 0, count=1)
    with pytest.raises(DataError, match="split must be one of"):
        generate("countdown", 5, 0, split="val")


def test_write_parquet_is_atomic(tmp_path):
    target = tmp_path / "sub" / "a.parquet"
    write_parquet(generate("arithmetic", 10, 0), target)
    assert [p.name for p in target.parent.iterdir()] == ["a.parquet"]
    assert pd.read_parquet(target)["prompt"].map(len).tolist() == [1] * 10
    before = target.read_bytes()
    with pytest.raises(Exception):  # pyarrow cannot store an arbitrary object
        write_parquet([{"data_source": "s", "prompt": object()}], target)
    assert [p.name for p in target.parent.iterdir()] == ["a.parquet"] and target.read_bytes() == before
    with pytest.raises(DataError, match="no rows to write"):
        write_parquet([], tmp_path / "empty.parquet")
    assert not (tmp_path / "empty.parquet").exists()


def test_builtin_path_caches_under_cache_dir(tmp_path, monkeypatch):
    path = builtin_path("countdown", "test", cache_dir=tmp_path, num=20)
    assert path == tmp_path / "data" / f"countdown-test-20-1-{task_digest('countdown')}.parquet"
    frame = pd.read_parquet(path)
    assert len(frame) == 20 and set(frame["extra_info"].map(lambda e: e["split"])) == {"test"}
    path.write_bytes(b"stale")  # an existing file is reused, never regenerated
    assert builtin_path("countdown", "test", cache_dir=tmp_path, num=20).read_bytes() == b"stale"
    monkeypatch.setenv("RLPLAT_CACHE", str(tmp_path / "env"))
    assert builtin_path("arithmetic", "test") == tmp_path / "env" / "data" / f"arithmetic-test-256-1-{task_digest('arithmetic')}.parquet"
    with pytest.raises(DataError, match="split must be one of"):
        builtin_path("arithmetic", "validation", cache_dir=tmp_path)


def test_resolve_files(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPLAT_CACHE", str(tmp_path / "cache"))
    own = str(write_parquet(generate("arithmetic", 4, 0), tmp_path / "own.parquet"))
    (builtin,) = resolve_files("builtin:arithmetic", "test")
    assert builtin == str(tmp_path / "cache" / "data" / f"arithmetic-test-256-1-{task_digest('arithmetic')}.parquet")
    assert resolve_files([own, "builtin:arithmetic"], "test") == [own, builtin]
    assert resolve_files(Path(own), "train") == [own]
    with pytest.raises(DataError, match=r"^data.val_files: no such parquet file 'nope.parquet'$"):
        resolve_files([own, "nope.parquet"], "test")
    with pytest.raises(DataError, match=r"^data.train_files: no such parquet file"):
        resolve_files("nope.parquet", "train")
    with pytest.raises(DataError, match="data.train_files: unknown built-in task 'countdwn'; did you mean 'countdown'"):
        resolve_files(["builtin:countdwn"], "train")


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "rlplat.data.synthetic", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)


def test_cli_writes_parquet_and_rejects_unknown_names(tmp_path):
    out = tmp_path / "data" / "train.parquet"
    done = run_cli("--task", "arithmetic", "--out", str(out), "--num", "50", "--seed", "2",
                   "--option", "digits=3", "--option", "ops=+-")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote 50 rows of arithmetic (train, seed 2) to {out}"
    frame = pd.read_parquet(out)
    assert len(frame) == 50 and prompts(frame.to_dict("records")) == prompts(
        generate("arithmetic", 50, seed=2, digits=3, ops="+-"))

    bad = run_cli("--task", "arithmatic", "--out", str(tmp_path / "x.parquet"))
    assert bad.returncode == 2 and "unknown built-in task 'arithmatic'; did you mean 'arithmetic'" in bad.stderr
    assert not (tmp_path / "x.parquet").exists()


def test_cli_main_options(tmp_path, capsys):
    out = tmp_path / "cd.parquet"
    assert main(["--task", "countdown", "--out", str(out), "--num", "3", "--option", "think_format=true"]) == 0
    assert "<answer>" in pd.read_parquet(out)["prompt"][0][0]["content"]
    assert main(["--task", "arithmetic", "--out", str(tmp_path / "x.parquet"), "--option", "digits=two"]) == 2
    assert "digits expects an integer" in capsys.readouterr().err
    assert main(["--task", "countdown", "--out", str(tmp_path / "x.parquet"), "--option", "max_numbr=9"]) == 2
    assert "unknown option 'max_numbr'; did you mean 'max_number'? known: count, max_number, think_format" in (
        capsys.readouterr().err)
    assert not (tmp_path / "x.parquet").exists()
