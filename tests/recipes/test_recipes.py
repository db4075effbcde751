import ast
from pathlib import Path

import torch

from recipes.template.trainer import LengthPenaltyTrainer, length_penalty
from rlplat.trainer.ppo import PPOTrainer

ROOT = Path(__file__).resolve().parents[2]


def test_rlplat_never_imports_recipes():
    offenders = []
    for path in (ROOT / "rlplat").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "recipes"]
    assert offenders == []


def test_template_recipe_overrides_one_stage():
    overridden = [n for n in PPOTrainer.__dict__ if n in LengthPenaltyTrainer.__dict__ and not n.startswith("__")]
    assert overridden == ["reward"]


def test_length_penalty_on_last_token():
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.5], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    out = length_penalty(scores, mask, 0.1)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.8, 0.0], [0.0, 0.0, 0.2], [0.0, 0.0, 0.0]]))
