"""Each tracker really writes: tensorboard events read back with tensorboard's reader, an mlflow run listed
by the mlflow client, a wandb offline run directory; a missing package is one line naming the extra."""

import json
import time

import pytest

from rlplat.trainer.preflight import check_loggers
from rlplat.utils.errors import RunError
from rlplat.utils.tracking import Tracker

SAMPLES = [{"prompt": "1+2=", "response": "3", "score": 1.0, "correct": 1.0, "ground_truth": "3",
            "data_source": "rlplat/arithmetic"},
           {"prompt": "<b>|x</b>", "response": "4", "score": 0.0, "correct": 0.0, "ground_truth": "5",
            "data_source": "rlplat/arithmetic"}]


def track(tmp_path, name, **kwargs):
    tracker = Tracker([name, "jsonl"], tmp_path, {"algorithm": {"adv_estimator": "grpo"}}, "rlplat-test", "run-1",
                      **kwargs)
    for step in (1, 2, 3):
        tracker.log({"score/mean": 0.1 * step, "val/accuracy": float("nan")}, step)  # NaN is dropped
    tracker.log_samples(SAMPLES, 3)
    tracker.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and "val/accuracy" not in rows[0]


def test_tensorboard_events_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    track(tmp_path, "tensorboard")
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    scalars = events.Scalars("score/mean")
    assert [e.step for e in scalars] == [1, 2, 3]
    assert [round(e.value, 6) for e in scalars] == [0.1, 0.2, 0.3]
    table = events.Tensors("val/samples/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| 1+2= | 3 | 1.0 |" in table and "\\|x" in table  # the samples table, its | escaped


def test_mlflow_run_is_listed_by_the_client(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    track(tmp_path / "other", "mlflow")  # a second run in the same process keeps its own store
    track(tmp_path, "mlflow")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("rlplat-test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run-1" and run.data.params["algorithm.adv_estimator"] == "grpo"
    history = client.get_metric_history(run.info.run_id, "score/mean")
    assert [(m.step, round(m.value, 6)) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    table = client.download_artifacts(run.info.run_id, "val_samples/step_000003.json", str(tmp_path / "dl"))
    assert "1+2=" in open(table).read()


def test_wandb_offline_writes_a_run_directory(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    track(tmp_path, "wandb")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    (data,) = runs[0].glob("*.wandb")
    deadline = time.monotonic() + 60  # wandb's own writer process may still be flushing after finish()
    while data.stat().st_size <= 1000 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert data.stat().st_size > 1000  # the metrics, config and the samples table


def test_a_missing_tracker_package_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(RunError, match=r"^trainer.logger includes 'mlflow', but the mlflow package is not installed: "
                                       r"pip install -e '.\[mlflow\]'"):
        check_loggers(["console", "mlflow"])


def test_a_tracker_that_fails_to_start_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/afile/mlflow.db")  # under a file
    (tmp_path / "afile").write_text("not a directory")
    with pytest.raises(RunError, match=r"^trainer.logger: mlflow failed to start \(\w+: .*\); fix its setup"):
        Tracker(["console", "mlflow"], tmp_path / "out")


def test_metrics_jsonl_is_written_whatever_the_loggers(tmp_path):
    """The report is made from metrics.jsonl: a run that lists only the console still writes it."""
    from rlplat.utils.report import write_report

    tracker = Tracker(["console"], tmp_path)
    for step in (1, 2):
        tracker.log({"score/mean": 0.5 * step, "val/accuracy": 0.25 * step}, step)
    tracker.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["score/mean"]) for r in rows] == [(1, 0.5), (2, 1.0)]
    assert (write_report(tmp_path) / "index.html").is_file()


def test_rewind_cuts_later_steps_into_a_side_file(tmp_path):
    tracker = Tracker(["jsonl"], tmp_path)
    for step in range(5):
        tracker.log({"x": float(step)}, step)
    tracker._jsonl.write('{"step": 5, "x"')  # a line a kill -9 cut short
    tracker._jsonl.flush()
    tracker.rewind(2)  # resumed from the checkpoint of step 2
    tracker.log({"x": 30.0}, 3)
    tracker.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    cut = (tmp_path / "metrics.cut.jsonl").read_text().splitlines()
    assert steps == [0, 1, 2, 3] and [json.loads(line)["step"] for line in cut[:2]] == [3, 4]
    assert cut[2] == '{"step": 5, "x"'

    fresh = Tracker(["jsonl"], tmp_path)
    fresh.rewind(None)  # a new run in the same output dir: the earlier run's rows move aside
    fresh.close()
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert len((tmp_path / "metrics.cut.jsonl").read_text().splitlines()) == 3 + 4


def test_a_resumed_run_continues_the_mlflow_run_with_only_the_steps_it_lacks(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    killed = Tracker(["mlflow"], tmp_path, {"a": 1}, "rlplat-resume", "run-1")
    for step in range(5):  # steps 0-4 logged; the checkpoint was at step 2
        killed.log({"score/mean": float(step)}, step)
    killed.close()
    resumed = Tracker(["mlflow"], tmp_path, {"a": 1}, "rlplat-resume", "run-1", resume=True)
    resumed.rewind(2)
    for step in range(3, 7):
        resumed.log({"score/mean": 10.0 + step}, step)
    resumed.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("rlplat-resume").experiment_id])
    history = client.get_metric_history(run.info.run_id, "score/mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 15.0),
                                                    (6, 16.0)]
    assert json.loads((tmp_path / "trackers.json").read_text()) == {"mlflow": {"id": run.info.run_id, "last_step": 6}}
    fresh = Tracker(["mlflow"], tmp_path, {"a": 1}, "rlplat-resume", "run-2")  # not resuming: a run of its own
    fresh.log({"score/mean": 0.5}, 0)
    fresh.close()
    assert len(client.search_runs([client.get_experiment_by_name("rlplat-resume").experiment_id])) == 2
    assert json.loads((tmp_path / "trackers.json").read_text())["mlflow"]["id"] != run.info.run_id


def test_a_resumed_run_continues_the_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    first = Tracker(["wandb"], tmp_path, {"a": 1}, "rlplat-resume", "run-1")
    first.log({"score/mean": 1.0}, 1)
    first.close()
    run_id = json.loads((tmp_path / "trackers.json").read_text())["wandb"]["id"]
    again = Tracker(["wandb"], tmp_path, {"a": 1}, "rlplat-resume", "run-1", resume=True)
    again.log({"score/mean": 1.0}, 1)  # held already: not sent again
    again.log({"score/mean": 2.0}, 2)
    again.close()
    assert json.loads((tmp_path / "trackers.json").read_text()) == {"wandb": {"id": run_id, "last_step": 2}}
    runs = [path.name for path in (tmp_path / "wandb").glob("offline-run-*")]
    assert len(runs) == 2 and all(f"-{run_id}" in name for name in runs), (runs, run_id)  # one run, two segments
