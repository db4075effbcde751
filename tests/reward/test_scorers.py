"""Rule-based scorers, ``auto`` dispatch and custom-function loading, against hand-written cases."""

import pickle

import pytest

from rlplat.reward import REWARD_FUNCTIONS, UnknownDataSourceError, load_custom_function, safe_arithmetic
from rlplat.reward.equivalence import normalize_math
from rlplat.reward.scorers import last_boxed, scorer_for

CD = {"numbers": [3, 5, 7], "target": 22}


def score(name, text, truth="", info=None):
    return REWARD_FUNCTIONS.get(name)("src", text, truth, info)


def test_builtins_are_registered():
    assert set(REWARD_FUNCTIONS.names()) >= {"arithmetic", "countdown", "gsm8k", "math", "format", "auto"}


@pytest.mark.parametrize("text, truth, expected", [
    ("122", "122", 1.0),
    ("  122\n", "122", 1.0),
    ("122<|endoftext|>", "122", 1.0),
    ("122 <|im_end|>\n", "122", 1.0),
    ("<answer>122</answer>", "122", 1.0),
    ("<answer> 122 </answer></s>", "122", 1.0),
    ("-7", "-7", 1.0),
    ("1220", "122", 0.0),
    ("12", "122", 0.0),
    ("0122", "122", 0.0),  # exactly the integer, not a number equal to it
    ("+122", "122", 0.0),
    ("122 because 100+22", "122", 0.0),
    ("so <answer>122</answer>", "122", 0.0),  # the wrapper must be the whole response
    ("<|endoftext|>122", "122", 0.0),
    ("", "122", 0.0),
])
def test_arithmetic(text, truth, expected):
    assert score("arithmetic", text, truth) == expected


@pytest.mark.parametrize("text, expected", [
    ("3*5+7", 1.0),
    (" (7 + 3 * 5) ", 1.0),
    ("<think>7+15</think> <answer>(3*5)+7</answer>", 1.0),
    ("<answer>3+5+7</answer> then <answer>7+3*5</answer>", 1.0),  # the last answer counts
    ("<answer>7+3*5</answer> then <answer>3+5+7</answer>", 0.1),
    ("3*5+7+3", 0.1),  # 3 used twice
    ("3*5", 0.1),  # 7 missing
    ("3*5+8-1", 0.1),  # right value, wrong numbers
    ("3+5+7", 0.1),  # right numbers, wrong value
    ("-3+5*5", 0.1),  # unary minus parses; wrong numbers
    ("7/2+3+5", 0.1),  # a non-integer result: well-formed, wrong
    ("7/0+3+5", 0.0),  # division by zero
    ("3*5+7=22", 0.0),  # "=" is outside the alphabet
    ("3*5+7_0", 0.0),  # a Python digit separator is outside it too
    ("(3*5\n+7)", 0.0),  # only spaces inside
    ("3**5+7", 0.0),  # power is not an allowed operator
    ("3//5+7", 0.0),
    ("3 5 7", 0.0),  # syntax error
    ("(3*5+7", 0.0),
    ("__import__('os').system('true')", 0.0),
    ("<answer>__import__('os')</answer>", 0.0),
    ("9" * 400 + "*3*5*7", 0.0),  # too large for a float comparison: not an error, just 0
    ("(" * 300 + "3*5+7" + ")" * 300, 0.0),  # deeper than the parser allows
    ("", 0.0),
])
def test_countdown(text, expected):
    assert score("countdown", text, "22", CD) == pytest.approx(expected)


def test_countdown_non_integer_intermediate_and_target_source():
    # 4/3 is not an integer, but the expression still equals the target exactly enough.
    assert score("countdown", "4/3*3+4", "8", {"numbers": [3, 3, 4, 4], "target": 8}) == 1.0
    assert score("countdown", "4/3*3+4", "8", {"numbers": [3, 4, 4], "target": 8}) == pytest.approx(0.1)
    # The target comes from extra_info; ground_truth is only the fallback.
    assert score("countdown", "3*5+7", "999", CD) == 1.0
    assert score("countdown", "3*5+7", "22", {"numbers": [7, 5, 3]}) == 1.0


def test_countdown_without_numbers_is_a_data_error():
    with pytest.raises(ValueError, match=r"extra_info\['numbers'\]"):
        score("countdown", "3*5+7", "22", {"target": 22})


def test_safe_arithmetic_never_executes_anything():
    assert safe_arithmetic("(1 + 2) * -3 / 2") == -4.5
    for expression in ("__import__('os')", "(lambda: 1)()", "x + 1", "2 ** 10", "[1][0]", "1 if 1 else 2", "1.5"):
        with pytest.raises(ValueError, match="disallowed expression element"):
            safe_arithmetic(expression)
    with pytest.raises(ZeroDivisionError):
        safe_arithmetic("1/(2-2)")


