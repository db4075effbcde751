"""``python -m recipes.template.main algorithm=grpo ...``: the main entry with this recipe's trainer."""

import sys

from recipes.template.trainer import LengthPenaltyTrainer
from rlplat.trainer.main import main

if __name__ == "__main__":
    sys.exit(main(trainer_cls=LengthPenaltyTrainer))
