"""``reward.functions=[ifeval]`` and ``auto`` on open-instruct's RLVR-IF rows: on constructed responses covering
every IFEval instruction type, its verdicts are lm-evaluation-harness's strict verdicts (the reference: its own
``test_instruction_following_strict`` on the answer), through the row format open-instruct writes, with thinking
before the answer; each type is seen both followed and not."""

import json
from collections import defaultdict

import pytest

from rlplat.reward.ifeval import NEEDS_PUNKT, answer_of, constraints, followed, ifeval, reference
from rlplat.reward.manager import RewardManager
from rlplat.reward.scorers import REWARD_FUNCTIONS, scorer_for

pytest.importorskip("lm_eval", reason="the ifeval extra (pip install -e '.[ifeval]')")

PARAGRAPHS = "First part of the answer.\n\n***\n\nSecond part of the answer."
ENGLISH = "The quick brown fox jumps over the lazy dog while the farmer watches from the old wooden porch."
FRENCH = "Le renard brun saute par-dessus le chien paresseux pendant que le fermier regarde depuis le porche."
# (instruction id, its arguments, responses): each type's responses follow it and break it
CASES = [
    ("change_case:english_capital", {},
     ["HELLO THERE FRIEND", "Hello there friend", "ALL CAPS BUT one", "THE WEATHER IS NICE TODAY."]),
    ("change_case:english_lowercase", {},
     ["hello there friend", "Hello there friend", "all lower but ONE", "the weather is nice today."]),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     ["THE BIG dog ran.", "the dog ran.", "ONE word only."]),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "less than"},
     ["the dog ran.", "THE BIG RED dog.", "ONE capital."]),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a haiku about rain."},
     ["Write a haiku about rain. Drops fall on the roof.", "Drops fall on the roof.", "write a haiku about rain. ok"]),
    ("combination:two_responses", {}, ["Answer one.\n******\nAnswer two.", "Only one answer.",
                                       "Same.\n******\nSame.", "First.\n******\nSecond.\n******\nThird."]),
    ("detectable_content:number_placeholders", {"num_placeholders": 2},
     ["Send it to [name] at [address].", "Send it to [name].", "No placeholders at all.", "[a] [b] [c]"]),
    ("detectable_content:postscript", {"postscript_marker": "P.S."},
     ["Thanks for reading.\nP.S. See you soon.", "Thanks for reading.", "Thanks.\nPS see you"]),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"},
     ["Bye.\nP.P.S one more", "Bye.\nP.S. one", "Bye. P.P.S inline"]),
    ("detectable_format:constrained_response", {},
     ["My answer is yes.", "Probably.", "My answer is maybe.", "My answer is no."]),
    ("detectable_format:json_format", {},
     ['{"a": 1, "b": [2, 3]}', "a: 1", '```json\n{"a": 1}\n```', '{"a": 1,}', '[1, 2]']),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     ["Section 1\nIntro.\nSection 2\nBody.", "Section 1\nOnly one.", "Intro.\nSECTION 2\nBody."]),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2},
     ["* first\n* second", "* only one", "- first\n- second", "* a\n* b\n* c", "No list."]),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2},
     ["This is *important* and *urgent*.", "Only *one* here.", "Nothing highlighted.", "**Bold** and *it* here."]),
    ("detectable_format:title", {},
     ["<<A Title>>\nThe text.", "A Title\nThe text.", "<<>> empty title", "Text <<late title>>."]),
    ("keywords:existence", {"keywords": ["apple", "pear"]},
     ["An apple and a pear.", "Only an apple.", "Pears and apples.", "Nothing here."]),
    ("keywords:forbidden_words", {"forbidden_words": ["bad", "awful"]},
     ["A good day.", "A bad day.", "An Awful day.", "A badminton day."]),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "at least"},
     ["The cat saw another cat.", "One cat only.", "Cat and CAT.", "category cats"]),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "less than"},
     ["One cat only.", "The cat saw another cat.", "No animals."]),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 3, "let_relation": "at least"},
     ["Zebras zigzag lazily.", "A zebra.", "zzz", "ZZZ"]),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 3, "let_relation": "less than"},
     ["A zebra.", "Zebras zigzag lazily.", "None."]),
    ("language:response_language", {"language": "en"}, [ENGLISH, FRENCH, ENGLISH.upper()]),
    ("language:response_language", {"language": "fr"}, [FRENCH, ENGLISH]),
    ("length_constraints:nth_paragraph_first_word",
     {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     ["We start.\n\nThen we finish.", "We start.\n\nSo we finish.", "We start.", "We start.\n\nthen, we finish."]),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2},
     [PARAGRAPHS, "Just one paragraph.", PARAGRAPHS + "\n\n***\n\nThird."]),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"},
     ["One sentence.", "One. Two. Three.", "Dr. Smith arrived."]),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"},
     ["One. Two.", "Only one."]),
    ("length_constraints:number_words", {"num_words": 5, "relation": "less than"},
     ["Three short words.", "This answer has far too many words in it.", "One two three four five.",
      "Four words right here."]),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"},
     ["One two three four five six.", "Too few.", "Exactly five words right here."]),
    ("punctuation:no_comma", {}, ["No commas here.", "Commas, everywhere.", "Semi; colons: fine.", "A list: a, b, c"]),
    ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"},
     ["Done. Is there anything else I can help with?", "Done.", "Is there anything else I can help with? Yes."]),
    ("startend:quotation", {}, ['"Wrapped in quotes."', "Not wrapped.", '"Only opening.', "'Single quotes.'"]),
]
THINKING = "<think>Let me think, carefully, about THE INSTRUCTIONS: bad words, cat cat.</think>\n"


