"""``python -m rlplat.tools.report RUN_DIR``: a run's plots, validation samples and an index page.

Reads what a run writes to its ``trainer.output_dir`` and writes ``RUN_DIR/report/``::

    metrics.jsonl      ─► <group>.svg                     one figure per metric group, one panel per metric
    timeline.jsonl     ─► timeline.svg                    the last steps: which pool computed what, when
    segments.json      ─► the dotted lines in them        where a resumed run picked up
    val_samples.jsonl  ─► samples_{first,latest}.html     the first and the latest validation's samples
                          samples_{first,latest}.jsonl    (the same, one sample per line)
    completions.jsonl  ─► completions_{first,latest}.html the first and the latest logged training step's
                          completions_{first,latest}.jsonl responses (trainer.log_completions)
    command.txt, summary.json, config.yaml, the above ─► index.html

It works on a run still in progress: ``summary.json`` may be absent and a line the trainer is still writing
is skipped. The trainer calls :func:`write_report_after_run` at the end of every run.
"""

from __future__ import annotations

import html
import json
import math
import sys
from pathlib import Path

from rlplat.utils.charts import Panel, Span, line_figure, timeline_figure
from rlplat.utils.tracking import SAMPLE_COLUMNS, TRAINING_SAMPLE_COLUMNS  # a validation's / training sample's

# (file name, figure title, metrics). A key ending in "/" stands for every metric under it, in name order,
# after the ones named before it. Groups with no metric in the run are left out.
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward", "Reward", ("score/mean", "reward/mean", "reward/accuracy", "score/max", "score/min",
                          "reward/num_errors")),
    ("validation", "Validation", ("val/accuracy", "val/score_mean", "val/reward_num_errors", "val/")),
    ("response_length", "Response length",
     ("response_length/mean", "response_length/max", "response_length/truncation_ratio")),
    ("kl", "KL", ("actor/kl_loss", "actor/reward_kl", "actor/kl_coef", "actor/approx_kl")),
    ("distillation", "On-policy distillation: reverse KL to the teacher and its log-prob, per token",
     ("distill/reverse_kl", "distill/teacher_log_prob", "distill/")),
    ("entropy", "Entropy", ("actor/entropy",)),
    ("grad_norm", "Gradient norm", ("actor/grad_norm",)),
    ("throughput", "Throughput",
     ("perf/tokens_per_s", "timing/step_s", "timing/generate_s", "timing/update_actor_s")),
    ("critic", "Critic", ("critic/",)),
    ("actor", "Actor update", ("actor/pg_loss", "actor/clip_frac_upper", "actor/clip_frac_lower", "actor/ratio_mean", "actor/")),
    ("moe", "Mixture of experts: router loss, expert load, routing entropy and mismatch",
     ("moe/aux_loss", "moe/expert_load_max_frac", "moe/routing_entropy", "moe/routing_mismatch_frac",
      "moe/router_mismatch_frac", "moe/")),
    ("reward_terms", "Reward functions and their fields", ("reward/",)),
    ("reward_calls", "Reward calls: spread, errors, timeouts, seconds per call", ("reward_calls/",)),
    ("recipe", "Recipe metrics", ("recipe/",)),
)
# Every metric no group above shows, but timing and throughput details, goes to a last figure of its own.
OTHER = ("other", "Other metrics")
NOT_IN_OTHER = ("timing/", "perf/")
SMOOTH_FROM = 20  # points from which a curve also gets its exponential moving average
SMOOTHING = 0.9  # the moving average's weight on the past
Series = dict[str, tuple[list[int], list[float]]]  # metric -> (steps, values), by step
USAGE = "usage: python -m rlplat.tools.report RUN_DIR   (writes RUN_DIR/report/index.html, plots and sample tables)"


class ReportError(Exception):
    """A run directory the report cannot be made from; the message is the whole explanation."""


