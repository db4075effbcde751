import pytest
import torch
from omegaconf import OmegaConf

from rlplat.reward import (
    REWARD_FUNCTIONS,
    OverlongShaping,
    RewardManager,
    UnknownDataSourceError,
    build_reward_manager,
    load_custom_function,
    token_level_scores,
)

CD = {"numbers": [3, 5, 7], "target": 22}


@pytest.mark.parametrize("name, text, truth, info, expected", [
    ("arithmetic", "122", "122", None, 1.0),
    ("arithmetic", " 122 ", "122", None, 1.0),
    ("arithmetic", "<answer>122</answer>", "122", None, 1.0),
    ("arithmetic", "1220", "122", None, 0.0),
    ("arithmetic", "", "122", None, 0.0),
    ("countdown", "3*5+7", "22", CD, 1.0),
    ("countdown", "<think>x</think><answer>(7+5)+3*... </answer><answer>7+3*5</answer>", "22", CD, 1.0),
    ("countdown", "3*5+7+3", "22", CD, 0.1),  # a number used twice: well-formed, wrong
    ("countdown", "3*5", "22", CD, 0.1),  # a number missing
    ("countdown", "7/0+3+5", "22", CD, 0.0),  # division by zero
    ("countdown", "__import__('os')", "22", CD, 0.0),  # not even in the allowed alphabet
    ("countdown", "3 5 7", "22", CD, 0.0),  # syntax error
    ("gsm8k", "so 1,000 + 234\n#### 1,234", "1234", None, 1.0),
    ("gsm8k", "#### $12.", "12", None, 1.0),
    ("gsm8k", "the answer is 12", "12", None, 0.0),
    ("math", "thus \\boxed{\\frac{1}{2}}", "\\dfrac{1}{2}", None, 1.0),
    ("math", "\\boxed{1} then \\boxed{ 0.5 }", "1/2", None, 1.0),
    ("math", "\\boxed{\\text{(B)}}", "(B)", None, 1.0),
    ("math", "\\boxed{x=3}", "3", None, 1.0),
    ("math", "\\boxed{90^\\circ}", "90", None, 1.0),
    ("math", "\\boxed{3", "3", None, 0.0),  # unbalanced
    ("math", "3", "3", None, 0.0),  # no box
    ("format", "<think>a</think>\n<answer>b</answer>", "", None, 1.0),
    ("format", "<think>a</think><answer>b</answer> extra", "", None, 0.0),
])
def test_scorers_by_hand(name, text, truth, info, expected):
    assert REWARD_FUNCTIONS.get(name)("src", text, truth, info) == pytest.approx(expected)


def test_auto_dispatch_and_unknown_source():
    auto = REWARD_FUNCTIONS.get("auto")
    assert auto("rlplat/arithmetic", "5", "5", {}) == 1.0
    assert auto("openai/gsm8k", "#### 5", "5", {}) == 1.0
    assert auto("DigitalLearningGmbH/MATH-lighteval", "\\boxed{5}", "5", {}) == 1.0
    assert auto("rlplat/countdown", "3*5+7", "22", CD) == 1.0
    with pytest.raises(UnknownDataSourceError, match="no reward function for data_source 'mystery'"):
        auto("mystery", "5", "5", {})


def test_custom_function_loading(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return float(solution_str == ground_truth)\nhelper = 3\n")
    assert load_custom_function(str(good), "compute_score")("s", "a", "a", None) == 1.0
    with pytest.raises(FileNotFoundError, match="reward.custom_fn.path='.*missing.py': no such file"):
        load_custom_function(str(tmp_path / "missing.py"), "f")
    with pytest.raises(AttributeError, match=r"reward.custom_fn.name='score' is not defined .* \['compute_score'\]"):
        load_custom_function(str(good), "score")
    with pytest.raises(TypeError, match="'helper' .* is not callable"):
        load_custom_function(str(good), "helper")
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(ImportError, match="failed to import: SyntaxError"):
        load_custom_function(str(broken), "f")


def constant(value):
    def fn(data_source, solution_str, ground_truth, extra_info=None):
        return value
    fn.__name__ = f"const{value}"
    return fn


def test_manager_weights_errors_and_overlong(capsys):
    def flaky(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "boom":
            raise RuntimeError("scorer bug")
        return 1.0

    manager = RewardManager([(constant(1.0), 0.5), (flaky, 2.0)])
    result = manager.score(["ok", "boom", "boom"], ["s"] * 3, ["x"] * 3, [{}] * 3, [1, 1, 1])
    assert result.scores == [2.5, 0.5, 0.5] and result.num_errors == 2
    assert result.per_function["flaky"] == [1.0, 0.0, 0.0]
    err = capsys.readouterr().err
    assert err.count("RuntimeError: scorer bug") == 1 and "sample 1" in err  # traceback printed once

    shaping = OverlongShaping(max_response_length=20, buffer_length=4, penalty_factor=1.0)
    assert [shaping(n) for n in (16, 17, 18, 20, 21)] == [0.0, -0.25, -0.5, -1.0, -1.0]
    shaped = RewardManager([(constant(1.0), 1.0)], shaping).score(["a", "b"], ["s"] * 2, ["x"] * 2, [{}] * 2, [10, 18])
    assert shaped.scores == [1.0, 0.5]


def test_manager_propagates_config_errors():
    manager = RewardManager([(REWARD_FUNCTIONS.get("auto"), 1.0)])
    with pytest.raises(UnknownDataSourceError):
        manager.score(["1"], ["nowhere"], ["1"], [{}], [1])


def test_token_level_scores():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    out = token_level_scores(torch.tensor([2.0, -1.0, 5.0]), mask)
    assert out.tolist() == [[0, 2.0, 0, 0], [0, 0, 0, -1.0], [0, 0, 0, 0]] and out.dtype == torch.float32


def test_build_reward_manager(tmp_path):
    custom = tmp_path / "r.py"
    custom.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 3.0\n")
    cfg = OmegaConf.create({"functions": ["auto"], "weights": [1.0], "custom_fn": {"path": None, "name": "compute_score"}})
    assert build_reward_manager(cfg).functions[0][0] is REWARD_FUNCTIONS.get("auto")
    cfg.custom_fn.path = str(custom)
    only_custom = build_reward_manager(cfg)  # replaces auto
    assert [w for _, w in only_custom.functions] == [1.0] and only_custom.functions[0][0]("s", "", "", {}) == 3.0
    cfg.functions, cfg.weights = ["arithmetic", "format"], [1.0, 0.2]
    assert len(build_reward_manager(cfg).functions) == 3  # added after the named ones
    overlong = OmegaConf.create({"enable": True, "length": 4, "penalty_factor": 0.5})
    assert build_reward_manager(cfg, overlong, 16).overlong == OverlongShaping(16, 4, 0.5)
    cfg.weights = [1.0]
    with pytest.raises(ValueError, match="reward.weights has 1 entries but reward.functions has 2"):
        build_reward_manager(cfg)
