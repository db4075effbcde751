"""RewardManager weighting and error isolation, DAPO overlong shaping, token placement, config building."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from rlplat.config.schema import OverlongBufferConfig, RewardConfig
from rlplat.registry import UnknownNameError
from rlplat.reward import (
    REWARD_FUNCTIONS,
    OverlongShaping,
    RewardConfigError,
    RewardManager,
    UnknownDataSourceError,
    build_reward_manager,
    token_level_scores,
)


def exact(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def length(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str))


def flaky(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise RuntimeError("scorer bug")
    return 1.0


def run(manager, texts, truths=None, lengths=None, sources=None):
    n = len(texts)
    return manager.score(texts, sources or ["src"] * n, truths or ["a"] * n, [{}] * n, lengths or [1] * n)


def test_weighted_sum_of_two_functions():
    result = run(RewardManager([(exact, 2.0), (length, -0.5)]), ["a", "bcd", ""])
    assert result.per_function == {"exact": [1.0, 0.0, 0.0], "length": [1.0, 3.0, 0.0]}
    assert result.scores == [2.0 * 1 - 0.5 * 1, -0.5 * 3, 0.0]
    assert result.num_errors == 0 and result.overlong == []


def test_repeated_function_names_get_distinct_keys():
    result = run(RewardManager([(exact, 1.0), (exact, 1.0), (length, 1.0)]), ["a"])
    assert list(result.per_function) == ["exact", "exact_2", "length"]
    assert result.scores == [3.0]


def test_an_exception_scores_zero_is_counted_and_printed_once(capsys):
    manager = RewardManager([(exact, 1.0), (flaky, 2.0)])
    result = run(manager, ["a", "boom", "boom"], sources=["s0", "s1", "s2"])
    assert result.scores == [3.0, 0.0, 0.0]  # the other function still counts for the failing samples
    assert result.per_function["flaky"] == [1.0, 0.0, 0.0] and result.num_errors == 2
    err = capsys.readouterr().err
    assert err.count("Traceback") == 1 and err.count("[rlplat.reward] reward function") == 1
    assert "reward function 'flaky' on sample 1 (data_source 's1', ground_truth 'a') raised RuntimeError: " \
           "scorer bug" in err
    assert result.first_error.startswith("reward function 'flaky' on sample 1")

    again = run(manager, ["boom"])  # the same manager: counted, not printed
    assert again.num_errors == 1 and capsys.readouterr().err == ""
    run(RewardManager([(flaky, 1.0)]), ["boom"])  # another manager prints its own first error
    assert "RuntimeError: scorer bug" in capsys.readouterr().err


def test_non_finite_values_are_errors(capsys):
    def bad(data_source, solution_str, ground_truth, extra_info=None):
        return {"nan": math.nan, "inf": math.inf, "text": "high"}.get(solution_str, 0.5)

    result = run(RewardManager([(bad, 1.0)]), ["nan", "inf", "text", "ok"])
    assert result.scores == [0.0, 0.0, 0.0, 0.5] and result.num_errors == 3
    assert "'bad' on sample 0 (data_source 'src', ground_truth 'a') returned nan" in capsys.readouterr().err


def test_unknown_data_source_propagates():
    manager = RewardManager([(REWARD_FUNCTIONS.get("auto"), 1.0)])
    with pytest.raises(UnknownDataSourceError, match="'nowhere'"):
        run(manager, ["1"], sources=["nowhere"])


def test_score_checks_argument_lengths():
    with pytest.raises(ValueError, match="2 texts but 1 response_lengths"):
        RewardManager([(exact, 1.0)]).score(["a", "b"], ["s", "s"], ["a", "a"], [{}, {}], [1])
    with pytest.raises(ValueError, match="at least one"):
        RewardManager([])


# ------------------------------------------------------------------------------------------------ overlong
@pytest.mark.parametrize("length, expected", [
    (0, 0.0), (16, 0.0),  # up to L_max - L_c = 16: no penalty
    (17, -0.125), (18, -0.25), (19, -0.375), (20, -0.5),  # linear in the buffer, -factor at L_max
    (21, -0.5), (1000, -0.5),  # beyond L_max: -factor
])
def test_overlong_shaping_values(length, expected):
    assert OverlongShaping(max_response_length=20, buffer_length=4, penalty_factor=0.5)(length) == expected


def test_overlong_shaping_matches_dapo_formula():
    shaping, l_max, l_c = OverlongShaping(64, 16, 1.0), 64, 16
    for n in range(0, 80):  # 2503.14476 eq. 13, written independently
        paper = 0.0 if n <= l_max - l_c else ((l_max - l_c) - n) / l_c if n <= l_max else -1.0
        assert shaping(n) == pytest.approx(paper)


def test_overlong_shaping_is_added_by_the_manager():
    manager = RewardManager([(exact, 1.0)], OverlongShaping(20, 4, 1.0))
    result = run(manager, ["a", "a", "b"], lengths=[10, 18, 20])
    assert result.overlong == [0.0, -0.5, -1.0]
    assert result.scores == [1.0, 0.5, -1.0]
    assert result.per_function["exact"] == [1.0, 1.0, 0.0]  # unshaped


@pytest.mark.parametrize("kwargs, match", [
    ({"buffer_length": 0}, "buffer_length"),
    ({"buffer_length": 21}, "buffer_length"),
    ({"penalty_factor": -1.0}, "penalty_factor"),
])
def test_overlong_shaping_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OverlongShaping(**{"max_response_length": 20, "buffer_length": 4, "penalty_factor": 1.0, **kwargs})


# ------------------------------------------------------------------------------------------- token placement
def test_token_level_scores_ragged_and_empty_rows():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
    out = token_level_scores(torch.tensor([2.0, -1.0, 5.0, 0.25], dtype=torch.float64), mask)
    assert out.dtype == torch.float32 and out.shape == (4, 4)
    assert out.tolist() == [[0, 2.0, 0, 0], [0, 0, 0, -1.0], [0, 0, 0, 0], [0, 0, 0.25, 0]]


def test_token_level_scores_matches_a_loop():
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(16, 9, generator=gen) < 0.5
    mask[3] = False
    scores = torch.randn(16, generator=gen)
    expected = torch.zeros(16, 9)
    for i in range(16):
        valid = [t for t in range(9) if mask[i, t]]
        if valid:
            expected[i, valid[-1]] = scores[i]
    assert torch.equal(token_level_scores(scores, mask), expected)
    assert torch.allclose(token_level_scores(scores, mask).sum(-1), torch.where(mask.any(-1), scores, 0.0))


def test_token_level_scores_shapes():
    assert token_level_scores(torch.ones(2), torch.zeros(2, 0)).shape == (2, 0)
    with pytest.raises(ValueError, match=r"scores \[batch\] and response_mask \[batch, response_len\]"):
        token_level_scores(torch.ones(3), torch.ones(2, 4))


# ------------------------------------------------------------------------------------------- from the config
CUSTOM = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 3.0\n"


def reward_cfg(**overrides):
    base = {"functions": ["auto"], "weights": [1.0], "custom_fn": {"path": None, "name": "compute_score"}}
    return OmegaConf.create({**base, **overrides})


def test_build_from_names_and_weights():
    manager = build_reward_manager(reward_cfg(functions=["countdown", "format"], weights=[1.0, 0.2]))
    assert manager.functions == [(REWARD_FUNCTIONS.get("countdown"), 1.0), (REWARD_FUNCTIONS.get("format"), 0.2)]
    assert manager.overlong is None
    texts = ["<think>x</think><answer>3*5+7</answer>", "3*5+7", "<think>x</think><answer>3+5+7</answer>"]
    info = {"numbers": [3, 5, 7], "target": 22}
    result = manager.score(texts, ["rlplat/countdown"] * 3, ["22"] * 3, [info] * 3, [5] * 3)
    assert result.scores == pytest.approx([1.2, 1.0, 0.3])


def test_only_when_correct_gates_the_format_reward_on_the_answer():
    # countdown: 1 for a correct expression, 0.1 for a well-formed wrong one; format: 1 for <think>/<answer>
    texts = ["<think>x</think><answer>3*5+7</answer>", "3*5+7", "<think>x</think><answer>3+5+7</answer>"]
    info = {"numbers": [3, 5, 7], "target": 22}

    def score(**gate):
        manager = build_reward_manager(reward_cfg(functions=["countdown", "format"], weights=[1.0, 0.2], **gate))
        return manager.score(texts, ["rlplat/countdown"] * 3, ["22"] * 3, [info] * 3, [5] * 3)

    additive, gated = score(), score(only_when_correct=["format"])
    assert additive.scores == pytest.approx([1.2, 1.0, 0.3])  # the wrong answer still earns the format 0.2
    assert gated.scores == pytest.approx([1.2, 1.0, 0.1])  # ... and here it does not
    assert gated.per_function["format_reward"] == [1.0, 0.0, 0.0]  # terms @ weights == scores (gdpo)
    assert list(gated.per_function) == ["countdown", "format_reward"]  # reward.functions order
    # a reward function's own acc decides correctness when it gives one
    manager = RewardManager([(lambda *a: {"score": 0.0, "acc": 1.0}, 1.0), (exact, 1.0)], only_when_correct=[1])
    assert run(manager, ["a", "b"]).scores == [1.0, 0.0]
    with pytest.raises(RewardConfigError, match="names every reward function"):
        build_reward_manager(reward_cfg(functions=["format"], weights=[1.0], only_when_correct=["format"]))


def test_build_from_the_schema_defaults():
    manager = build_reward_manager(OmegaConf.structured(RewardConfig()), OmegaConf.structured(OverlongBufferConfig()))
    assert manager.functions == [(REWARD_FUNCTIONS.get("auto"), 1.0)] and manager.overlong is None


def test_build_with_a_custom_function(tmp_path):
    path = tmp_path / "r.py"
    path.write_text(CUSTOM)
    custom = {"path": str(path), "name": "compute_score"}
    only = build_reward_manager(reward_cfg(custom_fn=custom, weights=[2.0]))  # replaces auto, keeps its weight
    assert len(only.functions) == 1 and only.functions[0][1] == 2.0 and run(only, ["x"]).scores == [6.0]
    added = build_reward_manager(reward_cfg(custom_fn=custom, functions=["format", "auto"], weights=[0.5, 1.0]))
    assert [w for _, w in added.functions] == [0.5, 1.0, 1.0]  # appended after the named ones, weight 1.0
    assert added.names == ["format_reward", "auto", "compute_score"]
    with pytest.raises(RewardConfigError, match="reward.custom_fn.name='nope'"):
        build_reward_manager(reward_cfg(custom_fn={"path": str(path), "name": "nope"}))


def test_build_with_overlong_shaping():
    overlong = OmegaConf.create({"enable": True, "length": 4, "penalty_factor": 0.5})
    assert build_reward_manager(reward_cfg(), overlong, 16).overlong == OverlongShaping(16, 4, 0.5)
    assert build_reward_manager(reward_cfg(), OmegaConf.create({"enable": False, "length": 4}), 16).overlong is None
    with pytest.raises(ValueError, match="needs data.max_response_length"):
        build_reward_manager(reward_cfg(), overlong, None)
    with pytest.raises(ValueError, match="buffer_length"):
        build_reward_manager(reward_cfg(), overlong, 3)


def test_build_rejects_bad_configs():
    with pytest.raises(ValueError, match="reward.weights has 1 entries but reward.functions has 2"):
        build_reward_manager(reward_cfg(functions=["arithmetic", "format"], weights=[1.0]))
    with pytest.raises(UnknownNameError, match=r"reward.functions\[1\]='gsm8kk' .* did you mean 'gsm8k'"):
        build_reward_manager(reward_cfg(functions=["format", "gsm8kk"], weights=[1.0, 1.0]))
    with pytest.raises(ValueError, match="nothing to score with"):
        build_reward_manager(reward_cfg(functions=[], weights=[]))


def sees_prompt(data_source, solution_str, ground_truth, extra_info=None, prompt=None):
    return float(prompt is not None and prompt[-1]["content"] == solution_str)


def slow_or_failing(data_source, solution_str, ground_truth, extra_info=None):
    import time

    if solution_str == "boom":
        raise RuntimeError("no")
    if solution_str == "hang":
        time.sleep(60)
    time.sleep(0.2 if solution_str == "slow" else 0.0)
    return 1.0 if solution_str == "one" else 0.0


@pytest.mark.parametrize("isolation", ["inprocess", "process"])
def test_a_function_with_a_prompt_parameter_gets_the_prompt_messages(isolation):
    manager = RewardManager([(sees_prompt, 1.0), (exact, 1.0)], isolation=isolation, num_workers=2)
    try:
        prompts = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "no"}]]
        result = manager.score(["hi", "hi"], ["src"] * 2, ["a"] * 2, [{}] * 2, [1, 1], prompts=prompts)
        assert result.per_function["sees_prompt"] == [1.0, 0.0] and result.per_function["exact"] == [0.0, 0.0]
        assert run(manager, ["hi"]).per_function["sees_prompt"] == [0.0]  # no prompts given: None
    finally:
        manager.close()


def test_each_function_reports_its_spread_errors_timeouts_and_seconds_per_call():
    manager = RewardManager([(slow_or_failing, 1.0), (exact, 1.0)], isolation="process", timeout_s=1.0,
                            num_workers=3)
    try:
        result = run(manager, ["one", "zero", "slow", "boom", "hang", "one"])
    finally:
        manager.close()
    stats = result.stats["slow_or_failing"]
    values = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]  # failed calls count 0
    mean = sum(values) / 6
    assert stats["std"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / 6))
    assert (stats["errors"], stats["timeouts"]) == (2.0, 1.0)
    assert 1.0 <= stats["latency_max_s"] < 1.6  # the call that hung, as long as its deadline (not twice it)
    assert stats["latency_mean_s"] > 0.2 / 6
    assert (result.stats["exact"]["errors"], result.stats["exact"]["timeouts"]) == (0.0, 0.0)
