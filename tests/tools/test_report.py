"""The run report (``python -m rlplat.tools.report RUN_DIR``): SVG figures with one panel per metric,
escaped sample tables, runs still in progress, and the one-line errors."""

import html
import json
import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rlplat.utils.charts import nice_ticks, tick_label
from rlplat.utils.report import (
    group_panels, main, metric_series, moving_average, read_jsonl, resume_steps, write_report, write_report_after_run,
)

SVG = "{http://www.w3.org/2000/svg}"


def assert_real_svg(path: Path, panels: int) -> list[ET.Element]:
    """``path`` is a well-formed SVG figure of ``panels`` panels, each with its frame and its curve; the panels."""
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    assert float(root.get("width")) >= 400 and float(root.get("height")) >= 300
    found = [g for g in root.iter(f"{SVG}g") if g.get("class") == "panel"]
    assert len(found) == panels, path.name
    for panel in found:
        assert [r for r in panel.iter(f"{SVG}rect") if r.get("class") == "frame"], path.name
        assert [p for p in panel.iter(f"{SVG}polyline") if p.get("class") == "values"], path.name
    return found


def curve(panel: ET.Element, kind: str = "values") -> list[tuple[float, float]]:
    """A panel's curve as the (x, y) pixels it passes through."""
    line = next(p for p in panel.iter(f"{SVG}polyline") if p.get("class") == kind)
    return [tuple(map(float, point.split(","))) for point in line.get("points").split()]


def panel_title(panel: ET.Element) -> str:
    return next(panel.iter(f"{SVG}text")).text


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
    expected = {"reward.svg": 2, "validation.svg": 1, "entropy.svg": 1, "critic.svg": 2, "actor.svg": 1}
    assert sorted(p.name for p in out.glob("*.svg")) == sorted(expected)
    for name, panels in expected.items():
        assert_real_svg(out / name, panels)
    # the curve: a point per logged step, left to right, higher where the value is higher (SVG's y points down)
    score_mean = assert_real_svg(out / "reward.svg", 2)[0]
    points = curve(score_mean)
    assert panel_title(score_mean) == "score/mean" and len(points) == 20
    assert all(a[0] < b[0] and a[1] > b[1] for a, b in zip(points, points[1:]))  # score/mean rises with the step
    validation = assert_real_svg(out / "validation.svg", 1)[0]
    assert len(curve(validation)) == 5  # step 0 and every 5th
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
    assert_real_svg(out / "reward.svg", 3)
    assert_real_svg(out / "other.svg", 1)


def test_a_resumed_run_is_marked_where_it_picked_up(tmp_path):
    rows = [{"step": s, "time": 100.0 + s} for s in range(0, 7)] + [{"step": s, "time": 500.0 + s} for s in (5, 6)]
    assert resume_steps(rows, [{"start": 90.0, "end": 107.0}, {"start": 499.0, "end": 507.0}]) == [5]
    assert resume_steps(rows, [{"start": 90.0, "end": 107.0}]) == []
    run_dir = make_run(tmp_path, steps=30)
    (run_dir / "segments.json").write_text(json.dumps([{"start": 0.0, "end": 12.5}, {"start": 12.5, "end": 30.0}]))
    score_mean = assert_real_svg(write_report(run_dir) / "reward.svg", 2)[0]
    points, smoothed = curve(score_mean), curve(score_mean, "smoothed")  # 30 points: the moving average over them
    assert len(points) == len(smoothed) == 30 and points[0] == smoothed[0] and points[-1][1] < smoothed[-1][1]
    marks = [line for line in score_mean.iter(f"{SVG}line") if line.get("class") == "resume"]
    assert len(marks) == 1 and points[11][0] < float(marks[0].get("x1")) < points[12][0]  # between steps 12 and 13
    (run_dir / "segments.json").write_text("{not json")
    assert (write_report(run_dir) / "reward.svg").is_file()


