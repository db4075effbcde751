"""The run report's figures as SVG text: grids of line panels (a metric against step) and the timeline's bars.

Drawn by hand rather than with a plotting library because every run ends by writing its report: a figure
here is string formatting (milliseconds), where rendering the same panels through a plotting library and a
raster backend took ~0.2 s a panel, about 8 s at the end of every run. Browsers show SVG in ``<img>`` and it
scales without blurring. Colours are the ten of the common "tab10" cycle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import NamedTuple

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
FONT = "font-family='sans-serif'"
PANEL_W, PANEL_H = 420, 300  # one panel's box, px
FIGURE_TITLE_H = 40
PLOT = (64, 28, 14, 42)  # the plot area's margins inside a panel's box: left, top, right, bottom
MARKERS_UP_TO = 50  # points up to which each one is also drawn as a dot


class Panel(NamedTuple):
    title: str
    y_label: str
    steps: list[int]
    values: list[float]
    smoothed: list[float] | None  # drawn over a faint ``values`` when given


def nice_ticks(low: float, high: float, count: int = 5, integer: bool = False) -> list[float]:
    """About ``count`` round tick values (1, 2 or 5 x 10^k apart; whole numbers with ``integer``) whose first
    is <= ``low`` and last >= ``high``: the axis spans them. A range of one value is widened around it."""
    if not high > low:
        pad = 1.0 if integer else (abs(low) * 0.1 or 0.5)
        low, high = low - pad, high + pad
    raw = (high - low) / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    if integer:
        step = max(1.0, round(step))
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    return [i * step for i in range(first, last + 1)]


def tick_label(value: float, ticks: Sequence[float]) -> str:
    """``value`` written with as many decimals as the ticks' spacing needs."""
    step = ticks[1] - ticks[0]
    if max(abs(ticks[0]), abs(ticks[-1])) >= 1e5 or step < 1e-4:
        text = f"{value:.3g}"
    else:
        text = f"{value:.{max(0, -math.floor(math.log10(step) + 1e-9))}f}"
    return text.lstrip("-") if text.strip("-0.") == "" else text  # no "-0.0"


def svg(width: float, height: float, parts: list[str]) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
            f"viewBox='0 0 {width:.0f} {height:.0f}' {FONT}>\n<rect width='100%' height='100%' fill='white'/>\n"
            + "\n".join(parts) + "\n</svg>\n")


def text(x: float, y: float, words: str, size: int = 10, anchor: str = "middle", extra: str = "") -> str:
    return f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' {extra}>{escape(words)}</text>"


