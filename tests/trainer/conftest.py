"""Fixtures of the end-to-end trainer tests: the embedded model (built once) and a small validation set."""

import os

import pytest

from rlplat.data import TASKS, write_parquet


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory):
    """Build the embedded (warm-started) model once per session in a private cache."""
    from rlplat.models.embedded import ensure_embedded_model

    cache = os.environ.get("RLPLAT_CACHE") or str(tmp_path_factory.mktemp("rlplat-cache"))
    os.environ["RLPLAT_CACHE"] = cache
    ensure_embedded_model()
    return cache


@pytest.fixture(scope="session")
def small_val(tmp_path_factory):
    return str(write_parquet(TASKS.get("arithmetic")(32, seed=1, split="test"),
                             tmp_path_factory.mktemp("val") / "val.parquet"))
