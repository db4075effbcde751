"""``python -m rlplat.tools.embedded``: the embedded models built ahead of a run, and the plan, which needs
an embedded model's config and tokenizer but not its warm start."""

import pytest

import rlplat.tools.embedded as embedded_tool
import rlplat.tools.plan as plan_tool
from rlplat.models.embedded import VARIANTS, embedded_model_dir


def test_list_says_which_are_built_and_a_built_one_is_not_built_again(embedded_cache, capsys):
    assert embedded_tool.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == list(VARIANTS)
    assert lines[0] == f"embedded: built: {embedded_model_dir('embedded')}"
    assert embedded_tool.main(["embedded"]) == 0
    assert capsys.readouterr().out == f"rlplat: embedded: already built: {embedded_model_dir('embedded')}\n"


def test_an_unknown_name_is_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        embedded_tool.main(["embeded"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "no embedded model 'embeded'; the embedded models are embedded, embedded-tools, embedded-moe, embedded-vl, "
        "embedded-teacher")


def test_the_plan_of_an_embedded_model_runs_no_warm_start(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLPLAT_CACHE", str(tmp_path))  # nothing built yet
    assert plan_tool.main(["algorithm=grpo"]) == 0
    assert "plan: every phase fits" in capsys.readouterr().out
    built = embedded_model_dir("embedded")
    assert not built.exists()  # no warm start: the untrained model's files beside it
    assert (built.parent / f"{built.name}-init" / "config.json").is_file()