@pytest.mark.parametrize("text, truth, expected", [
    ("so 1,000 + 234\n#### 1,234", "1234", 1.0),
    ("#### 1,234", "1,234", 1.0),
    ("#### $12.", "12", 1.0),
    ("#### -$5", "-5", 1.0),
    ("#### 72.00", "72", 1.0),
    ("#### 3 and later #### 4", "4", 1.0),  # the last #### counts
    ("#### 4 and later #### 3", "4", 0.0),
    ("#### 4 and later ####", "4", 0.0),  # nothing after the last ####
    ("#### 0.5", ".5", 1.0),
    ("#### 12", "13", 0.0),
    ("the answer is 12", "12", 0.0),
    ("#### twelve", "12", 0.0),
    ("#### 5 apples", "5", 1.0),
    ("#### 12abc", "12", 0.0),
    ("#### 1e999999999", "1", 0.0),
    ("#### 7", "Natalia sold 48/2 = 24 clips.\n#### 7", 1.0),  # a full GSM8K solution as ground truth
])
def test_gsm8k(text, truth, expected):
    assert score("gsm8k", text, truth) == expected


# The forms a model writes after "####" that a strict "number right after ####" rule scored 0 (issue: rewards).
@pytest.mark.parametrize("text", [
    "6 * 3 = 18\n#### **18**",
    "#### \\$18",
    "#### $18.00",
    "#### \\boxed{18}",
    "#### The answer is 18",
    "#### Answer: 18 apples.",
    "6 * 3 = 18 cookies.\n#### 18\n\n#### Check\nWe used 6 bags of 3.",  # a markdown heading after the answer
    "#### 18\n#### Step check\n3 * 6",
])
def test_gsm8k_accepts_the_forms_models_write(text):
    assert score("gsm8k", text, "18") == 1.0


@pytest.mark.parametrize("text, truth, expected", [
    ("#### \u22125", "-5", 1.0),  # Unicode minus
    ("#### **-18**", "-18", 1.0),
    ("#### 17\n#### Check\n18", "18", 0.0),  # the heading is skipped, the answer's line counts, not a later number
    ("#### 18 or 20", "20", 0.0),  # the first number on the answer's line
    ("#### 5x2 = 18", "18", 1.0),  # "5x2" is not a number
])
def test_gsm8k_answer_line_rules(text, truth, expected):
    assert score("gsm8k", text, truth) == expected


@pytest.mark.parametrize("text, truth, expected", [
    ("She has 6 bags of 3, so 18 cookies.", "18", 1.0),
    ("So the total is $1,234.", "1234", 1.0),
    ("**18**", "18", 1.0),
    ("The answer is \\boxed{18}.", "18", 1.0),
    ("18 cookies, minus 2 eaten", "18", 0.0),  # the LAST number counts
    ("#### 18", "18", 1.0),
    ("no number at all", "18", 0.0),
    ("", "18", 0.0),
])
def test_gsm8k_flexible(text, truth, expected):
    assert score("gsm8k_flexible", text, truth) == expected


# The MATH forms the old normal-form comparison rejected (issue: rewards), one assertion per form.
@pytest.mark.parametrize("boxed, truth", [
    ("5\\text{ cm}", "5"),  # units
    ("x^{2}", "x^2"),  # braces around a one-character exponent
    ("2, 1", "1, 2"),  # an unordered solution list
    ("\\{1,2\\}", "1, 2"),  # a set
    ("(0.5, 3)", "\\left(\\frac12, 3\\right)"),  # a tuple with mixed number forms
    ("\\sqrt{12}", "2\\sqrt{3}"),  # a radical in another form
    ("\\pi/2", "\\frac{\\pi}{2}"),  # pi in another form
    ("A", "\\text{(A)}"),  # an answer choice
    ("(x+1)^2", "x^2+2x+1"),  # symbolic equivalence
    ("AB = 10", "10"),  # a labelled answer
    ("f(2) = 8", "8"),
    ("x = 1 \\text{ or } x = -2", "1, -2"),
    ("1{,}000", "1000"),
    ("\u22125", "-5"),  # Unicode minus
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\left[\\begin{matrix}1&2\\\\3&4\\end{matrix}\\right]"),
    ("\\text{Tuesday}", "Tuesday"),
])
def test_math_accepts_the_forms_models_write(boxed, truth):
    assert score("math", f"So the answer is $\\boxed{{{boxed}}}$.", truth) == 1.0


