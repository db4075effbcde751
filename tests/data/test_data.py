import subprocess
import sys

import pandas as pd
import pytest
import torch

from rlplat.data import TASKS, DataError, PromptSampler, RLDataset, collate, load_rows, resolve_files, write_parquet
from rlplat.models.tiny import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_arithmetic_rows_are_correct_deterministic_and_split():
    rows = TASKS.get("arithmetic")(200, seed=3, ops="+-")
    assert rows == TASKS.get("arithmetic")(200, seed=3, ops="+-")
    for row in rows:
        expr = row["prompt"][0]["content"].rstrip("=")
        x, sign, y = (expr.partition("+") if "+" in expr else expr.partition("-"))
        expected = int(x) + int(y) if sign == "+" else int(x) - int(y)
        assert row["reward_model"]["ground_truth"] == str(expected) and expected >= 0
        assert row["data_source"] == "rlplat/arithmetic" and row["extra_info"]["split"] == "train"
    train = {r["prompt"][0]["content"] for r in TASKS.get("arithmetic")(5000, seed=0)}
    test = {r["prompt"][0]["content"] for r in TASKS.get("arithmetic")(256, seed=1, split="test")}
    assert len(test) == 256 and not train & test


def reachable(numbers, target):
    """Brute force over orders and operators, evaluated left to right with any parenthesisation."""
    import itertools

    def values(nums):
        if len(nums) == 1:
            return {nums[0]}
        out = set()
        for i in range(1, len(nums)):
            for a in values(nums[:i]):
                for b in values(nums[i:]):
                    out |= {a + b, a - b, a * b}
        return out

    return any(target in values(list(p)) for p in itertools.permutations(numbers))


def test_countdown_targets_are_reachable_and_think_format():
    for row in TASKS.get("countdown")(30, seed=0):
        info = row["extra_info"]
        assert 1 <= info["target"] <= 100 and reachable(info["numbers"], info["target"])
        assert row["reward_model"]["ground_truth"] == str(info["target"])
    think = TASKS.get("countdown")(1, seed=0, think_format=True)[0]["prompt"][0]["content"]
    assert "<think></think>" in think and "<answer></answer>" in think


def test_write_parquet_is_atomic_and_cli(tmp_path):
    path = write_parquet(TASKS.get("arithmetic")(10, seed=0), tmp_path / "sub" / "a.parquet")
    assert len(pd.read_parquet(path)) == 10 and [p.name for p in path.parent.iterdir()] == ["a.parquet"]
    out = tmp_path / "cli.parquet"
    done = subprocess.run([sys.executable, "-m", "rlplat.data.synthetic", "--task", "countdown", "--out", str(out),
                           "--num", "7", "--option", "think_format=true"], capture_output=True, text=True)
    assert done.returncode == 0 and "wrote 7 rows of countdown" in done.stdout and len(pd.read_parquet(out)) == 7
    bad = subprocess.run([sys.executable, "-m", "rlplat.data.synthetic", "--task", "arithmatic", "--out",
                          str(tmp_path / "x.parquet")], capture_output=True, text=True)
    assert bad.returncode == 2 and "did you mean 'arithmetic'" in bad.stderr and not (tmp_path / "x.parquet").exists()


