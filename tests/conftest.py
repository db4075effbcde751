import os
import re
import signal
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


def _sigterm_stops_the_session(signum, frame):
    pytest.exit(f"the test process (pid {os.getpid()}) received SIGTERM: stopping. If nobody meant to stop the "
                f"suite, a kill in a test or in rlplat reached beyond the processes it started", returncode=128 + signum)


def pytest_configure(config):
    # Each pytest-xdist worker (scripts/test.sh runs two) gets a Ray temp directory of its own: a cluster that a
    # test starts there (ray.cluster_utils, `ray start`) writes its address where Ray looks for one to join, so
    # with a shared directory the other worker's `ray.init()` would join that cluster instead of starting its own.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # each worker (and what it starts) computes with its share of the cores: two workers' threads
        # would otherwise oversubscribe them (one training at 2 threads beside the other worker's took 1.7x as long
        # as at 1 thread, and slowed that worker by a third: docs/testing.md)
        threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    if worker and "RAY_TMPDIR" not in os.environ:
        os.environ["RAY_TMPDIR"] = os.path.join("/tmp", f"rlplat-ray-{os.getppid()}-{worker}")
        os.makedirs(os.environ["RAY_TMPDIR"], exist_ok=True)


def pytest_sessionstart(session):
    # SIGTERM stops the session with a line saying so; without this, the first in-process ray.init would leave
    # Ray's own handler here (SystemExit inside whichever test runs), and without Ray the process would just die
    signal.signal(signal.SIGTERM, _sigterm_stops_the_session)
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


#: The float32 matmul rate (GFLOP/s, 2 threads) of the machines the budgets were measured on (AVX-512 EPYCs:
#: 185-230, ENVIRONMENT.md). On a slower CPU of our kind (AVX2 only: ~64) each budget is scaled by the ratio.
BUDGET_MACHINE_GFLOPS = 200.0


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    """This machine's float32 matmul rate with torch's threads (best of ``repeats`` n x n products, ~0.2 s)."""
    import time

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def budget_scale(gflops: float) -> float:
    """How much longer than the budgets' machine the areas may take here: never below 1 (a faster machine
    keeps the budgets as they are)."""
    return max(1.0, BUDGET_MACHINE_GFLOPS / gflops)


def pytest_runtest_logreport(report):
    _SECONDS[area_of(report.nodeid)] += report.duration  # setup, call and teardown


def pytest_terminal_summary(terminalreporter):
    """Seconds spent per area against its budget: a report, never a failure (timings drift by the hour).
    The budgets are scaled to this machine's measured speed (:func:`budget_scale`), and the section says so."""
    if not _SECONDS:
        return
    gflops = matmul_gflops()
    scale = budget_scale(gflops)
    limits = budgets()
    workers = terminalreporter.config.getoption("numprocesses", None) or 1  # pytest-xdist's -n
    terminalreporter.section("CI seconds by area (budgets: docs/testing.md)")
    terminalreporter.write_line(
        f"this machine: {gflops:.0f} GFLOP/s float32 matmul ({torch.get_num_threads()} threads, ATen "
        f"{torch.backends.cpu.get_cpu_capability()}); the budgets' machine: {BUDGET_MACHINE_GFLOPS:.0f}; "
        f"budgets x{scale:.2f}; " + (f"{workers} pytest workers side by side" if workers > 1 else "one pytest process"))
    for area, seconds in sorted(_SECONDS.items(), key=lambda kv: -kv[1]):
        limit = limits.get(area)
        note = "" if limit is None else f" / {limit * scale:.0f}" + ("  OVER BUDGET" if seconds > limit * scale else "")
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
        previous = signal.getsignal(signal.SIGTERM)
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
        signal.signal(signal.SIGTERM, previous)  # ray.init installs its own handler; the session's stays
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
