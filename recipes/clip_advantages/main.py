"""``python -m recipes.clip_advantages.main algorithm=grpo ...``: rlplat's CLI with this recipe's trainer."""

import sys

from recipes.clip_advantages.trainer import ClipAdvantagesTrainer
from rlplat.trainer.main import main

if __name__ == "__main__":
    sys.exit(main(trainer_cls=ClipAdvantagesTrainer))
