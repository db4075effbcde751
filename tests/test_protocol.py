import pickle

import numpy as np
import pytest
import torch

from rlplat.protocol import FIELDS, Batch


def make(n=5):
    return Batch.from_dict(
        {"x": torch.arange(n), "y": torch.arange(2 * n, dtype=torch.float32).view(n, 2)},
        {"uid": [f"u{i}" for i in range(n)], "extra_info": [{"i": i, "tags": [i, i]} for i in range(n)],
         "raw_prompt": [[{"role": "user", "content": str(i)}] for i in range(n)]},
        meta={"temperature": 0.7},
    )


def rows(batch):
    return batch.tensors["x"].tolist(), list(batch.non_tensors["uid"])


def test_from_dict_keeps_lists_of_dicts_and_lists_one_dimensional():
    b = make()
    assert len(b) == 5 and b.batch_size == 5
    assert b.non_tensors["raw_prompt"].shape == (5,) and b.non_tensors["raw_prompt"][2] == [{"role": "user", "content": "2"}]
    assert b.non_tensors["extra_info"][4] == {"i": 4, "tags": [4, 4]}


def test_from_dict_length_mismatch_names_the_key():
    with pytest.raises(ValueError, match=r"field 'b' has 2 rows, expected 3 \(as 'a'\)"):
        Batch.from_dict({"a": torch.zeros(3), "b": torch.zeros(2)})
    with pytest.raises(ValueError, match="field 'uid' has 4 rows, expected 3"):
        Batch.from_dict({"a": torch.zeros(3)}, {"uid": ["a"] * 4})


def test_indexing():
    b = make()
    assert rows(b[1]) == ([1], ["u1"]) and rows(b[-1]) == ([4], ["u4"])
    assert rows(b[1:3]) == ([1, 2], ["u1", "u2"])
    assert rows(b[torch.tensor([4, 0])]) == ([4, 0], ["u4", "u0"])
    assert rows(b[[3, 3]]) == ([3, 3], ["u3", "u3"])
    assert rows(b[torch.tensor([True, False, True, False, False])]) == ([0, 2], ["u0", "u2"])
    assert b[1:3].meta == {"temperature": 0.7}


def test_split_chunk_concat_round_trip():
    b = make(7)
    parts = b.split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    back = Batch.concat(parts)
    assert rows(back) == rows(b) and list(back.non_tensors["extra_info"]) == list(b.non_tensors["extra_info"])
    with pytest.raises(ValueError, match="use pad_to_divisor"):
        b.chunk(2)
    assert [rows(c)[0] for c in make(6).chunk(3)] == [[0, 1], [2, 3], [4, 5]]


def test_concat_requires_same_fields():
    with pytest.raises(ValueError, match="batch 1 has fields"):
        Batch.concat([make(2), make(2).select(["x"])])


def test_repeat_interleaved_and_tiled():
    b = make(2)
    assert rows(b.repeat(3)) == ([0, 0, 0, 1, 1, 1], ["u0", "u0", "u0", "u1", "u1", "u1"])
    assert rows(b.repeat(2, interleave=False)) == ([0, 1, 0, 1], ["u0", "u1", "u0", "u1"])
    assert b.repeat(2).non_tensors["extra_info"][1] == {"i": 0, "tags": [0, 0]}


@pytest.mark.parametrize("n, d", [(5, 2), (5, 5), (6, 3), (3, 8), (1, 4)])
def test_pad_to_divisor_and_unpad(n, d):
    b = make(n)
    padded, pad = b.pad_to_divisor(d)
    assert len(padded) % d == 0 and pad == (-n) % d
    assert padded.tensors["x"][n:].tolist() == [i % n for i in range(pad)]  # copies of real rows
    back = padded.unpad(pad)
    assert rows(back) == rows(b) and torch.equal(back.tensors["y"], b.tensors["y"])


def test_select_pop_union():
    b = make(3)
    s = b.select(["x"], ["uid"])
    assert list(s.tensors.keys()) == ["x"] and list(s.non_tensors) == ["uid"]
    with pytest.raises(KeyError, match="no tensor field 'z'; available"):
        b.select(["z"])
    popped = b.pop(["y"], ["extra_info"])
    assert "y" not in b.tensors.keys() and "extra_info" not in b.non_tensors
    assert popped.tensors["y"].shape == (3, 2)
    merged = b.union(popped)
    assert set(merged.tensors.keys()) == {"x", "y"} and "extra_info" in merged.non_tensors
    clash = Batch.from_dict({"x": torch.tensor([9, 9, 9])})
    with pytest.raises(ValueError, match="tensor field 'x' differs"):
        b.union(clash)
    with pytest.raises(ValueError, match="cannot union batches of 3 and 2 rows"):
        b.union(make(2))


def test_pickle_round_trip_and_repr():
    b = make(3)
    back = pickle.loads(pickle.dumps(b))
    assert rows(back) == rows(b) and back.meta == b.meta
    assert torch.equal(back.tensors["y"], b.tensors["y"])
    assert back.non_tensors["extra_info"].dtype == np.dtype(object)
    assert "rows=3" in repr(b) and "y: (3, 2)" in repr(b)


def test_documented_fields():
    for name in ("prompts", "responses", "response_mask", "advantages", "uid", "data_source"):
        assert name in FIELDS
    import rlplat.protocol as protocol

    assert "``old_log_probs``: [B, R]" in protocol.__doc__
