"""The verl and TRL tables of docs/migrating.md name only rlplat keys that exist.

Each backticked entry of a table's rlplat column is a config key (``key`` or ``key=value``) or a preset
choice (``algorithm=dapo``). A renamed or removed key, a preset that no longer exists, or a value the
schema, the enumerations or the registries refuse fails here; a row that names no rlplat key must say
"no equivalent".
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlplat.config import RLPlatConfig, group_options
from rlplat.config.loader import GROUPS
from rlplat.config.reference import rows
from rlplat.config.validate import ENUMS, _registries

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"
SECTIONS = ("From verl", "From TRL")
MIN_ROWS = 20  # the settings users port most; both tables are well above this
KEYS = frozenset(key for key, *_ in rows())
NO_EQUIVALENT = "no equivalent"
# The settings users ask about first: each must keep a row (matched in the source column).
MUST_MAP = {
    "From verl": ("data.train_batch_size", "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu",
                  "rollout.n", "algorithm.adv_estimator", "use_kl_loss", "kl_loss_coef", "kl_loss_type",
                  "clip_ratio_c", "loss_agg_mode", "norm_adv_by_std_in_grpo", "use_kl_in_reward",
                  "kl_ctrl.kl_coef", "data.max_prompt_length", "data.max_response_length", "optim.lr",
                  "lr_warmup_steps", "total_training_steps", "test_freq", "save_freq", "n_gpus_per_node",
                  "trainer.nnodes", "rollout.name", "tensor_model_parallel_size", "gpu_memory_utilization",
                  "custom_reward_function.path", "overlong_buffer.len", "filter_groups.enable"),
    "From TRL": ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "num_generations", "max_prompt_length", "max_completion_length", "temperature", "top_p",
                 "top_k", "beta", "epsilon", "epsilon_high", '"grpo"', '"dr_grpo"', '"dapo"', '"bnpo"',
                 "scale_rewards", "mask_truncated_completions", "sync_ref_model", "ref_model_mixup_alpha",
                 "ref_model_sync_steps", "num_iterations", "use_vllm", "vllm_mode", "reward_funcs",
                 "reward_weights", "max_steps", "logging_steps", "save_steps", "seed"),
}


def table(section: str) -> list[list[str]]:
    """The cells of each body row of the first table under ``## {section}``."""
    text = DOC.read_text(encoding="utf-8")
    assert f"\n## {section}\n" in text, f"docs/migrating.md has no '## {section}' section"
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    lines: list[str] = []
    for line in body.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[2:]]


def backticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _allowed_names() -> dict[str, tuple[str, ...]]:
    names = {key: tuple(allowed) for key, allowed in ENUMS.items()}
    names.update({key: tuple(listed() if listed else registry.names()) for key, registry, listed in _registries()})
    return names


def problem(entry: str) -> str | None:
    """Why ``entry`` (``key``, ``key=value`` or ``group=preset``) is not an rlplat setting; None if it is."""
    key, has_value, value = entry.partition("=")
    if key in GROUPS:
        options = group_options(key)
        return None if has_value and value in options else f"{entry!r}: presets of {key!r} are {options}"
    if key not in KEYS:
        close = difflib.get_close_matches(key, KEYS, n=1)
        return f"{key!r} is not a config key" + (f"; did you mean {close[0]!r}?" if close else "")
    if not has_value:
        return None
    parsed = OverridesParser.create().parse_override(entry).value()
    try:
        OmegaConf.update(OmegaConf.structured(RLPlatConfig), key, parsed, merge=True)
    except OmegaConfBaseException as err:
        return f"{entry!r}: {str(err).splitlines()[0]}"
    allowed = _allowed_names().get(key)
    if allowed is not None and parsed not in allowed:
        return f"{entry!r}: {key} takes one of {allowed}"
    return None


@pytest.mark.parametrize("section", SECTIONS)
def test_the_table_is_well_formed(section):
    body = table(section)
    assert len(body) >= MIN_ROWS, f"{section}: {len(body)} rows"
    assert all(len(cells) == 3 for cells in body), [cells for cells in body if len(cells) != 3]
    sources = [cells[0] for cells in body]
    assert all(sources), "a row without a source setting"
    assert len(set(sources)) == len(sources), f"repeated rows: {sorted({s for s in sources if sources.count(s) > 1})}"