def read_jsonl(path: Path) -> list[dict]:
    """The complete JSON objects in ``path``, one per line. A line that does not parse is skipped: it is the
    one a running trainer is writing (or was writing when it was killed)."""
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def metric_series(rows: list[dict]) -> Series:
    """metric -> (steps, values), sorted by step. A resumed run logs its steps again; the last row wins."""
    by_metric: dict[str, dict[int, float]] = {}
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int):
            continue
        for key, value in row.items():
            if key not in ("step", "time") and isinstance(value, (int, float)) and not isinstance(value, bool):
                by_metric.setdefault(key, {})[step] = float(value)
    return {key: (sorted(points), [points[s] for s in sorted(points)]) for key, points in by_metric.items()}


def group_panels(metrics: Series) -> list[tuple[str, str, list[list[str]]]]:
    """(file name, title, panels) for each group of :data:`GROUPS` that has data, then :data:`OTHER`. A
    metric is shown once, in the first group that names it; a panel is a list of metrics whose curves
    are identical and not constant (``score/mean`` and ``reward/mean`` with one reward function), drawn once.
    A count of reward errors that stayed 0 gets no panel: the group's title says "no reward errors"."""
    found, shown = [], set()
    groups = [*GROUPS, (*OTHER, tuple(sorted(k for k in metrics if not k.startswith(NOT_IN_OTHER))))]
    for name, title, patterns in groups:
        keys: list[str] = []
        for pattern in patterns:
            matches = sorted(k for k in metrics if k.startswith(pattern)) if pattern.endswith("/") else (
                [pattern] if pattern in metrics else [])
            keys += [k for k in matches if k not in keys and k not in shown]
        shown.update(keys)
        if none := [k for k in keys if k.endswith("num_errors") and not any(metrics[k][1])]:  # said, not drawn
            keys = [k for k in keys if k not in none]
            title += " (no reward errors)"
        panels: list[list[str]] = []
        for key in keys:  # a constant curve (a fixed coefficient) is alike by chance: its own panel
            varies = len(set(metrics[key][1])) > 1
            same = next((panel for panel in panels if varies and metrics[panel[0]] == metrics[key]), None)
            if same is None:
                panels.append([key])
            else:
                same.append(key)
        if panels:
            found.append((name, title, panels))
    return found


def moving_average(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """The exponential moving average of ``values``, debiased at the start (as tensorboard smooths)."""
    out, average = [], 0.0
    for count, value in enumerate(values, start=1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**count))
    return out


def resume_steps(rows: list[dict], segments: list[dict]) -> list[int]:
    """The first step each command after the first logged (``segments.json``: each command's start time,
    rows: ``metrics.jsonl``): where a resumed run picked up."""
    steps = []
    for segment in segments[1:]:
        later = [row["step"] for row in rows if isinstance(row.get("step"), int)
                 and isinstance(row.get("time"), (int, float)) and row["time"] >= segment.get("start", math.inf)]
        if later:
            steps.append(min(later))
    return steps


def y_label(key: str) -> str:
    leaf = key.rsplit("/", 1)[-1]
    if leaf.endswith("_per_s"):
        return f"{leaf[:-len('_per_s')]} / s"
    return "seconds" if leaf.endswith("_s") else leaf


def plot_group(title: str, panels: list[list[str]], series: Series, path: Path, resumes: list[int] = ()) -> int:
    """Draw one panel per entry of ``panels`` (value against step; a curve of :data:`SMOOTH_FROM` points or
    more also smoothed, a dotted line where a resumed run picked up) into the SVG file ``path``; the panels drawn."""
    drawn = []
    for keys in panels:
        steps, values = series[keys[0]]
        smoothed = moving_average(values) if len(steps) >= SMOOTH_FROM else None
        drawn.append(Panel(" = ".join(keys), y_label(keys[0]), steps, values, smoothed))
    path.write_text(line_figure(title, drawn, resumes))
    return len(drawn)


