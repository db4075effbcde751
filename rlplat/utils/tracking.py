"""Metrics sinks (``trainer.logger``): console, tensorboard, wandb, mlflow; and ``metrics.jsonl`` in the output
dir, which every run writes whatever the loggers (it is the run's own record: the report is made from it).
``jsonl`` stays an accepted logger name, with nothing more to switch on.

Every sink takes the step's metrics (:meth:`Tracker.log`) and each validation's samples
(:meth:`Tracker.log_samples`: prompt, response, score, ...), which the trackers that have tables show as
one (tensorboard as a markdown text table, wandb as a ``wandb.Table``, mlflow as a logged table).
tensorboard, wandb and mlflow are optional packages (extras of the same name); a missing one is one line
naming the extra. wandb follows ``WANDB_MODE`` (``offline`` writes the run under the output dir without
network); mlflow follows ``MLFLOW_TRACKING_URI`` and otherwise keeps a local store (sqlite + artifacts)
in ``<output_dir>/mlflow``.

A resumed run continues from its checkpoint's step, but a run killed after that checkpoint had logged
later steps already. :meth:`Tracker.rewind` cuts those rows from ``metrics.jsonl`` (into
``metrics.cut.jsonl`` beside it, nothing is lost) and makes tensorboard discard its events from the
step after the checkpoint's on (``purge_step``), so each step appears once. wandb and mlflow cannot un-log: a
resumed run continues their run (its id is kept in ``trackers.json`` in the output dir, with the last step
each of them holds) and sends them only the steps after that one.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rlplat.utils.errors import RunError

LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")  # the names trainer.logger accepts
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}  # logger -> module (= extra)
CONSOLE_KEYS = (
    "score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
    "val/accuracy", "off_policy/staleness_max", "timing/step_s",  # staleness: asynchronous runs only
)
SAMPLE_COLUMNS = ("prompt", "response", "score", "correct", "ground_truth", "data_source")  # validation's
#: the columns of training samples (trainer.log_completions)
TRAINING_SAMPLE_COLUMNS = ("prompt", "response", "score", "advantage", "reward_terms", "truncated", "ground_truth",
                           "data_source")


def _plain(value: Any) -> Any:
    """A table cell: numbers and text as they are, anything else (a dict of reward terms) as JSON text."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else json.dumps(value)


def missing_logger_package(name: str) -> str | None:
    """One line saying how to install ``name``'s package, or None when it is importable (or built in)."""
    package = PACKAGES.get(name)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return (f"trainer.logger includes {name!r}, but the {package} package is not installed: "
            f"pip install -e '.[{name}]' (or pip install {package}), or remove it from trainer.logger")


def _short(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def rewind_jsonl(path: Path, keep_through: int | None) -> int:
    """Cut the rows of ``path`` (a JSON object with a ``step`` per line) after step ``keep_through`` (every row
    when None; a line that does not parse, as a killed run can leave, too) and append them to
    ``<name>.cut.jsonl`` beside it. Returns how many rows were cut."""
    if not path.is_file():
        return 0
    keep, cut = [], []
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            step = None
        (keep if keep_through is not None and step is not None and step <= keep_through else cut).append(line)
    if cut:
        with path.with_name(f"{path.stem}.cut.jsonl").open("a") as f:
            f.write("".join(line + "\n" for line in cut))
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, path)
    return len(cut)