@pytest.mark.parametrize("section", SECTIONS)
def test_every_rlplat_key_in_the_table_exists(section):
    problems = [f"{cells[0]}: {why}" for cells in table(section) for entry in backticked(cells[1])
                if (why := problem(entry))]
    assert problems == []


@pytest.mark.parametrize("section", SECTIONS)
def test_a_row_names_a_key_or_says_there_is_none(section):
    silent = [cells[0] for cells in table(section)
              if not backticked(cells[1]) and NO_EQUIVALENT not in cells[1].lower()]
    assert silent == []


@pytest.mark.parametrize("section", SECTIONS)
def test_the_most_asked_settings_keep_their_rows(section):
    sources = " ".join(cells[0] for cells in table(section))
    assert [name for name in MUST_MAP[section] if name not in sources] == []


def test_the_check_refuses_what_is_not_a_setting():
    assert problem("trainer.total_steps") is None and problem("algorithm=dapo") is None
    assert problem("algorithm.loss_agg_mode=seq-mean-token-sum-norm") is None
    assert problem("algorithm.clip_ratio_c=1e9") is None and problem("data.truncation=filter") is None
    assert "did you mean 'trainer.total_steps'" in problem("trainer.total_step")
    # each refusal says what is wrong and lists what would be accepted
    assert re.fullmatch(r"'algorithm=grpoo': presets of 'algorithm' are \(.*'grpo'.*\)", problem("algorithm=grpoo"))
    assert problem("rollout.n=many") == "'rollout.n=many': Value 'many' of type 'str' could not be converted to Integer"
    assert re.fullmatch(r"'algorithm.loss_agg_mode=token_mean': algorithm.loss_agg_mode takes one of \(.*'token-mean'.*\)",
                        problem("algorithm.loss_agg_mode=token_mean"))
    assert re.fullmatch(r"'data.truncation=middle': data.truncation takes one of \(.*'left'.*\)",
                        problem("data.truncation=middle"))


SECTIONS_OF_RLPLAT = {f.name for f in dataclasses.fields(RLPlatConfig)}  # never an unknown key


def rows_naming_rlplat_keys(section: str, framework: str) -> dict[str, str]:
    """``{their key: rlplat's setting}`` from a table's rows that name one (see rlplat.config.migration):
    the full keys of the first column (verl's dotted, TRL's plain), paired one to one with the rlplat
    column's entries when the counts match, else each with all of them; rows whose key is rlplat's too
    and keys that are rlplat's own (a section like TRL's ``model``, or the same key) are left out: such a
    key is never unknown."""
    found: dict[str, str] = {}
    for cells in table(section):
        if NO_EQUIVALENT in cells[1] or not (targets := backticked(cells[1])):
            continue
        keys = [entry.split("=")[0].lstrip("+").strip() for entry in backticked(cells[0])]
        keys = [key for key in keys if " " not in key and key not in SECTIONS_OF_RLPLAT
                and ("." in key if framework == "verl" else re.fullmatch(r"[a-z_0-9]+", key))]
        paired = len(keys) == len(targets) > 1
        for index, key in enumerate(keys):
            target = targets[index] if paired else ", ".join(targets)
            if key != target.split("=")[0]:
                found.setdefault(key, target)
    return found


def test_the_unknown_key_maps_are_the_tables():
    from rlplat.config import migration

    assert migration.VERL == rows_naming_rlplat_keys("From verl", "verl")
    assert migration.TRL == rows_naming_rlplat_keys("From TRL", "TRL")


@pytest.mark.parametrize("override, expected", [
    ("actor_rollout_ref.rollout.n=4", "that is verl's name; rlplat's is rollout.n"),
    ("+actor_rollout_ref.actor.kl_loss_coef=0.01", "that is verl's name; rlplat's is algorithm.kl_loss_coef"),
    ("num_generations=8", "that is TRL's name; rlplat's is rollout.n"),
])
def test_a_verl_or_trl_key_gets_rlplats_name(override, expected):
    from rlplat.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config([override])
    assert str(err.value) == (f"unknown config key {override.split('=')[0].lstrip('+')!r}: {expected} "
                              f"(docs/migrating.md maps the others)")
