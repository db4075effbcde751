"""recipes/README.md: its code runs as written (with test-only overrides appended for a tiny, fast run),
and an inserted stage lands where it was asked and does what it says."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipes.clip_advantages.trainer import ClipAdvantagesTrainer
from rlplat.protocol import Batch
from rlplat.trainer.ppo import PPOTrainer

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "recipes" / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", GUIDE, re.DOTALL)


def python_file(name: str) -> str:
    return next(b for b in blocks("python") if b.startswith(f"# {name}\n"))


def command(prefix: str) -> list[str]:
    line = next(line for b in blocks("bash") for line in b.splitlines() if line.startswith(prefix))
    return line.split()


def tiny(out: Path, small_val: str) -> list[str]:
    """Appended after the guide's own overrides (Hydra applies the last value of a key)."""
    return ["trainer.total_steps=2", "trainer.test_freq=0", f"data.val_files={small_val}",
            "data.train_batch_size_prompts=4", "actor.mini_batch_size_prompts=4", "rollout.n=4", "rollout.val_n=1",
            "actor.micro_batch_size_seqs_per_worker=16", "critic.micro_batch_size_seqs_per_worker=16",
            "trainer.ray_address=inprocess", f"trainer.output_dir={out}"]


def run(cmd: list[str], cwd: Path) -> list[dict]:
    cmd = [sys.executable if cmd[0] == "python" else cmd[0], *cmd[1:]]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = Path(next(a for a in cmd if a.startswith("trainer.output_dir=")).split("=", 1)[1])
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_insert_stage_places_the_stage_without_copying_the_order():
    order = ClipAdvantagesTrainer.stage_order
    assert order[order.index("advantages") + 1] == "clip_advantages"
    assert tuple(s for s in order if s != "clip_advantages") == PPOTrainer.stage_order
    with pytest.raises(ValueError, match="no stage 'advantage' .* stages: generate, reward"):
        PPOTrainer.insert_stage("x", after="advantage")


def test_clip_advantages_stage_clips_only_valid_tokens():
    class Stub:
        max_abs = 1.0

    batch = Batch.from_dict({"advantages": torch.tensor([[2.0, -3.0, 0.5], [0.2, 0.0, 9.0]]),
                             "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])})
    metrics = {}
    out = ClipAdvantagesTrainer.clip_advantages(Stub(), batch, metrics)
    torch.testing.assert_close(out.tensors["advantages"], torch.tensor([[1.0, -1.0, 0.5], [0.2, 0.0, 1.0]]))
    assert metrics["recipe/adv_clip_frac"] == pytest.approx(2 / 5)


@pytest.mark.slow
def test_worked_example_runs(embedded_cache, small_val, tmp_path):
    cmd = command("python -m recipes.clip_advantages.main") + tiny(tmp_path, small_val)
    steps = [m for m in run(cmd, ROOT) if "actor/pg_loss" in m]
    assert len(steps) == 2 and all(0.0 <= m["recipe/adv_clip_frac"] <= 1.0 for m in steps)
    assert all("timing/clip_advantages_s" in m for m in steps)  # the stage ran every step
    assert "max_abs: 2" in (tmp_path / "config.yaml").read_text().split("\nrecipe:\n", 1)[1]  # the guide's setting


def test_a_recipes_settings_are_free_form_and_kept():
    from rlplat.config import ConfigError, load_config

    cfg = load_config(["recipe.max_abs=2", "+recipe.name=clip", "recipe.nested.depth=3"])
    assert cfg.recipe == {"max_abs": 2, "name": "clip", "nested": {"depth": 3}}
    assert load_config([]).recipe == {}
    with pytest.raises(ConfigError, match="did you mean 'recipe'"):
        load_config(["recipes.max_abs=2"])


@pytest.mark.slow
def test_plugins_and_own_trainer_from_another_folder(embedded_cache, small_val, tmp_path):
    (tmp_path / "my_plugins.py").write_text(python_file("my_plugins.py"))
    (tmp_path / "my_recipe.py").write_text(python_file("my_recipe.py"))
    steps = [m for m in run(command("python -m rlplat.trainer.main trainer.imports=[my_plugins]")
                            + tiny(tmp_path / "a", small_val), tmp_path) if "actor/pg_loss" in m]
    assert len(steps) == 2
    assert "reward/short_answer_mean" in steps[-1] and steps[-1]["actor/pg_tokens"] > 0
    steps = [m for m in run(command("python my_recipe.py") + tiny(tmp_path / "b", small_val), tmp_path)
             if "actor/pg_loss" in m]
    assert len(steps) == 2 and 0.0 <= steps[-1]["recipe/long_fraction"] <= 1.0