def write_plots(series: Series, out: Path, resumes: list[int] = ()) -> dict[str, int]:
    """One SVG figure per group with data; returns file name -> number of panels, in :data:`GROUPS` order."""
    return {f"{name}.svg": plot_group(title, panels, series, out / f"{name}.svg", resumes)
            for name, title, panels in group_panels(series)}


TIMELINE_STEPS = 4  # the last steps the timeline figure shows
TIMELINE_POOLS = ("trainer", "rollout", "controller")  # its rows, top to bottom


def plot_timeline(rows: list[dict], path: Path) -> bool:
    """``timeline.svg``: the last :data:`TIMELINE_STEPS` steps of ``timeline.jsonl``, one row per pool, a bar
    per span coloured by what it was (generate, update_actor, ...), the steps' boundaries dotted. False
    (nothing drawn) without a timeline."""
    rows = rows[-TIMELINE_STEPS:]
    if not rows:
        return False
    origin = rows[0]["start"]
    spans = [Span(pool, name, max(start, origin) - origin, end - origin)
             for row in rows for pool, name, start, end in row["spans"] if end > origin]
    pools = [pool for pool in TIMELINE_POOLS if any(span.row == pool for span in spans)]
    marks = [(row["start"] - origin, f"step {row['step']}") for row in rows]
    path.write_text(timeline_figure("Timeline: who computed what (rlplat.trainer.timeline)", pools, spans, marks))
    return True


#: (jsonl file, report file prefix, what its lines hold, their columns)
SAMPLE_FILES = (("val_samples.jsonl", "samples", "validation", SAMPLE_COLUMNS),
                ("completions.jsonl", "completions", "training step", TRAINING_SAMPLE_COLUMNS))


def samples_table(title: str, samples: list[dict], columns: tuple[str, ...]) -> str:
    """Samples as an HTML page; every value is escaped (responses are model output)."""
    def cell(value) -> str:
        text = (f"{value:g}" if isinstance(value, float) else json.dumps(value) if isinstance(value, dict)
                else str(value if value is not None else ""))
        return f"<td>{html.escape(text)}</td>"

    head = "".join(f"<th>{c}</th>" for c in ("#",) + columns)
    body = "\n".join(f"<tr><td>{i}</td>{''.join(cell(s.get(c)) for c in columns)}</tr>"
                     for i, s in enumerate(samples))
    return page(title, f"<p>{len(samples)} samples.</p>\n<table>\n<tr>{head}</tr>\n{body}\n</table>")


def write_samples(lines: list[dict], out: Path, prefix: str = "samples", what: str = "validation",
                  columns: tuple[str, ...] = SAMPLE_COLUMNS) -> list[tuple[str, str, int]]:
    """Tables of the first and the latest line (a step's samples); returns (label, file stem, step) for each
    written."""
    valid = [v for v in lines if isinstance(v.get("step"), int) and isinstance(v.get("samples"), list)]
    if not valid:
        return []
    written = []
    for label, v in (("first", valid[0]), ("latest", valid[-1])):
        stem = f"{prefix}_{label}"
        title = f"{what[0].upper()}{what[1:]} samples, step {v['step']}"
        (out / f"{stem}.html").write_text(samples_table(title, v["samples"], columns))
        with (out / f"{stem}.jsonl").open("w") as f:
            f.writelines(json.dumps({"step": v["step"], **s}) + "\n" for s in v["samples"])
        written.append((f"{label} {what}", stem, v["step"]))
    return written


STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px} pre{background:#f4f4f4;padding:.6em;"
         "white-space:pre-wrap} table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:.2em .5em;"
         "vertical-align:top;white-space:pre-wrap;font-family:monospace} img{max-width:100%;margin:.5em 0}")


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head>\n<body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")


def read_text(path: Path, missing: str) -> str:
    return path.read_text(errors="replace") if path.is_file() else missing


