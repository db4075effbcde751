"""The run report (``python -m rlplat.tools.report RUN_DIR``): real PNGs with one panel per metric,
escaped sample tables, runs still in progress, and the one-line errors."""

import html
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from rlplat.utils.report import (
    group_panels, main, metric_series, moving_average, read_jsonl, resume_steps, write_report, write_report_after_run,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def count_panels(png: Path) -> int:
    """Panels in a report figure, counted from its pixels: each panel's frame has a near-black top and
    bottom edge, a horizontal run longer than a tenth of the image; tick marks and text are shorter and the
    plotted lines are coloured."""
    dark = imread(png)[..., :3].max(axis=2) < 0.25
    edges_per_row = []
    for row in dark:
        padded = np.concatenate(([False], row, [False]))
        bounds = np.flatnonzero(padded[1:] != padded[:-1])
        edges_per_row.append(int(((bounds[1::2] - bounds[::2]) >= 0.1 * dark.shape[1]).sum()))
    edges, band = 0, 0  # adjacent rows with long runs are one (thick) edge
    for n in edges_per_row + [0]:
        if n:
            band = max(band, n)
        else:
            edges, band = edges + band, 0
    assert edges % 2 == 0, f"{png}: {edges} frame edges"
    return edges // 2


def assert_real_png(png: Path, panels: int) -> None:
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 5_000, f"{png} is only {len(data)} bytes"
    height, width, _ = imread(png).shape
    assert width >= 400 and height >= 300
    assert count_panels(png) == panels, png.name


def write_jsonl(path: Path, rows: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def metric_rows(steps: int) -> list[dict]:
    rows = [{"step": 0, "time": 0.0, "val/accuracy": 0.1}]  # validation before training: val/* only
    for s in range(1, steps + 1):
        row = {"step": s, "time": float(s), "score/mean": s / steps, "score/max": 1.0, "actor/entropy": 1 - s / 50,
               "critic/vf_loss": 1 / s, "critic/vf_explained_var": s / steps, "actor/pg_loss": 0.01}
        if s % 5 == 0:
            row["val/accuracy"] = 0.1 + s / 100
        rows.append(row)
    return rows


def make_run(tmp_path: Path, steps: int = 20, tail: str = "") -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_jsonl(run_dir / "metrics.jsonl", metric_rows(steps), tail)
    (run_dir / "command.txt").write_text("python -m rlplat.trainer.main algorithm=ppo\n")
    (run_dir / "config.yaml").write_text("trainer:\n  total_steps: 20\n")
    return run_dir


def test_plots_are_real_images_with_one_panel_per_metric(tmp_path):
    run_dir = make_run(tmp_path)
    (run_dir / "summary.json").write_text(json.dumps({"final_val_accuracy": 0.3, "steps": 20}))
    out = write_report(run_dir)
    # reward: score/mean + score/max; critic: both critic/*; actor: pg_loss (entropy has its own figure);
    # groups without data (KL, throughput, ...) are absent
    expected = {"reward.png": 2, "validation.png": 1, "entropy.png": 1, "critic.png": 2, "actor.png": 1}
    assert sorted(p.name for p in out.glob("*.png")) == sorted(expected)
    for name, panels in expected.items():
        assert_real_png(out / name, panels)
    index = (out / "index.html").read_text()
    for name in expected:
        assert f"<img src='{name}'" in index
    assert "algorithm=ppo" in index and "final_val_accuracy" in index and "<details>" in index


def test_every_metric_is_plotted_once_and_identical_curves_share_a_panel(tmp_path):
    rows = [{"step": s, "time": float(s), "score/mean": s / 4, "reward/mean": s / 4, "score/max": 1.0,
             "reward/accuracy": s / 8, "reward/f/format_mean": 0.5, "recipe/adv_clip_frac": 0.1 * s,
             "my/custom": float(s * s), "timing/step_s": 0.2, "actor/grad_norm": 2.0} for s in range(1, 5)]
    panels = {name: keys for name, _, keys in group_panels(metric_series(rows))}
    assert panels["reward"] == [["score/mean", "reward/mean"], ["reward/accuracy"], ["score/max"]]
    assert panels["reward_terms"] == [["reward/f/format_mean"]] and panels["recipe"] == [["recipe/adv_clip_frac"]]
    assert panels["other"] == [["my/custom"]]  # timing/* stays with throughput's named few
    assert "actor" not in panels  # grad_norm has its own figure
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_jsonl(run_dir / "metrics.jsonl", rows)
    out = write_report(run_dir)
    assert_real_png(out / "reward.png", 3)
    assert_real_png(out / "other.png", 1)


def test_a_resumed_run_is_marked_where_it_picked_up(tmp_path):
    rows = [{"step": s, "time": 100.0 + s} for s in range(0, 7)] + [{"step": s, "time": 500.0 + s} for s in (5, 6)]
    assert resume_steps(rows, [{"start": 90.0, "end": 107.0}, {"start": 499.0, "end": 507.0}]) == [5]
    assert resume_steps(rows, [{"start": 90.0, "end": 107.0}]) == []
    run_dir = make_run(tmp_path, steps=30)
    (run_dir / "segments.json").write_text(json.dumps([{"start": 0.0, "end": 12.5}, {"start": 12.5, "end": 30.0}]))
    write_report(run_dir)  # draws the marks at step 13 (and smooths the 30-point curves) without failing
    (run_dir / "segments.json").write_text("{not json")
    assert (write_report(run_dir) / "reward.png").is_file()


def test_the_moving_average_starts_at_the_first_value_and_follows():
    assert moving_average([3.0, 3.0, 3.0]) == pytest.approx([3.0, 3.0, 3.0])
    smoothed = moving_average([0.0] * 5 + [1.0] * 50, weight=0.9)
    assert smoothed[4] == 0.0 and smoothed[5] == pytest.approx(0.1 / (1 - 0.9**6)) and smoothed[-1] > 0.99


def test_validation_points_are_only_the_steps_that_validated(tmp_path):
    series = metric_series(metric_rows(20))
    assert series["val/accuracy"][0] == [0, 5, 10, 15, 20]
    assert series["score/mean"][0] == list(range(1, 21))
    # a resumed run logs a step again: the later row wins
    again = metric_series(metric_rows(3) + [{"step": 2, "score/mean": 9.0}])
    assert again["score/mean"] == ([1, 2, 3], [1 / 3, 9.0, 1.0])


def test_sample_tables_of_the_first_and_latest_validation_escape_html(tmp_path):
    run_dir = make_run(tmp_path)
    attack = "<script>alert('x')</script> & more"

    def sample(response):
        return {"prompt": "1+2=", "response": response, "score": 0.0, "correct": 0.0, "ground_truth": "3",
                "data_source": "rlplat/arithmetic"}

    write_jsonl(run_dir / "val_samples.jsonl", [{"step": 0, "samples": [sample(attack), sample("4")]},
                                                {"step": 10, "samples": [sample("5")]},
                                                {"step": 20, "samples": [sample("3")]}])
    out = write_report(run_dir)
    first, latest = (out / "samples_first.html").read_text(), (out / "samples_latest.html").read_text()
    assert "<script>" not in first and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in first
    assert "step 0" in first and first.count("<tr>") == 3  # header + 2 samples
    assert "step 20" in latest and "<td>3</td>" in latest
    assert [r["response"] for r in read_jsonl(out / "samples_first.jsonl")] == [attack, "4"]
    assert [r["step"] for r in read_jsonl(out / "samples_latest.jsonl")] == [20]
    index = (out / "index.html").read_text()
    assert "href='samples_first.html'" in index and "href='samples_latest.html'" in index


def test_a_run_in_progress_gets_a_report(tmp_path, capsys):
    # no summary.json yet, and the trainer is halfway through writing step 21's line
    run_dir = make_run(tmp_path, tail='{"step": 21, "time": 21.0, "score/mea')
    (run_dir / "val_samples.jsonl").write_text('{"step": 0, "samples": [{"prompt": "1+')
    assert main([str(run_dir)]) == 0
    assert f"{run_dir / 'report'}" in capsys.readouterr().out
    index = (run_dir / "report" / "index.html").read_text()
    assert "No summary.json yet" in index and "No val_samples.jsonl yet" in index
    assert "metrics.jsonl reaches step 20." in index  # the unfinished step 21 is left out
    assert_real_png(run_dir / "report" / "reward.png", 2)


def test_errors_are_one_line_with_exit_status_2(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "rlplat.tools.report", str(tmp_path / "nope")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr == f"rlplat: report: run directory {tmp_path / 'nope'} does not exist\n"

    empty = subprocess.run([sys.executable, "-m", "rlplat.tools.report", str(tmp_path)],
                           capture_output=True, text=True)
    assert empty.returncode == 2
    assert empty.stderr.startswith(f"rlplat: report: {tmp_path} has no metrics.jsonl") and empty.stderr.count("\n") == 1


def test_a_failed_report_at_the_end_of_a_run_is_one_warning(tmp_path, capsys):
    write_report_after_run(tmp_path)  # no metrics.jsonl: must not raise
    out = capsys.readouterr().out
    assert out.startswith("rlplat: warning: no report written") and out.count("\n") == 1


def test_a_real_run_ends_with_its_report(embedded_cache, small_val, tmp_path, capsys):
    from rlplat.trainer.run import load_run_config, run

    out_dir = tmp_path / "ppo"
    cfg, plan = load_run_config([
        "algorithm=ppo", f"trainer.output_dir={out_dir}", "trainer.total_steps=2", "trainer.test_freq=1",
        "trainer.ray_address=inprocess", f"data.val_files={small_val}", "data.train_batch_size_prompts=8",
        "actor.mini_batch_size_prompts=8", "rollout.n=2", "rollout.val_n=1"])
    run(cfg, plan)
    assert f"rlplat: report {out_dir / 'report' / 'index.html'}" in capsys.readouterr().out
    report = out_dir / "report"
    rows = read_jsonl(out_dir / "metrics.jsonl")
    logged = {k for row in rows for k in row}
    panels = {name: keys for name, _, keys in group_panels(metric_series(rows))}
    # every val/* metric is shown; equal curves (accuracy, score mean, pass@1 of one source) share a panel
    assert sorted(k for keys in panels["validation"] for k in keys) == sorted(k for k in logged if k.startswith("val/"))
    assert_real_png(report / "validation.png", len(panels["validation"]))
    assert len(panels["validation"]) < sum(k.startswith("val/") for k in logged)
    assert_real_png(report / "critic.png", len(panels["critic"]))
    assert_real_png(report / "entropy.png", 1)
    first = read_jsonl(report / "samples_first.jsonl")
    assert first and {r["step"] for r in first} == {0}
    assert {r["step"] for r in read_jsonl(report / "samples_latest.jsonl")} == {2}
    index = html.unescape((report / "index.html").read_text())
    assert '"steps": 2' in index and "No summary.json yet" not in index  # written before the report