def test_math_boxed_with_a_space_before_the_brace():
    assert score("math", "The answer is \\boxed {7}.", "7") == 1.0


@pytest.mark.parametrize("boxed, truth", [
    ("0.333", "\\frac{1}{3}"),  # rounded
    ("18 \\text{ or } 20", "18"),  # hedged
    ("(3, 1)", "(1, 3)"),  # order matters in a tuple
    ("\\text{Tuseday}", "Tuesday"),  # a word is compared as a word
    ("\\text{yadseuT}", "Tuesday"),  # not as a product of letters (an anagram)
    ("B", "\\text{(A)}"),
])
def test_math_rejects_near_misses(boxed, truth):
    assert score("math", f"\\boxed{{{boxed}}}", truth) == 0.0


@pytest.mark.parametrize("text, truth, expected", [
    ("thus \\boxed{\\frac{1}{2}}", "\\dfrac{1}{2}", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\dfrac12}", "1/2", 1.0),
    ("\\boxed{-\\frac{3}{4}}", "-0.75", 1.0),
    ("\\boxed{1} then \\boxed{ 0.5 }", "1/2", 1.0),  # the last box counts
    ("\\boxed{0.5} then \\boxed{1}", "1/2", 0.0),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),  # nested braces
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
    ("\\boxed{1,2}", "12", 0.0),  # a pair is not a thousands separator
    ("\\boxed{1,000}", "1000", 1.0),
    ("\\boxed{\\text{(B)}}", "(B)", 1.0),
    ("\\boxed{\\textbf{\\text{B}}}", "B", 1.0),
    ("\\boxed{x = 3.}", "3", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{90^{\\circ}}", "90", 1.0),
    ("\\boxed{\\$5\\!}", "5", 1.0),
    ("\\boxed{2}", "The sum is $\\boxed{2}$.", 1.0),  # a full solution as ground truth
    ("\\boxed{(1, 2]}", "\\left(1, 2\\right)", 0.0),  # \right is dropped, the bracket kept
    ("\\boxed{3", "3", 0.0),  # not closed
    ("3", "3", 0.0),  # no box
    ("\\boxed{}", "3", 0.0),
    ("\\boxed{1e999999999}", "1", 0.0),
    ("\\boxed{\\frac{1}{0}}", "0", 0.0),
])
def test_math(text, truth, expected):
    assert score("math", text, truth) == expected


def test_math_helpers():
    assert last_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} \\fbox{2}") == "2"
    assert last_boxed("no box") is None
    assert normalize_math(" \\left( \\dfrac{1}{2}, \\text{ cm} \\right) ") == "(\\frac{1}{2},cm)"
    assert normalize_math("x \\rightarrow 0") == "x\\rightarrow0"  # \right is dropped, \rightarrow is kept
    assert normalize_math("\u22121{,}000") == "-1000"
    assert last_boxed("\\boxed {7} and") == "7"


@pytest.mark.parametrize("text, expected", [
    ("<think>a</think>\n<answer>b</answer>", 1.0),
    ("  <think>\nline\n</think><answer>\n42\n</answer>\n", 1.0),
    ("<think>a</think><answer>b</answer> extra", 0.0),
    ("hello <think>a</think><answer>b</answer>", 0.0),
    ("<answer>b</answer><think>a</think>", 0.0),
    ("<think>a</think>", 0.0),
    ("<answer>b</answer>", 0.0),
    ("", 0.0),
])
def test_format(text, expected):
    assert score("format", text) == expected


@pytest.mark.parametrize("source, scorer, text, truth, info", [
    ("rlplat/arithmetic", "arithmetic", "5", "5", {}),
    ("rlplat/countdown", "countdown", "3*5+7", "22", CD),
    ("openai/gsm8k", "gsm8k", "#### 5", "5", {}),
    ("gsm8k", "gsm8k", "#### 5", "5", {}),
    ("lighteval/MATH", "math", "\\boxed{5}", "5", {}),
    ("DigitalLearningGmbH/MATH-lighteval", "math", "\\boxed{5}", "5", {}),
    ("math_dapo", "math", "\\boxed{5}", "5", None),
    ("openai/grade-school-math", "gsm8k", "#### 5", "5", {}),  # has "math" in its name: still GSM8K
    ("HuggingFaceH4/MATH-500", "math", "\\boxed{5}", "5", {}),
    ("aime2024", "math", "\\boxed{5}", "5", {}),  # a documented pattern
    ("math/algebra", "math", "\\boxed{5}", "5", {}),
])
def test_auto_dispatch(source, scorer, text, truth, info):
    assert scorer_for(source) is REWARD_FUNCTIONS.get(scorer)
    assert REWARD_FUNCTIONS.get("auto")(source, text, truth, info) == 1.0


