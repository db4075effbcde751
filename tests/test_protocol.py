"""Batch: round trips of every operation, with object columns (dicts, lists) and meta carried along."""

import pickle
import re

import numpy as np
import pytest
import torch

import rlplat.protocol as protocol
from rlplat.protocol import FIELDS, NON_TENSOR_FIELDS, Batch


def make(n=5):
    """Row i holds x=i, y=[2i, 2i+1], uid 'u<i>', a dict and a list of dicts: each row is recognisable."""
    return Batch.from_dict(
        {"x": torch.arange(n), "y": torch.arange(2 * n, dtype=torch.float32).view(n, 2)},
        {
            "uid": [f"u{i}" for i in range(n)],
            "extra_info": [{"i": i, "tags": [i, i]} for i in range(n)],
            "raw_prompt": [[{"role": "user", "content": str(i)}] for i in range(n)],
        },
        meta={"temperature": 0.7, "step": 3},
    )


def row_ids(batch):
    """The source row of each row, read from every field; fails if the fields disagree."""
    ids = batch.tensors["x"].tolist()
    assert batch.tensors["y"].tolist() == [[2.0 * i, 2.0 * i + 1] for i in ids]
    assert list(batch.non_tensors["uid"]) == [f"u{i}" for i in ids]
    assert list(batch.non_tensors["extra_info"]) == [{"i": i, "tags": [i, i]} for i in ids]
    assert list(batch.non_tensors["raw_prompt"]) == [[{"role": "user", "content": str(i)}] for i in ids]
    for column in batch.non_tensors.values():
        assert column.dtype == np.dtype(object) and column.shape == (len(batch),)
    assert batch.meta == {"temperature": 0.7, "step": 3}
    return ids


# ---------------------------------------------------------------- construction


def test_from_dict_keeps_lists_of_dicts_and_lists_one_dimensional():
    b = make()
    assert len(b) == 5 and b.batch_size == 5 and row_ids(b) == [0, 1, 2, 3, 4]
    # equal-length inner lists are where np.array would build a 2-D array
    b = Batch.from_dict(non_tensors={"pair": [[1, 2], [3, 4], [5, 6]], "s": np.array(["a", "b", "c"])})
    assert b.non_tensors["pair"].shape == (3,) and b.non_tensors["pair"][1] == [3, 4]
    assert b.non_tensors["s"].dtype == np.dtype(object) and len(b) == 3 and list(b.tensors.keys()) == []


def test_from_dict_copies_meta():
    meta = {"step": 1}
    b = Batch.from_dict({"x": torch.zeros(2)}, meta=meta)
    meta["step"] = 2
    assert b.meta == {"step": 1}


def test_from_dict_length_mismatch_names_the_key_and_lengths():
    with pytest.raises(ValueError, match=r"field 'b' has 2 rows, expected 3 \(as 'a'\)"):
        Batch.from_dict({"a": torch.zeros(3), "b": torch.zeros(2, 4)})
    with pytest.raises(ValueError, match=r"field 'uid' has 4 rows, expected 3 \(as 'a'\)"):
        Batch.from_dict({"a": torch.zeros(3)}, {"uid": ["a"] * 4})