def index_page(run_dir: Path, plots: dict[str, int], samples: list[tuple[str, str, int]],
               last_step: int | None) -> str:
    """``index.html``: command, summary, plots, links to the sample tables, and the config (collapsed)."""
    summary_path = run_dir / "summary.json"
    summary = (read_text(summary_path, "") if summary_path.is_file()
               else "No summary.json yet: the run is in progress (or stopped before its end).")
    images = "\n".join(f"<div><img src='{name}' alt='{name}'></div>" for name in plots) or "<p>No metrics yet.</p>"
    links = "\n".join(f"<li><a href='{stem}.html'>{label} (step {step})</a> "
                      f"(<a href='{stem}.jsonl'>jsonl</a>)</li>" for label, stem, step in samples)
    parts = [
        f"<p>Run directory: <code>{html.escape(str(run_dir.resolve()))}</code>; metrics.jsonl "
        f"{'has no complete line yet' if last_step is None else f'reaches step {last_step}'}.</p>",
        f"<h2>Command</h2><pre>{html.escape(read_text(run_dir / 'command.txt', '(no command.txt)'))}</pre>",
        f"<h2>Summary</h2><pre>{html.escape(summary)}</pre>",
        f"<h2>Plots</h2>\n{images}",
        f"<h2>Samples</h2>\n<ul>{links}</ul>" if samples else
        "<h2>Samples</h2><p>No val_samples.jsonl yet.</p>",
        "<h2>Config</h2><details><summary>config.yaml</summary>"
        f"<pre>{html.escape(read_text(run_dir / 'config.yaml', '(no config.yaml)'))}</pre></details>",
    ]
    return page(f"rlplat run report: {run_dir.name}", "\n".join(parts))


def write_report(run_dir: str | Path) -> Path:
    """Write ``RUN_DIR/report/`` and return its path. Raises :class:`ReportError` for a directory that is
    not a run (missing, or without ``metrics.jsonl``)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"run directory {run_dir} does not exist")
    if not (run_dir / "metrics.jsonl").is_file():
        raise ReportError(f"{run_dir} has no metrics.jsonl (is it a run's trainer.output_dir, "
                          "trained with 'jsonl' in trainer.logger?)")
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    series = metric_series(rows)
    segments_path = run_dir / "segments.json"
    try:
        segments = json.loads(segments_path.read_text()) if segments_path.is_file() else []
    except ValueError:  # a damaged segments.json costs the resume marks, not the report
        segments = []
    plots = write_plots(series, out, resume_steps(rows, segments))
    timeline = run_dir / "timeline.jsonl"
    if timeline.is_file() and plot_timeline(read_jsonl(timeline), out / "timeline.svg"):
        plots["timeline.svg"] = 1
    samples = [table for name, prefix, what, columns in SAMPLE_FILES if (run_dir / name).is_file()
               for table in write_samples(read_jsonl(run_dir / name), out, prefix, what, columns)]
    last_step = max((steps[-1] for steps, _ in series.values()), default=None)
    (out / "index.html").write_text(index_page(run_dir, plots, samples, last_step))
    return out


def write_report_after_run(run_dir: str | Path) -> None:
    """The end of a run: write the report; a failure is one warning line, never a failed run."""
    try:
        print(f"rlplat: report {write_report(run_dir) / 'index.html'}", flush=True)
    except Exception as e:  # noqa: BLE001 - the run itself succeeded; the report is an extra
        reason = str(e) if isinstance(e, ReportError) else f"{type(e).__name__}: {e}"
        print(f"rlplat: warning: no report written: {reason}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(args) != 1:
        print(f"rlplat: report takes one RUN_DIR; {USAGE}", file=sys.stderr)
        return 2
    try:
        out = write_report(args[0])
    except (ReportError, OSError) as e:  # not a run, or a report directory that cannot be written
        print(f"rlplat: report: {e}", file=sys.stderr)
        return 2
    print(f"rlplat: report {out / 'index.html'}")
    return 0

