"""A worked recipe: a stage inserted after ``advantages`` that clips each advantage to [-c, c]."""