def test_from_dict_rejects_scalars_and_empty():
    with pytest.raises(ValueError, match=r"tensor field 'loss' must be a tensor of shape \[B, \.\.\.\]"):
        Batch.from_dict({"x": torch.zeros(2), "loss": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="non-tensor field 'data_source' must be a sequence of B values"):
        Batch.from_dict({"x": torch.zeros(2)}, {"data_source": "gsm8k"})  # list() would split it into letters
    with pytest.raises(ValueError, match="at least one"):
        Batch.from_dict()


def test_constructor_checks_column_lengths():
    with pytest.raises(ValueError, match="non-tensor 'uid' has 1 rows, expected 2"):
        Batch(make(2).tensors, {"uid": np.array(["a"], dtype=object)})
    with pytest.raises(ValueError, match=r"tensor 'x' has shape \[2\], expected \[3, \.\.\.\]"):
        Batch({"x": torch.zeros(2)}, size=3)
    with pytest.raises(ValueError, match="tensor 'x' is a scalar"):
        Batch({"x": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="a Batch without fields needs its size"):
        Batch({})
    assert len(Batch({}, size=3)) == 3 and len(Batch({}, {"uid": np.array(["a"], dtype=object)})) == 1


# ---------------------------------------------------------------- indexing


def test_indexing_by_int_slice_indices_and_mask():
    b = make()
    assert row_ids(b[1]) == [1] and row_ids(b[-1]) == [4] and len(b[np.int64(2)]) == 1
    assert row_ids(b[torch.tensor(3)]) == [3]
    assert row_ids(b[1:3]) == [1, 2] and row_ids(b[::2]) == [0, 2, 4]
    assert row_ids(b[torch.tensor([4, 0])]) == [4, 0] and row_ids(b[[3, 3]]) == [3, 3]
    assert row_ids(b[np.array([2, 1])]) == [2, 1] and row_ids(b[[]]) == []
    assert row_ids(b[torch.tensor([True, False, True, False, False])]) == [0, 2]
    assert row_ids(b[np.array([False, True, False, False, True])]) == [1, 4]


def test_indexing_errors():
    b = make(3)
    with pytest.raises(IndexError, match="row 3 is out of range for a Batch of 3 rows"):
        b[3]
    with pytest.raises(IndexError, match="bool mask has 2 entries, the Batch has 3 rows"):
        b[torch.tensor([True, False])]
    with pytest.raises(TypeError, match="row indices must be integers"):
        b[torch.tensor([0.0, 1.0])]
    with pytest.raises(TypeError, match="cannot index a Batch"):
        b["x"]
    with pytest.raises(TypeError, match="cannot index a Batch"):
        b[torch.tensor(True)]  # not row 1


# ---------------------------------------------------------------- split / chunk / concat


@pytest.mark.parametrize("n, size", [(7, 3), (6, 3), (2, 5), (4, 1)])
def test_split_concat_round_trip(n, size):
    parts = make(n).split(size)
    assert [len(p) for p in parts] == [min(size, n - s) for s in range(0, n, size)]
    assert [row_ids(p) for p in parts] == [list(range(s, min(s + size, n))) for s in range(0, n, size)]
    assert row_ids(Batch.concat(parts)) == list(range(n))


def test_chunk_concat_round_trip_and_errors():
    parts = make(6).chunk(3)
    assert [row_ids(c) for c in parts] == [[0, 1], [2, 3], [4, 5]]
    assert row_ids(Batch.concat(parts)) == list(range(6))
    with pytest.raises(ValueError, match=r"cannot chunk 7 rows into 2 equal pieces; use pad_to_divisor\(2\)"):
        make(7).chunk(2)
    with pytest.raises(ValueError, match="chunk count must be >= 1, got 0"):
        make(2).chunk(0)
    with pytest.raises(ValueError, match="split size must be >= 1, got 0"):
        make(2).split(0)


def test_concat_meta_from_first():
    a, b = make(2), make(2)
    b.meta = {"temperature": 1.0}
    assert Batch.concat([a, b]).meta == a.meta


def test_concat_errors_name_the_difference():
    with pytest.raises(ValueError, match=r"batch 1 has fields \(\['x'\], \['uid', 'extra_info', 'raw_prompt'\]\)"):
        Batch.concat([make(2), make(2).select(["x"])])
    short = Batch.from_dict({"x": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match=r"tensor field 'x' has shape \[2, 4\] in batch 1, \[2, 3\] in batch 0"):
        Batch.concat([short, Batch.from_dict({"x": torch.zeros(2, 4)})])
    with pytest.raises(ValueError, match="at least one batch"):
        Batch.concat([])


# ---------------------------------------------------------------- repeat and padding


def test_repeat_interleaved_and_tiled_row_by_row():
    b = make(3)
    interleaved, tiled = b.repeat(2), b.repeat(2, interleave=False)
    expected_interleaved, expected_tiled = [0, 0, 1, 1, 2, 2], [0, 1, 2, 0, 1, 2]
    assert row_ids(interleaved) == expected_interleaved and row_ids(tiled) == expected_tiled
    for got, expected in ((interleaved, expected_interleaved), (tiled, expected_tiled)):
        for j, i in enumerate(expected):  # every field of every row against the source row
            assert torch.equal(got.tensors["y"][j], b.tensors["y"][i])
            for key in b.non_tensors:
                assert got.non_tensors[key][j] == b.non_tensors[key][i]
    assert row_ids(b.repeat(1)) == [0, 1, 2]
    with pytest.raises(ValueError, match="repeat count must be >= 1, got 0"):
        b.repeat(0)


@pytest.mark.parametrize("n, d", [(5, 2), (5, 5), (6, 3), (3, 8), (1, 4), (4, 1), (7, 3)])
def test_pad_to_divisor_and_unpad(n, d):
    b = make(n)
    padded, pad = b.pad_to_divisor(d)
    assert pad == (-n) % d and len(padded) == n + pad and len(padded) % d == 0
    assert row_ids(padded) == list(range(n)) + [i % n for i in range(pad)]  # copies of real rows
    assert not padded.tensors["y"].isnan().any()
    back = padded.unpad(pad)
    assert row_ids(back) == list(range(n)) and torch.equal(back.tensors["y"], b.tensors["y"])
    assert padded is not b and back is not padded  # a new Batch even when nothing was added or removed


def test_pad_then_chunk_then_unpad():
    b = make(5)
    padded, pad = b.pad_to_divisor(4)
    pieces = padded.chunk(4)
    assert [len(p) for p in pieces] == [2, 2, 2, 2]
    assert row_ids(Batch.concat(pieces).unpad(pad)) == [0, 1, 2, 3, 4]


def test_pad_and_unpad_errors():
    with pytest.raises(ValueError, match="divisor must be >= 1, got 0"):
        make(2).pad_to_divisor(0)
    with pytest.raises(ValueError, match=r"pad size must be in \[0, 2\] for a Batch of 2 rows, got 3"):
        make(2).unpad(3)


# ---------------------------------------------------------------- select / pop / union


def test_select():
    b = make(3)
    s = b.select(["x"], ["uid"])
    assert list(s.tensors.keys()) == ["x"] and list(s.non_tensors) == ["uid"] and s.meta == b.meta
    assert set(b.select().tensors.keys()) == {"x", "y"} and len(b.select().non_tensors) == 3
    assert list(b.select(non_tensor_keys=[]).non_tensors) == [] and len(b.select([], [])) == 3
    assert set(b.tensors.keys()) == {"x", "y"} and len(b.non_tensors) == 3  # the input is unchanged
    with pytest.raises(KeyError, match=r"no tensor field 'z'; available: \['x', 'y'\]"):
        b.select(["z"])
    with pytest.raises(KeyError, match=r"no non-tensor field 'nope'; available: \['extra_info', 'raw_prompt', 'uid'\]"):
        b.select(None, ["nope"])


def test_pop_then_union_restores_the_batch():
    b = make(3)
    popped = b.pop(["y"], ["extra_info"])
    assert list(b.tensors.keys()) == ["x"] and "extra_info" not in b.non_tensors
    assert popped.tensors["y"].shape == (3, 2) and list(popped.non_tensors) == ["extra_info"]
    assert row_ids(b.union(popped)) == [0, 1, 2]
    assert list(b.tensors.keys()) == ["x"]  # union returned a new batch


def test_pop_checks_every_key_before_removing():
    b = make(3)
    with pytest.raises(KeyError, match="no non-tensor field 'nope'"):
        b.pop(["y"], ["nope"])
    assert set(b.tensors.keys()) == {"x", "y"}


def test_union_of_equal_fields_and_meta():
    b = make(3)
    other = b.select(["x"], ["extra_info"])  # shared fields with equal values are allowed
    other.meta = {"step": 99, "new": 1}
    merged = b.union(other)
    assert set(merged.tensors.keys()) == {"x", "y"} and list(merged.non_tensors["uid"]) == ["u0", "u1", "u2"]
    assert merged.meta == {"temperature": 0.7, "step": 3, "new": 1}  # this batch's meta wins
    nan = Batch.from_dict({"v": torch.tensor([float("nan"), 1.0, 2.0])})
    assert len(b.union(nan).union(pickle.loads(pickle.dumps(nan)))) == 3  # NaN equals NaN here
    with pytest.raises(ValueError, match="tensor field 'v' differs"):
        nan.union(Batch.from_dict({"v": torch.tensor([0.0, 1.0, 2.0])}))  # but not 0


def test_union_errors_name_the_key():
    b = make(3)
    with pytest.raises(ValueError, match="union: tensor field 'x' differs"):
        b.union(Batch.from_dict({"x": torch.tensor([9, 9, 9])}))
    with pytest.raises(ValueError, match="union: tensor field 'x' differs"):
        b.union(Batch.from_dict({"x": torch.arange(3.0)}))  # same values, different dtype
    with pytest.raises(ValueError, match="union: non-tensor field 'extra_info' differs"):
        b.union(Batch.from_dict(non_tensors={"extra_info": [{"i": 0}, {"i": 1}, {"i": 2}]}))
    with pytest.raises(ValueError, match="cannot union batches of 3 and 2 rows"):
        b.union(make(2))
    arrays = Batch.from_dict(non_tensors={"a": [np.arange(2), np.arange(2)]})
    assert len(arrays.union(arrays[[0, 1]])) == 2  # array elements compare as arrays, not ambiguous bools
    with pytest.raises(ValueError, match="non-tensor field 'a' differs"):
        arrays.union(Batch.from_dict(non_tensors={"a": [np.arange(2), np.zeros(2)]}))


# ---------------------------------------------------------------- transport and display


def test_pickle_round_trip():
    b = make(4)[[3, 1, 2]]
    back = pickle.loads(pickle.dumps(b))
    assert row_ids(back) == [3, 1, 2] and back.tensors["y"].dtype == torch.float32
    assert row_ids(Batch.concat(back.chunk(3))) == [3, 1, 2]


@pytest.mark.parametrize("protocol_version", [4, 5])
def test_pickle_sends_only_each_tensors_own_rows(protocol_version):
    """Every dtype comes back bit-exact and writable, in key order; a row slice carries only its own rows
    (torch's pickling would send the whole storage); a tensor on another device keeps torch's pickling."""
    rows = 1000
    b = Batch.from_dict({"ids": torch.arange(rows * 4).view(rows, 4), "half": torch.randn(rows, 3).bfloat16(),
                         "elsewhere": torch.empty(rows, 2, device="meta"),
                         "mask": torch.rand(rows, 5) > 0.5, "f64": torch.randn(rows, dtype=torch.float64)},
                        {"uid": [f"u{i}" for i in range(rows)]}, meta={"step": 1})
    part = b[10:12]
    blob = pickle.dumps(part, protocol=protocol_version)
    assert len(blob) < 2_000  # 2 of 1,000 rows
    back = pickle.loads(blob)
    assert list(back.tensors.keys()) == list(b.tensors.keys()) and back.meta == {"step": 1}
    assert list(back.non_tensors["uid"]) == ["u10", "u11"]
    for key in ("ids", "half", "mask", "f64"):
        assert back.tensors[key].dtype == part.tensors[key].dtype and torch.equal(back.tensors[key], part.tensors[key])
    assert back.tensors["elsewhere"].device.type == "meta" and back.tensors["elsewhere"].shape == (2, 2)
    back.tensors["ids"][0, 0] = -1  # writable, and not shared with the sender
    assert int(part.tensors["ids"][0, 0]) == 40 and back.tensors["ids"].untyped_storage().nbytes() == 2 * 4 * 8
    empty = pickle.loads(pickle.dumps(Batch.from_dict(non_tensors={"uid": ["a", "b"]})))
    assert len(empty) == 2 and list(empty.tensors.keys()) == []


def test_to_device_keeps_non_tensors_and_meta():
    b = make(2)
    moved = b.to("cpu")
    assert moved is not b and row_ids(moved) == [0, 1] and moved.tensors["x"].device.type == "cpu"
    moved.meta["step"] = 4
    assert b.meta["step"] == 3  # meta is copied, not shared


def test_repr_shows_size_and_shapes():
    text = repr(make(3))
    assert text.startswith("Batch(B=3,") and "y: [3, 2] torch.float32" in text and "'uid'" in text


def test_batches_compare_by_identity():
    b = make(2)
    assert b == b and b != make(2)  # no element-wise tensor comparison, no ambiguous bool


# ---------------------------------------------------------------- documented fields


def test_docstring_table_matches_fields():
    table = {}
    for line in protocol.__doc__.splitlines():
        match = re.fullmatch(r" {4}(\w+) +(\[B.*)", line)
        if match:
            table[match[1]] = match[2]
    assert table == FIELDS


def test_documented_fields():
    for name in ("prompts", "prompt_mask", "responses", "response_mask", "input_ids", "attention_mask",
                 "position_ids", "rollout_log_probs", "old_log_probs", "ref_log_probs", "values",
                 "token_level_scores", "token_level_rewards", "advantages", "returns", "sum_pi_squared"):
        assert FIELDS[name].startswith("[B"), name
    assert FIELDS["responses"].startswith("[B, R] int64") and FIELDS["input_ids"].startswith("[B, P+R]")
    assert set(NON_TENSOR_FIELDS) <= set(FIELDS)
    assert set(NON_TENSOR_FIELDS) == {"uid", "data_source", "ground_truth", "extra_info", "raw_prompt", "response_text",
                                      "multi_modal_inputs"}
