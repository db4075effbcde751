import pandas as pd
import pytest
import torch

from rlplat.data import DataError, PromptSampler, RLDataset, collate, generate, load_rows, write_parquet
from rlplat.models.tiny import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


GOOD = {"data_source": "s", "prompt": [{"role": "user", "content": "1+1="}],
        "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"k": 1}}


def write_rows(tmp_path, rows, name="d.parquet"):
    path = tmp_path / name
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def test_load_rows_single_path_and_list(tmp_path):
    a = str(write_parquet(generate("arithmetic", 5, 0), tmp_path / "a.parquet"))
    b = str(write_parquet(generate("countdown", 3, 0), tmp_path / "b.parquet"))
    single = load_rows(a)
    assert len(single) == 5 and list(single["source_row"]) == [0, 1, 2, 3, 4]
    both = load_rows([a, b])
    assert len(both) == 8 and list(both["source_file"]) == [a] * 5 + [b] * 3
    assert list(both["data_source"]) == ["rlplat/arithmetic"] * 5 + ["rlplat/countdown"] * 3
    assert both["prompt"][0] == generate("arithmetic", 5, 0)[0]["prompt"]  # plain list of dicts, not numpy
    assert both["ground_truth"][7] == str(both["extra_info"][7]["target"])
    assert both["extra_info"][6]["numbers"] == generate("countdown", 3, 0)[1]["extra_info"]["numbers"]


def test_string_prompts_and_missing_extra_info(tmp_path):
    path = write_rows(tmp_path, [{"data_source": "s", "prompt": "2+2=", "reward_model": {"ground_truth": 4}}])
    row = load_rows(path).iloc[0]
    assert row["prompt"] == [{"role": "user", "content": "2+2="}]
    assert row["extra_info"] == {} and row["ground_truth"] == "4"


def test_float_ground_truths_from_pandas_compare_as_numbers(tmp_path):
    # one missing value turns a numeric column into float64: 122 is written as 122.0
    truths = pd.Series([122, None, 7.5]).tolist()
    rows = [{**GOOD, "reward_model": {"ground_truth": truths[0]}}, {**GOOD, "reward_model": {"ground_truth": truths[2]}}]
    loaded = load_rows(write_rows(tmp_path, rows))
    assert list(loaded["ground_truth"]) == ["122", "7.5"]
    from rlplat.reward import REWARD_FUNCTIONS

    arithmetic = REWARD_FUNCTIONS.get("arithmetic")
    assert arithmetic("s", "122", "122.0") == 1.0 and arithmetic("s", "122", "122") == 1.0
    assert REWARD_FUNCTIONS.get("gsm8k")("s", "#### 122", "122.0") == 1.0


def test_prompt_only_rows_load_without_a_ground_truth(tmp_path, tokenizer):
    """No reward_model column, a reward_model without ground_truth, a None or NaN answer: a prompt-only row
    (ground truth None), which the dataset names for the start-up check of the reward functions."""
    prompt_only = write_rows(tmp_path, [{"data_source": "s", "prompt": "write a haiku"}], "prompts.parquet")
    assert pd.isna(load_rows(prompt_only)["ground_truth"]).tolist() == [True]  # the frame's missing value
    rows = [GOOD, {**GOOD, "reward_model": {"style": "model"}}, {**GOOD, "reward_model": {"ground_truth": None}},
            {**GOOD, "reward_model": {"ground_truth": float("nan")}}]
    mixed = write_rows(tmp_path, rows, "mixed.parquet")
    assert pd.isna(load_rows(mixed)["ground_truth"]).tolist() == [False, True, True, True]
    data = RLDataset([prompt_only, mixed], tokenizer, max_prompt_length=64)
    assert data.without_ground_truth() == [f"{prompt_only} row 0", f"{mixed} row 1", f"{mixed} row 2",
                                           f"{mixed} row 3"]
    assert data[0]["ground_truth"] is None


def test_reward_functions_that_need_an_answer_refuse_prompt_only_rows():
    from rlplat.reward import RewardConfigError, RewardManager, REWARD_FUNCTIONS
    from rlplat.reward.calls import needs_ground_truth

    def own(data_source, solution_str, ground_truth=None, extra_info=None):
        return float(len(solution_str) < 20)

    assert not needs_ground_truth(own) and not needs_ground_truth(REWARD_FUNCTIONS.get("format"))
    assert not needs_ground_truth(REWARD_FUNCTIONS.get("reward_model"))
    assert needs_ground_truth(REWARD_FUNCTIONS.get("arithmetic")) and needs_ground_truth(REWARD_FUNCTIONS.get("judge"))
    where = {"train": ["p.parquet row 4", "p.parquet row 9"], "test": []}
    RewardManager([(own, 1.0), (REWARD_FUNCTIONS.get("format"), 0.5)]).check_answers(where)
    RewardManager([(REWARD_FUNCTIONS.get("arithmetic"), 1.0)]).check_answers({"train": [], "test": []})
    with pytest.raises(RewardConfigError, match=r"^p.parquet row 4 has no reward_model.ground_truth \(2 train row\(s\) "
                                                r"have none\), and reward function\(s\) 'arithmetic' need one"):
        RewardManager([(own, 1.0), (REWARD_FUNCTIONS.get("arithmetic"), 1.0)]).check_answers(where)


@pytest.mark.parametrize("bad, message", [
    ({**GOOD, "prompt": [{"role": "user"}]},
     "row 1: prompt must be a string or a non-empty list of {'role': str, 'content': str} messages"),
    ({**GOOD, "prompt": []}, "row 1: prompt must be a string or a non-empty list"),
    ({**GOOD, "data_source": None}, "row 1: data_source must be a string, got None"),
    ({**GOOD, "reward_model": {"style": "rule", "ground_truth": " "}},
     "row 1: reward_model.ground_truth is empty; expected an answer"),
])
def test_bad_rows_name_file_row_and_key(tmp_path, bad, message):
    path = write_rows(tmp_path, [GOOD, bad])
    with pytest.raises(DataError) as info:
        load_rows([path])
    assert str(info.value).startswith(f"{path} {message}")


def test_bad_prompt_type_and_reward_model_type(tmp_path):
    path = write_rows(tmp_path, [{**GOOD, "prompt": 7}], "int_prompt.parquet")  # a column holds one type
    with pytest.raises(DataError, match=r"int_prompt.parquet row 0: prompt must be a string .* got '7'"):
        load_rows(path)
    path = write_rows(tmp_path, [{**GOOD, "reward_model": "2"}], "str_reward.parquet")
    with pytest.raises(DataError, match=r"str_reward.parquet row 0: reward_model must be a dict, got '2'"):
        load_rows(path)


def test_file_level_errors_name_the_file(tmp_path):
    path = write_rows(tmp_path, [{"data_source": "s", "reward_model": {"ground_truth": "2"}}], "no_prompt.parquet")
    with pytest.raises(DataError, match=r"no_prompt.parquet: missing column\(s\) \['prompt'\]"):
        load_rows(path)
    good = write_rows(tmp_path, [GOOD], "good.parquet")
    with pytest.raises(DataError, match=r"^\S*missing.parquet: no such parquet file$"):
        load_rows([good, str(tmp_path / "missing.parquet")])
    (tmp_path / "text.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"text.parquet: cannot read as parquet"):
        load_rows([good, str(tmp_path / "text.parquet")])
    with pytest.raises(DataError, match="no parquet files given"):
        load_rows([])


def test_dataset_items_chat_template_and_plain(tmp_path, tokenizer):
    a = write_rows(tmp_path, [{**GOOD, "prompt": "12"}], "a.parquet")  # a string prompt is one user message
    system = [{"role": "system", "content": "s"}, {"role": "user", "content": "3"}]
    b = write_rows(tmp_path, [{**GOOD, "prompt": system}, GOOD], "b.parquet")
    ds = RLDataset([a, b], tokenizer, max_prompt_length=64)
    assert len(ds) == 3 and set(ds[0]) == {"prompt_ids", "raw_prompt", "data_source", "ground_truth", "extra_info",
                                           "file"}
    assert ds.rows_per_file() == [1, 2] and ds[2]["file"] == ds.files[1] == b
    decoded = tokenizer.decode(ds[1]["prompt_ids"])
    assert decoded == "<|system|>s<|endoftext|><|user|>3<|endoftext|><|assistant|>"
    assert ds[2]["raw_prompt"] == GOOD["prompt"] and ds[2]["ground_truth"] == "2" and ds[2]["extra_info"] == {"k": 1}
    assert ds[0]["raw_prompt"] == [{"role": "user", "content": "12"}]
    plain = RLDataset([a, b], tokenizer, max_prompt_length=64, apply_chat_template=False)
    assert plain[0]["prompt_ids"] == tokenizer("12", add_special_tokens=False)["input_ids"]
    assert len(plain[0]["prompt_ids"]) == 2 and tokenizer.decode(plain[1]["prompt_ids"]) == "s3"


def test_a_second_dataset_of_the_same_files_and_tokenizer_reuses_the_tokenised_items(tmp_path, monkeypatch):
    tokenizer = build_tokenizer()  # its own: the test changes its chat template
    path = write_rows(tmp_path, [GOOD, {**GOOD, "prompt": [{"role": "user", "content": "2+2="}]}])
    encodes = []
    real_encode = RLDataset._encode
    monkeypatch.setattr(RLDataset, "_encode", lambda self, rows: encodes.append(len(rows)) or real_encode(self, rows))
    first = RLDataset(path, tokenizer, 64)
    again = RLDataset(path, tokenizer, 64)
    assert encodes == [2] and again.items == first.items  # read and tokenised once
    RLDataset(path, tokenizer, 32)  # another setting
    tokenizer.chat_template = tokenizer.chat_template.replace("<|assistant|>", "<|assistant|> ")
    spaced = RLDataset(path, tokenizer, 64)  # another template
    assert encodes == [2, 2, 2] and spaced[0]["prompt_ids"] != first[0]["prompt_ids"]
    write_rows(tmp_path, [{**GOOD, "prompt": "3+3="}])  # the file rewritten (size and modification time)
    assert [item["raw_prompt"][0]["content"] for item in RLDataset(path, tokenizer, 64)] == ["3+3="]
    assert encodes == [2, 2, 2, 1]


def test_truncation_modes(tmp_path, tokenizer, capsys):
    path = write_rows(tmp_path, [{**GOOD, "prompt": "1"}, {**GOOD, "prompt": "12345678901234567890"},
                                 {**GOOD, "prompt": "abcdefghijklmnopqrstu"}], "long.parquet")
    full = RLDataset(path, tokenizer, max_prompt_length=64)
    assert [len(item["prompt_ids"]) for item in full] == [4, 23, 24]  # <|user|> text <|endoftext|> <|assistant|>
    with pytest.raises(DataError) as info:
        RLDataset(path, tokenizer, max_prompt_length=10)
    assert str(info.value) == (f"{path} row 1: prompt has 23 tokens > data.max_prompt_length=10; set "
                               f"data.truncation=left|right|filter or a larger data.max_prompt_length")
    left = RLDataset(path, tokenizer, 10, truncation="left")
    right = RLDataset(path, tokenizer, 10, truncation="right")
    assert left[0]["prompt_ids"] == right[0]["prompt_ids"] == full[0]["prompt_ids"]
    assert left[1]["prompt_ids"] == full[1]["prompt_ids"][-10:] and tokenizer.decode(left[1]["prompt_ids"]) == (
        "34567890<|endoftext|><|assistant|>")
    assert right[2]["prompt_ids"] == full[2]["prompt_ids"][:10] and tokenizer.decode(right[2]["prompt_ids"]) == (
        "<|user|>abcdefghi")
    assert left.num_filtered == right.num_filtered == 0
    capsys.readouterr()
    kept = RLDataset(path, tokenizer, 23, truncation="filter")
    assert kept.num_filtered == 1 and [item["prompt_ids"] for item in kept] == [full[0]["prompt_ids"],
                                                                               full[1]["prompt_ids"]]
    assert "dropped 1 of 3 prompts longer than data.max_prompt_length=23" in capsys.readouterr().out
    with pytest.raises(DataError, match="long.parquet: no usable prompt"):
        RLDataset(path, tokenizer, 3, truncation="filter")
    with pytest.raises(ValueError, match="data.truncation='middle' is not one of error, left, right, filter"):
        RLDataset(path, tokenizer, 10, truncation="middle")


def test_builtin_rows_fit_the_tiny_tokenizer(tmp_path, tokenizer):
    path = write_parquet(generate("arithmetic", 64, 0), tmp_path / "a.parquet")
    ds = RLDataset(str(path), tokenizer, max_prompt_length=16)
    for item in ds:
        content = item["raw_prompt"][0]["content"]
        assert tokenizer.decode(item["prompt_ids"]) == f"<|user|>{content}<|endoftext|><|assistant|>"


def test_collate_left_pads():
    items = [{"prompt_ids": [5, 6], "raw_prompt": [{"role": "user", "content": "a"}], "data_source": "s",
              "ground_truth": "1", "extra_info": {}},
             {"prompt_ids": [7, 8, 9, 10], "raw_prompt": [], "data_source": "t", "ground_truth": "2",
              "extra_info": {"i": 1}},
             {"prompt_ids": [11], "raw_prompt": [], "data_source": "u", "ground_truth": "3", "extra_info": {}}]
    tensors, lists = collate(items, pad_token_id=0)
    assert tensors["prompts"].dtype == tensors["prompt_mask"].dtype == torch.int64
    assert tensors["prompts"].tolist() == [[0, 0, 5, 6], [7, 8, 9, 10], [0, 0, 0, 11]]
    assert tensors["prompt_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]]
    assert lists == {"raw_prompt": [[{"role": "user", "content": "a"}], [], []], "data_source": ["s", "t", "u"],
                     "ground_truth": ["1", "2", "3"], "extra_info": [{}, {"i": 1}, {}]}
    assert collate(items, pad_token_id=99)[0]["prompts"][2].tolist() == [99, 99, 99, 11]


def take(sampler, n):
    return [sampler.next_batch() for _ in range(n)]


def test_sampler_is_deterministic_and_reshuffles_each_epoch():
    batches = take(PromptSampler(10, 4, shuffle=True, seed=5), 6)  # 2 batches per epoch, 2 indices dropped
    assert batches == take(PromptSampler(10, 4, shuffle=True, seed=5), 6)
    assert batches != take(PromptSampler(10, 4, shuffle=True, seed=6), 6)
    epochs = [batches[i] + batches[i + 1] for i in (0, 2, 4)]
    for epoch, indices in enumerate(epochs):
        assert len(set(indices)) == 8 and all(0 <= i < 10 for i in indices)
        assert indices == torch.randperm(10, generator=torch.Generator().manual_seed(5 + epoch)).tolist()[:8]
    assert len({tuple(e) for e in epochs}) == 3
    in_order = PromptSampler(5, 2, shuffle=False)
    assert take(in_order, 4) == [[0, 1], [2, 3], [0, 1], [2, 3]] and in_order.epoch == 1
    assert next(iter(PromptSampler(5, 2, shuffle=False))) == [0, 1]


@pytest.mark.parametrize("steps_before", [0, 1, 2, 3, 7])
def test_sampler_resumes_exactly_from_state_dict(steps_before):
    original = PromptSampler(10, 4, shuffle=True, seed=3)
    take(original, steps_before)
    state = original.state_dict()
    assert set(state) == {"epoch", "position", "seed"}
    resumed = PromptSampler(10, 4, shuffle=True, seed=0)  # the seed comes back from the state
    resumed.load_state_dict(dict(state))
    assert take(resumed, 9) == take(original, 9)
    assert resumed.state_dict() == original.state_dict()


def test_sampler_errors():
    with pytest.raises(DataError, match="the dataset has 5 prompts, fewer than data.train_batch_size_prompts=8"):
        PromptSampler(5, 8)
    sampler = PromptSampler(5, 2)
    with pytest.raises(ValueError, match=r"sampler state has no \['seed'\]"):
        sampler.load_state_dict({"epoch": 1, "position": 2})
    with pytest.raises(ValueError, match="position=9 is outside a dataset of 5 prompts"):
        sampler.load_state_dict({"epoch": 1, "position": 9, "seed": 0})