def finite_runs(xs: Sequence[float], ys: Sequence[float]) -> list[list[tuple[float, float]]]:
    """The points split where a value is not finite (NaN, inf): each run is drawn as its own line."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(xs, ys):
        if math.isfinite(y):
            runs[-1].append((x, y))
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def line_panel(left: float, top: float, panel: Panel, resumes: Sequence[int]) -> str:
    """One panel in the box at (``left``, ``top``): frame, grid, ticks, the curve(s), the resume marks."""
    x0, y0 = left + PLOT[0], top + PLOT[1]
    width, height = PANEL_W - PLOT[0] - PLOT[2], PANEL_H - PLOT[1] - PLOT[3]
    finite = [v for v in panel.values if math.isfinite(v)] or [0.0]
    x_ticks = nice_ticks(min(panel.steps), max(panel.steps), integer=True)
    y_ticks = nice_ticks(min(finite), max(finite))

    def px(step: float) -> float:
        return x0 + (step - x_ticks[0]) / (x_ticks[-1] - x_ticks[0]) * width

    def py(value: float) -> float:
        return y0 + (y_ticks[-1] - value) / (y_ticks[-1] - y_ticks[0]) * height

    size = 11 if " = " not in panel.title else 9
    lines = title_lines(panel.title, size)
    parts = [text(left + PANEL_W / 2, max(top + 9, top + 18 - 10 * (len(lines) - 1)) + 10 * i, line, size)
             for i, line in enumerate(lines)]
    for tick in x_ticks:
        parts += [f"<line x1='{px(tick):.1f}' y1='{y0}' x2='{px(tick):.1f}' y2='{y0 + height}' stroke='#e4e4e4'/>",
                  text(px(tick), y0 + height + 14, tick_label(tick, x_ticks))]
    for tick in y_ticks:
        parts += [f"<line x1='{x0}' y1='{py(tick):.1f}' x2='{x0 + width}' y2='{py(tick):.1f}' stroke='#e4e4e4'/>",
                  text(x0 - 5, py(tick) + 3.5, tick_label(tick, y_ticks), anchor="end")]
    middle = y0 + height / 2
    parts += [text(x0 + width / 2, y0 + height + 32, "step"),
              text(left + 13, middle, panel.y_label, extra=f"transform='rotate(-90 {left + 13} {middle:.1f})'")]
    def curve(kind: str, values: Sequence[float], opacity: float) -> list[str]:
        return [f"<polyline class='{kind}' points='{' '.join(f'{px(s):.1f},{py(v):.1f}' for s, v in run)}' "
                f"fill='none' stroke='{COLOURS[0]}' stroke-width='1.5' stroke-opacity='{opacity}'/>"
                for run in finite_runs(panel.steps, values)]

    opacity = 1 if panel.smoothed is None else 0.35  # faint under the moving average
    parts += curve("values", panel.values, opacity)
    if len(panel.steps) <= MARKERS_UP_TO:
        dot = f"r='2.5' fill='{COLOURS[0]}' fill-opacity='{opacity}'"
        parts += [f"<circle cx='{px(s):.1f}' cy='{py(v):.1f}' {dot}/>" for run in finite_runs(panel.steps, panel.values)
                  for s, v in run]
    if panel.smoothed is not None:
        parts += curve("smoothed", panel.smoothed, 1)
    for step in resumes:
        if panel.steps[0] <= step <= panel.steps[-1]:
            parts.append(f"<line class='resume' x1='{px(step - 0.5):.1f}' y1='{y0}' x2='{px(step - 0.5):.1f}' "
                         f"y2='{y0 + height}' stroke='{COLOURS[3]}' stroke-dasharray='2,3'/>")
    parts.append(f"<rect class='frame' x='{x0}' y='{y0}' width='{width}' height='{height}' fill='none' stroke='#222'/>")
    return "<g class='panel'>\n" + "\n".join(parts) + "\n</g>"


def title_lines(title: str, size: int) -> list[str]:
    """A panel's title broken between its ``" = "``-joined names into lines that fit the panel's width (about
    0.55 em a character), so the names of identical curves do not run into the next panel."""
    limit = int((PANEL_W - 16) / (0.55 * size))
    lines: list[str] = []
    for name in title.split(" = "):
        if lines and len(lines[-1]) + 3 + len(name) <= limit:
            lines[-1] += " = " + name
        else:
            lines.append(name)
    return lines


def line_figure(title: str, panels: list[Panel], resumes: Sequence[int] = ()) -> str:
    """``panels`` in a grid under ``title``: 2 columns for 4 panels, else up to 3 (4 from 10 panels on), so
    at most 2 slots stay blank."""
    cols = 2 if len(panels) == 4 else min(len(panels), 3 if len(panels) <= 9 else 4)
    rows = math.ceil(len(panels) / cols)
    parts = [text(cols * PANEL_W / 2, 27, title, 16, extra="font-weight='bold'")]
    parts += [line_panel(i % cols * PANEL_W, FIGURE_TITLE_H + i // cols * PANEL_H, panel, resumes)
              for i, panel in enumerate(panels)]
    return svg(cols * PANEL_W, FIGURE_TITLE_H + rows * PANEL_H, parts)


class Span(NamedTuple):
    row: str  # the pool it ran on
    name: str  # what ran (a stage, a generation call)
    start: float  # seconds from the figure's origin
    end: float


def timeline_figure(title: str, rows: list[str], spans: list[Span], marks: list[tuple[float, str]]) -> str:
    """One row of bars per entry of ``rows`` (a bar per span, coloured by its name and titled with it and
    its seconds), dotted lines with labels at ``marks`` (seconds, label), a legend of the names below."""
    width, left, right, row_h, top = 1100, 90, 20, 36, 36
    names = sorted({span.name for span in spans})
    colour = {name: COLOURS[i % len(COLOURS)] for i, name in enumerate(names)}
    ticks = nice_ticks(0.0, max([span.end for span in spans] + [at for at, _ in marks] + [1e-3]), count=8)
    plot_w, plot_h = width - left - right, row_h * len(rows)

    def px(seconds: float) -> float:
        return left + (seconds - ticks[0]) / (ticks[-1] - ticks[0]) * plot_w

    parts = [text(width / 2, 22, title, 13)]
    for i, row in enumerate(rows):
        parts.append(text(left - 6, top + (i + 0.5) * row_h + 4, row, 11, anchor="end"))
        for span in (span for span in spans if span.row == row):
            parts.append(f"<rect class='span' x='{px(span.start):.1f}' y='{top + i * row_h + 5}' "
                         f"width='{max(px(span.end) - px(span.start), 0.5):.1f}' height='{row_h - 10}' "
                         f"fill='{colour[span.name]}'><title>{escape(span.name)}: "
                         f"{span.end - span.start:.3f} s</title></rect>")
    for at, label in marks:
        parts += [f"<line x1='{px(at):.1f}' y1='{top}' x2='{px(at):.1f}' y2='{top + plot_h}' stroke='grey' "
                  f"stroke-dasharray='2,3'/>", text(px(at) + 3, top - 3, label, 9, anchor="start")]
    for tick in ticks:
        parts.append(text(px(tick), top + plot_h + 14, tick_label(tick, ticks)))
    parts += [text(left + plot_w / 2, top + plot_h + 30, "seconds"),
              f"<rect class='frame' x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='none' "
              "stroke='#222'/>"]
    legend_y, per_row = top + plot_h + 48, 6
    for i, name in enumerate(names):
        x, y = left + (i % per_row) * (plot_w / per_row), legend_y + (i // per_row) * 16
        parts += [f"<rect x='{x:.1f}' y='{y - 9}' width='10' height='10' fill='{colour[name]}'/>",
                  text(x + 14, y, name, 9, anchor="start")]
    return svg(width, legend_y + 16 * math.ceil(len(names) / per_row) + 6, parts)
