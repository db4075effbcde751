"""Run a validated config: connect to Ray (or run in-process), build the components, train, summarise."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from omegaconf import DictConfig

from rlplat.config import load_config
from rlplat.config.plan import RunPlan
from rlplat.models.embedded import is_embedded
from rlplat.utils.quiet import quiet_third_party
from rlplat.workers.engine_setup import plan_run


def load_run_config(overrides: list[str] | None = None, device: str | None = None,
                    require_installed: bool = True) -> tuple[DictConfig, RunPlan]:
    """The whole start-up check of a run: :func:`rlplat.config.load_config` (schema, presets, cross-field
    rules), then the run's plan from the config and the chosen engines, which check their own sections
    (:func:`rlplat.workers.engine_setup.plan_run`, whose ``device`` and ``require_installed`` plan a run for
    another machine). Raises ConfigError."""
    cfg = load_config(overrides)
    return cfg, plan_run(cfg, device, require_installed)


# A Ray cluster that rlplat starts itself pre-starts no idle workers (the worker groups start their own,
# and each idle one would hold memory for the whole run), and passes call arguments and results up to
# 4 MiB inside the call message instead of through the shared-memory object store (Ray's default limit is
# 100 KiB; a step's batch is often larger), which makes each worker call faster (benchmarks/ray_calls.py;
# figures in docs/performance.md).
LOCAL_RAY_SYSTEM_CONFIG = {"prestart_worker_first_driver": False, "max_direct_call_object_size": 4 * 2**20}


def init_ray(cfg: DictConfig, quiet_env: dict[str, str]) -> bool:
    """Connect to ``trainer.ray_address`` / ``RAY_ADDRESS``, or start a local cluster. False = in-process.
    The workers get ``quiet_env`` (see :mod:`rlplat.utils.quiet`)."""
    if cfg.trainer.ray_address == "inprocess":
        return False
    try:
        import ray
    except ImportError:
        raise SystemExit("rlplat: Ray is not installed; install it or set trainer.ray_address=inprocess") from None
    if not ray.is_initialized():
        address = cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS")
        # Workers import rlplat from the same checkout as the controller.
        env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", **quiet_env}}
        local = {} if address else {"_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG)}  # ray.init adds to it
        ray.init(address=address, runtime_env=env, include_dashboard=False, log_to_driver=True,
                 logging_level=logging.INFO if cfg.trainer.verbose else logging.ERROR, **local)
    return True


@contextmanager
def ray_session(cfg: DictConfig, quiet_env: dict[str, str]) -> Iterator[bool]:
    """:func:`init_ray` for the block, then ``ray.shutdown`` if the block connected: a program that had
    connected to Ray itself keeps its session (and the cluster a local session started) after the run.
    ``ray.init`` installs a SIGTERM handler of its own in the calling process (it raises ``SystemExit``) and
    ``ray.shutdown`` leaves it there: the handler the process had before is put back, so a program (or a test
    session) that calls :func:`run` keeps its own answer to SIGTERM after the run."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    connected_before = cfg.trainer.ray_address != "inprocess" and _ray_connected()
    using_ray = init_ray(cfg, quiet_env)
    try:
        yield using_ray
    finally:
        if using_ray and not connected_before:
            import ray

            ray.shutdown()
            if previous is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(signal.SIGTERM, previous)


def _ray_connected() -> bool:
    try:
        import ray
    except ImportError:
        return False  # init_ray says so in one line
    return ray.is_initialized()


def resolve_model_path(cfg: DictConfig) -> str:
    if is_embedded(cfg.model.path):
        from rlplat.trainer.sft import ensure_embedded_model

        return str(ensure_embedded_model(cfg.model.path))
    return cfg.model.path


def run_plan(cfg: DictConfig, plan: RunPlan, device_memory: int | None = None) -> int:
    """``trainer.dry_run=true`` and ``python -m rlplat.tools.plan``: the plan printed
    (:func:`rlplat.planner.report`), with the run's one-line errors and exit statuses (0: every phase fits
    ``device_memory``, by default the device's; 1: a phase does not; 2: what would stop the run)."""
    from rlplat.planner import default_device_memory, report
    from rlplat.trainer.exit_status import exit_status
    from rlplat.trainer.preflight import check_model_path, check_other_model_paths

    def model_path() -> str:  # the config and tokenizer: an embedded model's without its warm start
        if not is_embedded(cfg.model.path):
            check_model_path(cfg.model.path)
        check_other_model_paths(cfg, plan)
        if not is_embedded(cfg.model.path):
            return cfg.model.path
        from rlplat.trainer.sft import embedded_model_files

        return str(embedded_model_files(cfg.model.path))

    def teacher_path() -> str:  # checked with the other model paths above
        from rlplat.trainer.sft import embedded_model_files

        path = cfg.teacher.model_path
        return str(embedded_model_files(path)) if is_embedded(path) else path

    quiet_third_party(cfg.trainer.verbose)
    memory = device_memory or default_device_memory(plan.device)
    return exit_status(lambda: 0 if report(cfg, plan, memory, model_path, teacher_path) else 1)


def record_run(cfg: DictConfig) -> None:
    """The output directory explains itself: the resolved config (``config.yaml``) and the command line
    (``command.txt``) of the latest start."""
    import shlex
    import sys
    from pathlib import Path

    from omegaconf import OmegaConf

    out = Path(cfg.trainer.output_dir)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (out / "command.txt").write_text(shlex.join(sys.orig_argv) + "\n")  # as typed: python -m rlplat.trainer.main ...


def run(cfg: DictConfig, plan: RunPlan, trainer_cls: type | None = None) -> dict:
    """Train and return the summary (also written to ``summary.json``); ``plan`` is
    :func:`load_run_config`'s (or :func:`~rlplat.workers.engine_setup.plan_run`'s) for ``cfg``."""
    from rlplat.trainer.components import build_components
    from rlplat.trainer.ppo import PPOTrainer

    from rlplat.trainer.checkpoint import remove_stale_exports
    from rlplat.trainer.preflight import preflight

    trainer_cls = trainer_cls or PPOTrainer
    preflight(cfg, plan)  # output dir, model path, logger packages: one line each, before anything starts
    for stale in remove_stale_exports(cfg.trainer.output_dir):
        print(f"[checkpoint] removed {stale}, the unfinished export of an earlier run", flush=True)
    record_run(cfg)
    quiet_env = quiet_third_party(cfg.trainer.verbose)
    model_path = resolve_model_path(cfg)
    with ray_session(cfg, quiet_env):
        components = build_components(cfg, plan, model_path)  # data and rewards are checked before the model loads
        try:
            summary = trainer_cls(cfg, plan, components).fit()
        finally:
            components.shutdown()
    shown = {k: summary[k] for k in ("initial_val_accuracy", "final_val_accuracy", "steps", "wall_time_s")}
    print(f"rlplat: done. {json.dumps(shown)}", flush=True)
    print(f"rlplat: summary {summary['output_dir']}/summary.json, model {summary['hf_export']}", flush=True)
    from rlplat.utils.report import write_report_after_run

    write_report_after_run(summary["output_dir"])  # plots, samples, index.html; a failure only warns
    return summary
