"""The dataset preprocessors on hand-written fixtures in each dataset's original format: the parquet they
write trains one rlplat step, and rlplat's reward scores each fixture's reference answer as correct."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from rlplat.data import RLDataset
from rlplat.reward.scorers import scorer_for
from rlplat.trainer.run import load_run_config, run
from rlplat.trainer.sft import ensure_embedded_model

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
SCRIPTS = ROOT / "examples" / "data_preprocess"


def preprocess(script: str, train: str, test: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPTS / script), "--train-file", str(FIXTURES / train),
           "--test-file", str(FIXTURES / test), "--out-dir", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)


def read_rows(path: Path) -> list[dict]:
    """The rows as rlplat's dataset checks them (this also proves the schema is what the trainer reads)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ensure_embedded_model())
    data = RLDataset([str(path)], tokenizer, max_prompt_length=512, truncation="error", apply_chat_template=True)
    return [data[i] for i in range(len(data))]


def score_all(rows: list[dict], references: list[str]) -> list[float]:
    scores = [scorer_for(r["data_source"])(r["data_source"], ref, r["ground_truth"], r["extra_info"])
              for r, ref in zip(rows, references)]
    return [score["score"] if isinstance(score, dict) else score for score in scores]


def jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


# (script, train fixture, test fixture, extra args, reference answer of each train row, of each test row)
CASES = {
    "gsm8k": ("gsm8k.py", "gsm8k_train.jsonl", "gsm8k_test.jsonl", (),
              [r["answer"] for r in jsonl("gsm8k_train.jsonl")], [r["answer"] for r in jsonl("gsm8k_test.jsonl")]),
    "math": ("math_dataset.py", "hendrycks_math_train.jsonl", "math500_test.parquet", (),
             [r["solution"] for r in jsonl("hendrycks_math_train.jsonl")],
             pd.read_parquet(FIXTURES / "math500_test.parquet")["solution"].tolist()),
    # Countdown rows carry no solution; these are hand-checked expressions for the fixture's numbers.
    "countdown": ("countdown.py", "countdown_train.jsonl", "countdown_test.json", (),
                  ["<answer>4 * 6 * 1</answer>", "<think>2*5=10</think> <answer>2 * 5 + 3</answer>",
                   "<answer>9 - 2</answer>"], ["<answer>(3 * 6) * 2 * 1</answer>"]),
    # open-instruct's RLVR-IF rows: responses that follow every instruction of their row
    "rlvr_if": ("rlvr_if.py", "rlvr_if_train.jsonl", "rlvr_if_test.jsonl", (),
                ["<think>Rain, RAIN.</think>soft rain falls on the quiet town and the streets shine",
                 "<<Rain>>\nIt falls.", "An apple and another apple."],
                ['"It rains."', "It rains today. Any other questions?"]),
    "generic": ("generic.py", "qa.jsonl", "qa.jsonl",
                ("--question-key", "input", "--answer-key", "target", "--data-source", "gsm8k"),
                ["3 + 4 = 7\n#### 7", "#### 4"], ["#### 7", "#### 4"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_preprocessor_output_is_scored_correct_for_reference_answers(name, embedded_cache, tmp_path):
    script, train, test, extra, train_refs, test_refs = CASES[name]
    done = preprocess(script, train, test, tmp_path, *extra)
    assert done.returncode == 0, done.stderr
    for split, refs in (("train", train_refs), ("test", test_refs)):
        rows = read_rows(tmp_path / f"{split}.parquet")
        assert len(rows) == len(refs)
        assert score_all(rows, refs) == [1.0] * len(refs)
        # and a wrong answer is not: the check can fail
        assert score_all(rows, ["#### 123456 \\boxed{123456} <answer>1</answer>"] * len(refs)) != [1.0] * len(refs)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_preprocessor_output_trains_one_step(name, embedded_cache, tmp_path):
    script, train, test, extra, *_ = CASES[name]
    assert preprocess(script, train, test, tmp_path / "data", *extra).returncode == 0
    cfg, plan = load_run_config([
        f"data.train_files={tmp_path / 'data' / 'train.parquet'}", f"data.val_files={tmp_path / 'data' / 'test.parquet'}",
        "data.max_prompt_length=512", "data.train_batch_size_prompts=1", "actor.mini_batch_size_prompts=1",
        "rollout.n=2", "rollout.val_n=1", "actor.micro_batch_size_seqs_per_worker=2",
        "critic.micro_batch_size_seqs_per_worker=2", "trainer.total_steps=1",
        "trainer.test_freq=0", "trainer.ray_address=inprocess", f"trainer.output_dir={tmp_path / 'out'}",
        # Both responses of a prompt often score alike (advantage 0, no policy gradient at step 1): the entropy
        # term gives this data's tokens a gradient whatever they score, and without weight decay only that
        # gradient can move the weights.
        "actor.entropy_coeff=0.01", "actor.optim.weight_decay=0",
    ])
    summary = run(cfg, plan)
    assert summary["steps"] == 1
    step = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["step"] == 1 and 0 < step["actor/grad_norm"] < math.inf, step["actor/grad_norm"]
    before = load_file(str(Path(ensure_embedded_model()) / "model.safetensors"))
    after = load_file(str(Path(summary["hf_export"]) / "model.safetensors"))
    assert sorted(after) == sorted(before)
    assert any(not torch.equal(before[name], after[name]) for name in before)  # the step moved the policy


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no final answer"}) + "\n")
    done = subprocess.run([sys.executable, str(SCRIPTS / "gsm8k.py"), "--train-file", str(bad), "--test-file",
                           str(bad), "--out-dir", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == f"preprocess: {bad} row 0: column 'answer' has no '#### <number>' final answer"
    assert not (tmp_path / "out").exists()
    done = preprocess("generic.py", "qa.jsonl", "qa.jsonl", tmp_path / "out", "--data-source", "gsm8k")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "row 0: missing column 'question' (row has: input, target, topic)" in done.stderr


def test_geometry3k_rows_keep_their_images_and_are_scored(tmp_path):
    """Geometry3K's original form (an ``images`` column as ``datasets`` stores images, ``<image>`` in the problem)
    -> rows a vision-language model reads with their images, whose reference answers score 1."""
    import io

    from omegaconf import OmegaConf
    from PIL import Image
    from transformers import AutoTokenizer

    from rlplat.models.vision import image_inputs_of
    from rlplat.models.tiny import build_tiny_vision_model

    def png(size) -> bytes:
        out = io.BytesIO()
        Image.new("RGB", size, (255, 255, 255)).save(out, format="PNG")
        return out.getvalue()

    original = pd.DataFrame([
        {"images": [{"bytes": png((84, 56)), "path": None}], "problem": "<image>Find x.", "answer": "3"},
        {"images": [{"bytes": png((56, 56)), "path": None}], "problem": "<image>Find the area.",
         "answer": "2\\sqrt{3}"},
    ])
    original.to_parquet(tmp_path / "geo.parquet")
    done = subprocess.run([sys.executable, str(SCRIPTS / "geo3k.py"), "--train-file", str(tmp_path / "geo.parquet"),
                           "--test-file", str(tmp_path / "geo.parquet"), "--out-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    model = build_tiny_vision_model(tmp_path / "vl")
    tokenizer = AutoTokenizer.from_pretrained(model)
    images = image_inputs_of(str(model), tokenizer, OmegaConf.create(
        {"image_min_pixels": None, "image_max_pixels": None, "truncation": "error"}))
    data = RLDataset([str(tmp_path / "out" / "train.parquet")], tokenizer, 512, "error", True, images=images)
    assert [images.inputs(data[i]["images"])["image_grid_thw"].tolist() for i in range(2)] == [[[1, 4, 6]], [[1, 4, 4]]]
    assert score_all([data[0], data[1]], ["<think>x</think> \\boxed{3}", "\\boxed{2\\sqrt{3}}"]) == [1.0, 1.0]
    assert score_all([data[0], data[1]], ["\\boxed{4}", "\\boxed{2}"]) == [0.0, 0.0]
    original.assign(problem="Find x.").to_parquet(tmp_path / "bad.parquet")  # no placeholder for its image
    done = subprocess.run([sys.executable, str(SCRIPTS / "geo3k.py"), "--train-file", str(tmp_path / "bad.parquet"),
                           "--test-file", str(tmp_path / "bad.parquet"), "--out-dir", str(tmp_path / "bad")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and not (tmp_path / "bad").exists()
    assert done.stderr.strip() == (f"preprocess: {tmp_path / 'bad.parquet'} row 0: column 'problem' has 0 <image> "
                                   f"placeholder(s) for 1 image(s)")