def test_a_value_that_is_not_finite_breaks_the_curve(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # json writes float("nan") as NaN and reads it back
    write_jsonl(run_dir / "metrics.jsonl", [{"step": s, "actor/grad_norm": math.nan if s == 3 else float(s)}
                                            for s in range(1, 6)])
    panel = assert_real_svg(write_report(run_dir) / "grad_norm.svg", 1)[0]
    assert [len(line.get("points").split()) for line in panel.iter(f"{SVG}polyline")] == [2, 2]


def test_ticks_are_round_and_span_the_values():
    assert nice_ticks(0.03, 0.97) == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert nice_ticks(1, 30, integer=True) == [0, 10, 20, 30]
    assert nice_ticks(1, 3, integer=True) == [1, 2, 3]  # never a half step
    assert nice_ticks(5.0, 5.0) == pytest.approx([4.4, 4.6, 4.8, 5.0, 5.2, 5.4, 5.6])  # one value: widened around it
    assert [tick_label(t, nice_ticks(0.03, 0.97)) for t in nice_ticks(0.03, 0.97)] == ["0.0", "0.2", "0.4", "0.6",
                                                                                       "0.8", "1.0"]
    assert tick_label(-0.0, [0.0, 1.0]) == "0" and tick_label(-1e-17, [0.0, 0.1]) == "0.0"  # never "-0"
    assert tick_label(2.5e6, [0.0, 1e6]) == "2.5e+06"


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
    assert_real_svg(run_dir / "report" / "reward.svg", 2)


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
        "actor.mini_batch_size_prompts=8", "rollout.n=2", "rollout.val_n=1", "trainer.log_completions=3"])
    run(cfg, plan)
    assert f"rlplat: report {out_dir / 'report' / 'index.html'}" in capsys.readouterr().out
    report = out_dir / "report"
    rows = read_jsonl(out_dir / "metrics.jsonl")
    logged = {k for row in rows for k in row}
    assert {"critic/grad_norm", "critic/lr", "actor/grad_norm"} <= logged and "grad_norm" not in logged
    panels = {name: keys for name, _, keys in group_panels(metric_series(rows))}
    # every val/* metric is shown; equal curves (accuracy, score mean, pass@1 of one source) share a panel; no
    # reward errors is said in the title, not drawn as a flat zero
    titles = {name: title for name, title, _ in group_panels(metric_series(rows))}
    assert all(row.get("val/reward_num_errors", 0) == 0 for row in rows)
    assert titles["validation"] == "Validation (no reward errors)"
    assert sorted(k for keys in panels["validation"] for k in keys) == sorted(
        k for k in logged if k.startswith("val/") and k != "val/reward_num_errors")
    assert_real_svg(report / "validation.svg", len(panels["validation"]))
    assert len(panels["validation"]) < sum(k.startswith("val/") for k in logged)
    assert_real_svg(report / "critic.svg", len(panels["critic"]))
    assert_real_svg(report / "entropy.svg", 1)
    first = read_jsonl(report / "samples_first.jsonl")
    assert first and {r["step"] for r in first} == {0}
    assert {r["step"] for r in read_jsonl(report / "samples_latest.jsonl")} == {2}
    index = html.unescape((report / "index.html").read_text())
    assert '"steps": 2' in index and "No summary.json yet" not in index  # written before the report
    # trainer.log_completions=3: each step's first three responses with their scores, advantages and terms
    completions = read_jsonl(out_dir / "completions.jsonl")
    assert [line["step"] for line in completions] == [1, 2] and all(len(line["samples"]) == 3 for line in completions)
    for sample in (s for line in completions for s in line["samples"]):
        assert set(sample) >= {"prompt", "response", "score", "advantage", "reward_terms", "truncated"}
        assert sample["prompt"] and isinstance(sample["advantage"], float)
        assert sum(sample["reward_terms"].values()) == pytest.approx(sample["score"])  # one function, weight 1
    assert [r["step"] for r in read_jsonl(report / "completions_latest.jsonl")] == [2, 2, 2]
    assert "href='completions_first.html'" in index and "Training step samples, step 1" in html.unescape(
        (report / "completions_first.html").read_text())


def test_the_names_of_identical_curves_wrap_inside_their_panel():
    from rlplat.utils.charts import PANEL_W, title_lines

    names = ["val/rlplat/arithmetic/accuracy", "val/rlplat/arithmetic/best@1", "val/rlplat/arithmetic/maj@1",
             "val/score_mean"]
    lines = title_lines(" = ".join(names), 9)
    assert len(lines) == 2 and " = ".join(lines) == " = ".join(names)
    assert all(len(line) * 0.55 * 9 <= PANEL_W - 16 for line in lines)  # within the panel at 9 px
    assert title_lines("val/accuracy", 11) == ["val/accuracy"]
