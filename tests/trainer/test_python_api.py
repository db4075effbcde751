"""``from rlplat.trainer import GRPOTrainer``: docs/python_api.md's script trains the Quickstart task (with fewer,
smaller steps), TRL's batched reward functions get the batch and the dataset's columns, and rows in TRL's shape
(text prompts, any columns) train; a batched function's failures are the batch's, counted like any reward call's."""

import re
from pathlib import Path

import pytest
from transformers import AutoConfig

import rlplat.trainer
from rlplat.reward.calls import RewardFailure, RewardValue, call_batch, is_batched, needs_ground_truth
from rlplat.reward.scorers import REWARD_FUNCTIONS
from rlplat.trainer.python_api import GRPOTrainer

from .test_trainer import metrics

DOC = (Path(__file__).resolve().parents[2] / "docs" / "python_api.md").read_text(encoding="utf-8")
SMALL = {"trainer.ray_address": "inprocess", "trainer.total_steps": 2, "trainer.test_freq": 0,
         "data.train_batch_size_prompts": 8, "actor.mini_batch_size_prompts": 8, "rollout.n": 4,
         "actor.micro_batch_size_seqs_per_worker": 8, "rollout.val_n": 2,
         "rollout.val_temperature": 1.0}


def brevity(data_source, solution_str, ground_truth=None, extra_info=None):
    """rlplat's per-sample signature (at module level: it is sent to the reward worker process)."""
    return -0.01 * len(solution_str)


@pytest.fixture
def registered():
    """The reward functions a test registers leave the registry after it."""
    before = set(REWARD_FUNCTIONS.names())
    yield
    for name in set(REWARD_FUNCTIONS.names()) - before:
        REWARD_FUNCTIONS.remove(name)


def test_the_documented_script_trains_the_quickstart_task(embedded_cache, small_val, tmp_path, monkeypatch,
                                                          capsys, registered):
    (script,) = re.findall(r"^```python\n(from rlplat.trainer import GRPOTrainer.*?)^```", DOC, flags=re.DOTALL | re.M)
    calls = []

    class Smaller(GRPOTrainer):  # the script as printed; its run smaller and in this process
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.args += [f"{k}={v}" for k, v in {**SMALL, "data.val_files": small_val,
                                                  "trainer.output_dir": tmp_path / "run"}.items()]
            exact = self.reward_funcs[0]

            def exact_answer(completions, **kw):  # counts the calls
                calls.append({"completions": completions, **kw})
                return exact(completions, **kw)
            self.reward_funcs = [exact_answer]

    monkeypatch.setattr(rlplat.trainer, "GRPOTrainer", Smaller, raising=False)
    exec(script, {"__name__": "__main__"})
    model_dir = capsys.readouterr().out.strip().splitlines()[-1].split()[0]
    assert model_dir == str((tmp_path / "run" / "hf_export").resolve())
    assert AutoConfig.from_pretrained(model_dir).model_type == "qwen2"
    train_calls = [kw for kw in calls if len(kw["completions"]) == 32]  # 8 prompts x 4 responses (validation: 64)
    assert len(train_calls) == 2
    first = train_calls[0]
    assert first["completions"][0][0]["role"] == "assistant"  # chat prompts: TRL's conversational completions
    assert first["prompts"][0][-1]["role"] == "user" and len(first["ground_truth"]) == 32
    step = metrics(tmp_path / "run")
    assert "reward/exact_answer_mean" in step[1] and step[2]["step"] == 2


def test_rows_in_trls_shape_train_with_their_columns(embedded_cache, tmp_path, registered):
    rows = [{"prompt": f"{a}+{b}=", "solution": str(a + b), "level": a % 2} for a in range(8) for b in range(2)]
    seen = {}

    def accuracy(completions, solution, level, **kwargs):
        seen.update(completions=completions, solution=solution, level=level, prompts=kwargs["prompts"])
        return [float(answer in completion) for completion, answer in zip(completions, solution)]

    trainer = GRPOTrainer(model="embedded", reward_funcs=[accuracy, brevity, "format"], reward_weights=[1.0, 1.0, 0.1],
                          train_dataset=rows, args={**SMALL, "trainer.total_steps": 1,
                                                    "trainer.output_dir": str(tmp_path / "run")})
    assert Path(trainer.train()).is_dir()
    assert isinstance(seen["completions"][0], str)  # text prompts: text completions, as TRL gives them
    assert seen["prompts"][0].endswith("=") and seen["solution"][0].isdigit() and seen["level"][0] in (0, 1)
    first = metrics(tmp_path / "run")[1]
    assert {"reward/accuracy_mean", "reward/brevity_mean", "reward/format_reward_mean"} <= set(first)
    assert first["reward/brevity_mean"] < 0


def test_a_batched_functions_failures_are_the_batchs():
    rows = [("custom", "5", "5", {"index": 0}, [{"role": "user", "content": "2+3="}]),
            ("custom", "4", "5", {"index": 1}, [{"role": "user", "content": "2+3="}])]

    def right(completions, ground_truth, **kwargs):
        return [None if i else 1.0 for i, _ in enumerate(completions)]

    assert is_batched(right) and not needs_ground_truth(right)
    assert call_batch(right, "right", rows) == [RewardValue(1.0), RewardValue(0.0)]  # None: does not apply
    short = call_batch(lambda completions, **kw: [1.0], "short", rows)
    assert all(isinstance(o, RewardFailure) and o.kind == "bad_value" for o in short)
    assert "returned 1 values for a batch of 2 samples" in short[0].message
    raised = call_batch(lambda completions, **kw: 1 / 0, "raises", rows)
    assert raised[0].kind == "exception" and "ZeroDivisionError" in raised[0].message
    nan = call_batch(lambda completions, **kw: [1.0, float("nan")], "nan", rows)
    assert nan[0] == RewardValue(1.0) and nan[1].kind == "bad_value"


def test_bad_arguments_are_one_line(registered):
    with pytest.raises(ValueError, match="reward_weights has 2 entries for 1 reward functions"):
        GRPOTrainer("embedded", [lambda completions, **kw: []], [{"prompt": "x"}], reward_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="args: 'rollout.n' is not a key=value override"):
        GRPOTrainer("embedded", "format", [{"prompt": "x"}], args=["rollout.n"])
    trainer = GRPOTrainer("embedded", "format", [{"prompt": 3, "other": 1}])
    with pytest.raises(ValueError, match=r"train_dataset row 0: 'prompt' must be text or chat messages"):
        trainer.train()
