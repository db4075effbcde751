"""``--help`` and the README list every registered algorithm and reward function name, and only those."""

import re
from pathlib import Path

from rlplat.algorithms import ADVANTAGE_ESTIMATORS, AGGREGATION_MODES, KL_ESTIMATORS, OFF_POLICY_CORRECTIONS, POLICY_LOSSES
from rlplat.reward import REWARD_FUNCTIONS
from rlplat.trainer.main import main

README = Path(__file__).resolve().parents[2] / "README.md"
KINDS = {
    "advantage estimators": ADVANTAGE_ESTIMATORS,
    "policy losses": POLICY_LOSSES,
    "loss aggregation modes": AGGREGATION_MODES,
    "KL estimators": KL_ESTIMATORS,
    "off-policy corrections": OFF_POLICY_CORRECTIONS,
    "reward functions": REWARD_FUNCTIONS,
}


def readme_names(kind: str) -> set[str]:
    """The names in the first backtick span of the README's "- <kind>:" bullet (which may wrap)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^  - {kind}(?: \([^)]*\))?: `([^`]*)`", text, flags=re.MULTILINE)
    assert match, f"README has no '  - {kind}: `...`' line"
    return set(match.group(1).split())


def test_help_lists_every_registered_name(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for kind, registry in KINDS.items():
        line = next(line for line in out.splitlines() if line.strip().startswith(kind))
        assert set(line.split(":", 1)[1].split()) == set(registry.names()), kind


def test_readme_lists_every_registered_name():
    for kind, registry in KINDS.items():
        assert readme_names(kind) == set(registry.names()), kind


def test_every_override_in_the_algorithms_doc_validates():
    from rlplat.trainer.run import load_run_config

    text = (README.parent / "docs" / "algorithms.md").read_text(encoding="utf-8")
    spans = re.findall(r"`((?:algorithm|reward|rollout|actor|critic|data)[\w.]*=[^`]*)`", text)
    assert len(spans) >= 5, spans
    for span in spans:
        load_run_config(span.split())  # raises ConfigError on a key or value that does not exist