@pytest.mark.parametrize("source", ["mathematics-textbook", "my_math_set", "Math", "gsm8k-hard"])
def test_auto_routes_by_name_and_pattern_never_by_substring(source):
    with pytest.raises(UnknownDataSourceError, match="patterns: 'aime\\*'"):
        scorer_for(source)


def test_auto_unknown_data_source_is_a_config_error():
    with pytest.raises(UnknownDataSourceError, match="no reward function for data_source 'mystery'") as err:
        REWARD_FUNCTIONS.get("auto")("mystery", "5", "5", {})
    assert isinstance(err.value, ValueError)
    for hint in ("rlplat/arithmetic", "openai/gsm8k", "reward.functions", "reward.custom_fn.path"):
        assert hint in str(err.value)


# --------------------------------------------------------------------------------------- custom functions
GOOD = """\
from __future__ import annotations

import re
from dataclasses import dataclass
from os.path import join


@dataclass
class Counter:
    hits: int = 0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def _private(x):
    return x


helper = 3
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_custom_function_loads_and_scores(tmp_path):
    fn = load_custom_function(write(tmp_path, "good.py", GOOD), "compute_score")
    assert fn("s", "a", "a", None) == 1.0 and fn("s", "a", "b", {}) == 0.0
    assert pickle.loads(pickle.dumps(fn)) is fn  # importable by its module name (Ray workers pickle it)


def test_custom_function_loads_are_independent(tmp_path):
    path = write(tmp_path, "r.py", "K = 1\ndef compute_score(a, b, c, d):\n    return K\n")
    first = load_custom_function(path, "compute_score")
    (tmp_path / "r.py").write_text("K = 2\ndef compute_score(a, b, c, d):\n    return K\n")
    second = load_custom_function(path, "compute_score")
    assert (first("s", "", "", None), second("s", "", "", None)) == (1, 2)


def test_custom_function_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"reward.custom_fn.path='.*missing.py': no such file"):
        load_custom_function(str(tmp_path / "missing.py"), "compute_score")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_custom_function(str(tmp_path), "compute_score")  # a directory is not a file


@pytest.mark.parametrize("source, original", [
    ("def f(:\n", "SyntaxError"),
    ("import rlplat_no_such_module_xyz\n", "No module named 'rlplat_no_such_module_xyz'"),
    ("raise RuntimeError('bad config in reward file')\n", "RuntimeError: bad config in reward file"),
    ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
])
def test_custom_function_import_errors(tmp_path, source, original):
    path = write(tmp_path, "broken.py", source)
    with pytest.raises(ImportError, match="reward.custom_fn.path=.*broken.py.* failed to import") as err:
        load_custom_function(path, "f")
    assert original in str(err.value)


def test_custom_function_missing_name_lists_what_the_file_defines(tmp_path):
    path = write(tmp_path, "good.py", GOOD)
    with pytest.raises(AttributeError, match=r"reward.custom_fn.name='score' is not defined in .*good.py") as err:
        load_custom_function(path, "score")
    # Its own public functions and classes; not imports (join, dataclass), private names or constants.
    assert "['Counter', 'compute_score']" in str(err.value)


def test_custom_function_not_callable_or_wrong_signature(tmp_path):
    path = write(tmp_path, "good.py", GOOD + "def two(solution_str, ground_truth):\n    return 0.0\n")
    with pytest.raises(TypeError, match=r"reward.custom_fn.name='helper' in .*good.py is not callable \(it is a int"):
        load_custom_function(path, "helper")
    with pytest.raises(TypeError, match=r"'two' .* has signature two\(solution_str, ground_truth\)"):
        load_custom_function(path, "two")


def test_builtin_task_solutions_score_full_marks():
    from rlplat.data.synthetic import generate

    auto = REWARD_FUNCTIONS.get("auto")
    for row in generate("countdown", 50, seed=0) + generate("countdown", 20, seed=1, count=4, think_format=True):
        info, truth = row["extra_info"], row["reward_model"]["ground_truth"]
        assert auto(row["data_source"], info["solution"], truth, info) == 1.0
        assert auto(row["data_source"], f"<think>…</think><answer>{info['solution']}</answer>", truth, info) == 1.0
    for row in generate("arithmetic", 50, seed=0, ops="+-"):
        truth = row["reward_model"]["ground_truth"]
        assert auto(row["data_source"], truth + "<|endoftext|>", truth, row["extra_info"]) == 1.0
        assert auto(row["data_source"], str(int(truth) + 1), truth, row["extra_info"]) == 0.0
