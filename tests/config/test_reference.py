from pathlib import Path

from rlplat.config.reference import rows, with_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_key_is_documented_in_the_schema():
    undocumented = [key for key, _, _, meaning in rows() if not meaning]
    assert undocumented == []


def test_readme_config_reference_is_current():
    text = README.read_text(encoding="utf-8")
    assert with_table(text) == text, "run: python -m rlplat.config.reference --write README.md"
    assert "| `algorithm.adv_estimator` | str | `'grpo'` |" in text
