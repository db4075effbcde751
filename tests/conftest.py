import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

#: Optional packages these tests must find. scripts/test.sh sets RLPLAT_REQUIRE_VLLM=1 for the tests it runs
#: in the vLLM virtualenv: there a vllm that is missing or does not import fails the run instead of
#: skipping every vLLM test (a broken install would otherwise go green).
REQUIRED = ("vllm",) if os.environ.get("RLPLAT_REQUIRE_VLLM") else ()


def pytest_sessionstart(session):
    for package in REQUIRED:  # in a child process: importing vllm here would set its threads for every test
        done = subprocess.run([sys.executable, "-c", f"import {package}"], capture_output=True, text=True)
        if done.returncode:
            why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            pytest.exit(f"RLPLAT_REQUIRE_VLLM is set, but {package} does not import in {sys.executable}: {why}",
                        returncode=1)


# ---------------------------------------------------------------- CI seconds by area (docs/testing.md)
TESTING_DOC = Path(__file__).resolve().parents[1] / "docs" / "testing.md"
_SECONDS: dict[str, float] = defaultdict(float)


def area_of(nodeid: str) -> str:
    """The budget area of a test: ``vllm`` for the run in the vLLM virtualenv, else its folder under tests/
    (``top`` for the files directly in tests/)."""
    if REQUIRED:
        return "vllm"
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 else "top"


def budgets() -> dict[str, float]:
    """Seconds per area from the budget table of docs/testing.md (between its ci-budget markers)."""
    text = TESTING_DOC.read_text() if TESTING_DOC.is_file() else ""
    table = text.partition("<!-- ci-budget:start -->")[2].partition("<!-- ci-budget:end -->")[0]
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^\| `(\w+)` \|[^|\n]*\|[^|\n]*\| (\d+) \|", table, re.M)}


def pytest_runtest_logreport(report):
    _SECONDS[area_of(report.nodeid)] += report.duration  # setup, call and teardown


def pytest_terminal_summary(terminalreporter):
    """Seconds spent per area against its budget: a report, never a failure (timings drift by the hour)."""
    if not _SECONDS:
        return
    limits = budgets()
    terminalreporter.section("CI seconds by area (budgets: docs/testing.md)")
    for area, seconds in sorted(_SECONDS.items(), key=lambda kv: -kv[1]):
        limit = limits.get(area)
        note = "" if limit is None else f" / {limit:.0f}" + ("  OVER BUDGET" if seconds > limit else "")
        terminalreporter.write_line(f"{area:>12} {seconds:8.1f} s{note}")


@pytest.fixture
def skip_missing():
    """``skip_missing(package)`` skips the test because rlplat reports the optional ``package`` not
    installed, or fails it where the package is required (``REQUIRED``)."""

    def skip(package: str):
        if package in REQUIRED:
            pytest.fail(f"rlplat reports {package!r} not installed, but RLPLAT_REQUIRE_VLLM is set", pytrace=False)
        pytest.skip(f"needs the optional package {package!r}")

    return skip


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A randomly initialised tiny Qwen2 + character tokenizer, saved in Hugging Face format."""
    from rlplat.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


@pytest.fixture
def nan_model_path(tiny_model_path, tmp_path):
    """The tiny model with NaN final-norm weights, so every logit is NaN (saved in Hugging Face format)."""
    import shutil

    from transformers import AutoModelForCausalLM

    broken = tmp_path / "nan-model"
    shutil.copytree(tiny_model_path, broken)
    model = AutoModelForCausalLM.from_pretrained(broken)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    model.save_pretrained(broken)
    return broken


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory):
    """Build the embedded (warm-started) model once per session in a private cache."""
    from rlplat.trainer.sft import ensure_embedded_model

    cache = os.environ.get("RLPLAT_CACHE") or str(tmp_path_factory.mktemp("rlplat-cache"))
    os.environ["RLPLAT_CACHE"] = cache
    ensure_embedded_model()
    return cache


@pytest.fixture(scope="session")
def tiny_reward_model(tmp_path_factory):
    """A tiny sequence-classification reward model that scores arithmetic answers containing a 7 high
    (rlplat.models.tiny.build_tiny_reward_model, ~5 s), built once per session."""
    from rlplat.models.tiny import build_tiny_reward_model

    path = tmp_path_factory.mktemp("reward-model") / "prefers-7"
    assert build_tiny_reward_model(path, marker="7") >= 0.98
    return str(path)


@pytest.fixture(scope="session")
def small_val(tmp_path_factory):
    """32 held-out arithmetic problems: validation that costs little."""
    from rlplat.data import TASKS, write_parquet

    return str(write_parquet(TASKS.get("arithmetic")(32, seed=1, split="test"),
                             tmp_path_factory.mktemp("val") / "val.parquet"))


def start_local_ray():
    import ray

    if not ray.is_initialized():
        # Logical CPUs: several single-CPU workers (actor + critic groups) on a 2-core machine.
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray


@pytest.fixture
def ray_cluster():
    """A local Ray instance shared by the tests that need one (started lazily, restarted if a test
    shut it down, e.g. the multi-node tests that start their own cluster)."""
    pytest.importorskip("ray")
    return start_local_ray()


@pytest.fixture(scope="session", autouse=True)
def _shutdown_ray_at_exit():
    yield
    try:
        import ray

        ray.shutdown()
    except ImportError:
        pass