class _TensorBoard:
    def __init__(self, output_dir: Path, **_):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = str(output_dir / "tensorboard")
        self.writer = SummaryWriter(self.dir)

    def rewind(self, keep_through: int | None) -> None:
        """Readers discard this directory's events from step ``keep_through + 1`` on (all when None)."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer.close()
        self.writer = SummaryWriter(self.dir, purge_step=0 if keep_through is None else keep_through + 1)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_samples(self, samples: list[dict], step: int, key: str, columns: tuple[str, ...]) -> None:
        def cell(value: Any) -> str:
            return str(value).replace("|", "\\|").replace("\n", " ")

        rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        rows += ["| " + " | ".join(cell(s.get(c, "")) for c in columns) + " |" for s in samples]
        self.writer.add_text(key, "\n".join(rows), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, output_dir: Path, config: dict | None, project: str, run_name: str | None,
                 resume_id: str | None = None):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=project, name=run_name, config=config, dir=str(output_dir), id=resume_id,
                              resume="allow" if resume_id else None)
        self.run_id = self.run.id

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, samples: list[dict], step: int, key: str, columns: tuple[str, ...]) -> None:
        table = self.wandb.Table(columns=list(columns), data=[[_plain(s.get(c)) for c in columns] for s in samples])
        self.run.log({key: table}, step=step)

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    def __init__(self, output_dir: Path, config: dict | None, project: str, run_name: str | None,
                 resume_id: str | None = None):
        import os

        import mlflow

        self.mlflow = mlflow
        local = output_dir.resolve() / "mlflow"
        external = os.environ.get("MLFLOW_TRACKING_URI")  # read first: set_tracking_uri sets it
        if not external:  # a local store (sqlite; mlflow's plain-file store is deprecated), artifacts beside it
            local.mkdir(parents=True, exist_ok=True)
        mlflow.set_tracking_uri(external or f"sqlite:///{local / 'mlflow.db'}")
        if not external:
            os.environ.pop("MLFLOW_TRACKING_URI", None)  # so the next run in this process is not "external"
        if mlflow.get_experiment_by_name(project) is None:
            mlflow.create_experiment(project, artifact_location=None if external else (local / "artifacts").as_uri())
        mlflow.set_experiment(project)
        self.run = None
        if resume_id:
            try:
                self.run = mlflow.start_run(run_id=resume_id)
            except Exception as err:  # noqa: BLE001 - e.g. another store or experiment than the earlier command's
                reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
                print(f"[tracking] warning: cannot continue mlflow run {resume_id} ({reason}); starting a new one",
                      flush=True)
        if self.run is not None:  # the run has its params (mlflow refuses to change one)
            self.run_id = self.run.info.run_id
            return
        self.run = mlflow.start_run(run_name=run_name)
        self.run_id = self.run.info.run_id
        params = {key: str(value)[:500] for key, value in flatten(config or {}).items()}
        for start in range(0, len(params), 100):  # mlflow takes at most 100 params per call
            mlflow.log_params(dict(list(params.items())[start : start + 100]))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(metrics, step=step)

    def log_samples(self, samples: list[dict], step: int, key: str, columns: tuple[str, ...]) -> None:
        table = {c: [_plain(s.get(c)) for s in samples] for c in columns}
        self.mlflow.log_table(data=table, artifact_file=f"{key.replace('/', '_')}/step_{step:06d}.json")

    def close(self) -> None:
        self.mlflow.end_run()


SINKS = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _MLflow}  # the optional trackers
RESUMABLE = ("wandb", "mlflow")  # trackers that cannot un-log: a resumed run continues their run


class Tracker:
    """``resume``: the run continues from a checkpoint in ``output_dir``, so wandb and mlflow continue the
    runs ``trackers.json`` names there (module docstring)."""

    def __init__(self, loggers: list[str], output_dir: str | Path, config: dict[str, Any] | None = None,
                 project: str = "rlplat", run_name: str | None = None, resume: bool = False):
        self.loggers = list(loggers)
        unknown = [name for name in self.loggers if name not in LOGGERS]
        if unknown:
            raise RunError(f"trainer.logger: unknown logger(s) {', '.join(unknown)}; known: {', '.join(LOGGERS)}")
        for name in self.loggers:
            if problem := missing_logger_package(name):
                raise RunError(problem)
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = (self.output_dir / "metrics.jsonl").open("a")  # always: the report reads it
        self._state_path = self.output_dir / "trackers.json"
        held = json.loads(self._state_path.read_text()) if resume and self._state_path.is_file() else {}
        self._state: dict[str, dict] = {}  # resumable tracker -> {"id": its run, "last_step": the last it holds}
        self._held: dict[str, int] = {}  # resumable tracker -> the last step it held when this command started
        self._sinks = []
        for name in (name for name in self.loggers if name in SINKS):
            try:
                extra = {"resume_id": held.get(name, {}).get("id")} if name in RESUMABLE else {}
                sink = SINKS[name](output_dir=self.output_dir, config=config, project=project, run_name=run_name,
                                   **extra)
                self._sinks.append((name, sink))
                if name in RESUMABLE:
                    self._held[name] = held.get(name, {}).get("last_step", -1)
                    self._state[name] = {"id": sink.run_id, "last_step": self._held[name]}
            except Exception as err:  # no credentials, an unreachable server, a store it cannot write, ...
                reason = (str(err).strip().splitlines() or [""])[0]
                raise RunError(f"trainer.logger: {name} failed to start ({type(err).__name__}: {reason}); fix its "
                               f"setup (e.g. WANDB_MODE=offline, MLFLOW_TRACKING_URI) or remove it from "
                               f"trainer.logger") from None

    def rewind(self, keep_through: int | None) -> None:
        """Forget what was logged after step ``keep_through`` (everything when None: a run starting afresh in
        an output dir that holds an earlier run's metrics), where the sink can: see the module docstring."""
        self._jsonl.close()
        path = self.output_dir / "metrics.jsonl"
        cut = rewind_jsonl(path, keep_through)
        self._jsonl = path.open("a")
        if cut:
            after = "an earlier run" if keep_through is None else f"the steps after {keep_through}"
            print(f"[tracking] moved {cut} rows of {after} from metrics.jsonl to metrics.cut.jsonl", flush=True)
        if cut or keep_through is not None:
            for _, sink in self._sinks:
                if hasattr(sink, "rewind"):
                    sink.rewind(keep_through)

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        if "console" in self.loggers:
            shown = [f"{k}={_short(clean[k])}" for k in CONSOLE_KEYS if k in clean]
            print(f"[step {step}] " + " ".join(shown), flush=True)
        self._jsonl.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        self._jsonl.flush()
        for name, sink in self._sinks:
            if step > self._held.get(name, -1):  # a resumed run's redone steps: the tracker holds them already
                sink.log(clean, step)
                if name in self._state:
                    self._state[name]["last_step"] = max(step, self._state[name]["last_step"])
        if self._state:
            tmp = self._state_path.with_name(f".{self._state_path.name}.tmp")
            tmp.write_text(json.dumps(self._state))
            os.replace(tmp, self._state_path)

    def log_samples(self, samples: list[dict], step: int, key: str = "val/samples",
                    columns: tuple[str, ...] = SAMPLE_COLUMNS) -> None:
        """Samples (dicts with ``columns``: validation's :data:`SAMPLE_COLUMNS`, training's
        :data:`TRAINING_SAMPLE_COLUMNS`) as a table named ``key``, where a tracker has tables."""
        if samples:
            for name, sink in self._sinks:
                if step > self._held.get(name, -1):
                    sink.log_samples(samples, step, key, columns)

    def close(self) -> None:
        self._jsonl.close()
        for _, sink in self._sinks:
            sink.close()
