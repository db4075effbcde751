"""Fixtures of the end-to-end trainer tests: a small validation set (the embedded model is in tests/conftest.py)."""

import pytest

from rlplat.data import TASKS, write_parquet


@pytest.fixture(scope="session")
def small_val(tmp_path_factory):
    return str(write_parquet(TASKS.get("arithmetic")(32, seed=1, split="test"),
                             tmp_path_factory.mktemp("val") / "val.parquet"))