def punkt_installed() -> bool:
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab")
        return True
    except LookupError:
        return False


def supported() -> list[tuple[str, dict, str]]:
    """Each (id, kwargs, response) this machine can check: the punkt_tab types only where its data is."""
    return [(iid, kwargs, response) for iid, kwargs, responses in CASES for response in responses
            if iid not in NEEDS_PUNKT or punkt_installed()]


def reference_verdict(iid: str, kwargs: dict, response: str, prompt: str = "") -> bool:
    _, utils = reference()
    example = utils.InputExample(key=0, instruction_id_list=[iid], prompt=prompt, kwargs=[kwargs])
    return utils.test_instruction_following_strict(example, response).follow_instruction_list[0]


def open_instruct_row(ids: list[str], kwargs: list) -> str:
    """A ground truth as open-instruct's RLVR-IF datasets store it: the string of a one-element list."""
    return str([{"instruction_id": ids, "kwargs": kwargs}])


def test_the_verdicts_are_the_references_on_every_instruction_type():
    cases = supported()
    types = {iid for iid, *_ in cases}
    assert types == set(reference()[0].INSTRUCTION_DICT) - (set() if punkt_installed() else set(NEEDS_PUNKT))
    verdicts = defaultdict(set)
    checked = 0
    for iid, kwargs, response in cases:
        expected = reference_verdict(iid, kwargs, response)
        verdicts[iid].add(expected)
        for shown in (response, THINKING + response, f"<answer>{response}</answer>"):
            score = ifeval("ifeval", shown, open_instruct_row([iid], [kwargs or None]), None,
                           prompt=[{"role": "user", "content": "Write a haiku about rain."}])
            assert score["score"] == float(expected), (iid, kwargs, shown)
            checked += 1
    assert len(cases) >= 100 and checked == 3 * len(cases)
    assert all(seen == {True, False} for seen in verdicts.values()), {k: v for k, v in verdicts.items() if len(v) < 2}


def test_several_instructions_score_the_fraction_followed():
    ids = ["punctuation:no_comma", "keywords:existence", "length_constraints:number_words"]
    kwargs = [None, {"keywords": ["apple"]}, {"num_words": 3, "relation": "less than", "unused": None}]
    row = open_instruct_row(ids, kwargs)
    assert ifeval("ifeval", "Apple, yes", row) == {"score": 2 / 3, "acc": 0.0, "instructions": 3.0}
    assert ifeval("ifeval", "An apple", row)["acc"] == 1.0
    assert ifeval("ifeval", "<think>long thoughts</think>", row)["score"] == 0.0  # no answer after thinking
    # the same constraints as JSON, as a dict, and in IFEval's own column names
    as_dict = {"instruction_id_list": ids, "kwargs": kwargs}
    for form in (json.dumps({"instruction_id": ids, "kwargs": kwargs}), as_dict, json.dumps([json.dumps(as_dict)])):
        assert constraints(form) == (ids, [{}, {"keywords": ["apple"]}, {"num_words": 3, "relation": "less than"}])


@pytest.mark.parametrize("ground_truth, message", [
    ("{'instruction_id': ['keywords:nonsense'], 'kwargs': [None]}", "unknown instruction id 'keywords:nonsense'"),
    ("{'instruction_id': ['punctuation:no_comma'], 'kwargs': [None, None]}", "one 'kwargs' entry per id"),
    ("{\"func_name\": \"validate_lowercase\"}", "needs a non-empty 'instruction_id' list"),
    ("not a constraint (", "neither JSON nor a Python literal"),
])
def test_a_bad_ground_truth_is_one_line(ground_truth, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        constraints(ground_truth)


def test_auto_and_the_reward_manager_score_rlvr_if_rows():
    assert scorer_for("ifeval") is ifeval and REWARD_FUNCTIONS.get("ifeval") is ifeval
    manager = RewardManager([(REWARD_FUNCTIONS.get("auto"), 1.0)], isolation="inprocess")
    row = open_instruct_row(["startend:quotation"], [None])
    report = manager.score(['"quoted"', "bare"], ["ifeval", "ifeval"], [row, row], [None, None], [3, 1],
                           prompts=[[{"role": "user", "content": "Wrap it in quotes."}]] * 2)
    assert report.scores == [1.0, 0.0] and report.acc == [1.0, 0.0] and report.num_errors == 0


def test_the_thinking_and_answer_tags_are_removed():
    assert answer_of("<think>a</think> <think>b</think>\n<answer>final</answer>") == "final"
    lowercase = open_instruct_row(["change_case:english_lowercase"], [None])
    assert followed(lowercase, "<think>THINK</think> the answer is quiet and calm today") == [True]
