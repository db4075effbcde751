"""Recipes: leaf packages that change one stage of the trainer. rlplat never imports from here."""