def test_resolve_files(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPLAT_CACHE", str(tmp_path))
    (path,) = resolve_files("builtin:arithmetic", "test")
    assert path.endswith("arithmetic-test-256-1.parquet") and len(pd.read_parquet(path)) == 256
    with pytest.raises(DataError, match="data.val_files: no such parquet file 'nope.parquet'"):
        resolve_files(["nope.parquet"], "test")
    with pytest.raises(DataError, match="data.train_files: unknown built-in task 'countdwn'; did you mean 'countdown'"):
        resolve_files(["builtin:countdwn"], "train")


def write_rows(tmp_path, rows, name="d.parquet"):
    path = tmp_path / name
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


GOOD = {"data_source": "s", "prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"style": "rule", "ground_truth": "2"}}


@pytest.mark.parametrize("row, message", [
    ({"data_source": "s", "prompt": "x"}, r"missing column\(s\) \['reward_model'\]"),
    ({**GOOD, "reward_model": {"style": "rule", "ground_truth": None}}, "row 1: reward_model has no 'ground_truth'"),
    ({**GOOD, "prompt": [{"role": "user"}]}, "row 1: prompt must be a string or a non-empty list"),
])
def test_bad_rows_name_file_and_row(tmp_path, row, message):
    rows = [GOOD, row] if "reward_model" in row else [row]
    path = write_rows(tmp_path, rows)
    with pytest.raises(DataError, match=message) as info:
        load_rows([path])
    assert path in str(info.value)


def test_unreadable_file(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(DataError, match="bad.parquet: cannot read as parquet"):
        load_rows([str(bad)])


def test_dataset_string_prompts_lists_and_truncation(tmp_path, tokenizer):
    a = write_rows(tmp_path, [{**GOOD, "prompt": "1"}, {**GOOD, "prompt": "12345678901234567890"}], "a.parquet")
    b = write_rows(tmp_path, [{**GOOD, "extra_info": {"k": 1}}], "b.parquet")
    ds = RLDataset([a, b], tokenizer, max_prompt_length=64)
    assert len(ds) == 3 and ds[1]["raw_prompt"] == [{"role": "user", "content": "12345678901234567890"}]
    assert ds[2]["extra_info"] == {"k": 1} and ds[2]["raw_prompt"] == GOOD["prompt"] and ds[0]["ground_truth"] == "2"
    full = len(ds[1]["prompt_ids"])  # <|user|> + 20 chars + <|endoftext|> + <|assistant|>
    assert full == 23
    with pytest.raises(DataError, match=r"a.parquet row 1: prompt has 23 tokens > data.max_prompt_length=10"):
        RLDataset([a], tokenizer, max_prompt_length=10)
    left = RLDataset([a], tokenizer, 10, truncation="left")
    assert left[1]["prompt_ids"] == ds[1]["prompt_ids"][-10:]
    right = RLDataset([a], tokenizer, 10, truncation="right")
    assert right[1]["prompt_ids"] == ds[1]["prompt_ids"][:10]
    filtered = RLDataset([a], tokenizer, 10, truncation="filter")
    assert len(filtered) == 1 and filtered.num_filtered == 1


def test_collate_left_pads(tokenizer):
    items = [{"prompt_ids": [5, 6], "raw_prompt": [], "data_source": "s", "ground_truth": "1", "extra_info": {}},
             {"prompt_ids": [7, 8, 9], "raw_prompt": [], "data_source": "t", "ground_truth": "2", "extra_info": {}}]
    tensors, lists = collate(items, pad_token_id=0)
    assert tensors["prompts"].tolist() == [[0, 5, 6], [7, 8, 9]]
    assert tensors["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert lists["data_source"] == ["s", "t"]


def test_sampler_reshuffles_each_epoch_and_resumes_exactly():
    sampler = PromptSampler(10, 4, shuffle=True, seed=5)
    first_epoch = [sampler.next_batch() for _ in range(2)]
    assert len(set(sum(first_epoch, []))) == 8  # no repeats within an epoch (2 left over, dropped)
    state = sampler.state_dict()
    ahead = [sampler.next_batch() for _ in range(5)]
    resumed = PromptSampler(10, 4, shuffle=True, seed=0)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(5)] == ahead
    assert ahead[0] != first_epoch[0]  # epoch 1 has a different order
    in_order = PromptSampler(5, 2, shuffle=False)
    assert [in_order.next_batch() for _ in range(3)] == [[0, 1], [2, 3], [0, 1]]
    with pytest.raises(DataError, match="fewer than data.train_batch_size_prompts=8"):
        PromptSampler(5, 8)
