"""`plot_runs`: PNG curves of runs' scalars, to compare runs where there is only a terminal.

One figure per scalar, one colour per run (the legend names the run directory), training
summaries as solid lines and evaluations as dashed lines with markers; dotted vertical lines in
the run's colour mark where it resumed from a checkpoint, and a star marks its best export on
the evaluation curve of the metric the exporter ranks by (only there: on another metric, the
best export's step is not the best value). The y axis may be logarithmic (``log_scale``), for
losses that fall by orders of magnitude. The ``cadence plot`` command calls it; the data comes
from `cadence.writers.reading.read_run` (JSON lines, else CSV tables, else TensorBoard event
files).

matplotlib is an optional dependency (``pip install 'cadence[plot]'``), imported on first use.
Figures are drawn on matplotlib's non-interactive Agg canvas directly, without pyplot, so
plotting neither opens a window nor changes the backend of a program that imports cadence.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cadence.writers.reading import BestExport, RunScalars, Series

INSTALL_HINT = "pip install 'cadence[plot]'"
FIGSIZE = (8.0, 4.5)
DPI = 100
"""Each PNG is ``FIGSIZE * DPI`` pixels: 800 x 450."""


def _matplotlib() -> tuple[Any, Any]:
    """matplotlib's ``Figure`` and Agg ``FigureCanvasAgg``.

    Raises:
        ModuleNotFoundError: (named ``matplotlib``) saying how to install it.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ModuleNotFoundError(
            f"plotting needs matplotlib, which is not installed ({error}): {INSTALL_HINT}",
            name="matplotlib") from None
    return Figure, FigureCanvasAgg


def select_metrics(runs: Sequence[RunScalars], patterns: Sequence[str] | None = None
                   ) -> list[str]:
    """The scalar names of `runs` that `patterns` select (exact names or shell patterns such as
    ``'*loss'``); all of them without `patterns`.

    Raises:
        ValueError: for a pattern that selects nothing; the message lists the names there are.
    """
    names = sorted({m for run in runs for m in run.metrics})
    if not patterns:
        return names
    chosen: list[str] = []
    for pattern in patterns:
        matched = [n for n in names if n == pattern or fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise ValueError(f"--metrics {pattern!r} matches no scalar of "
                             f"{', '.join(run.name for run in runs)}; there are: "
                             f"{', '.join(names) or 'none'}.")
        chosen.extend(n for n in matched if n not in chosen)
    return chosen


def smoothed(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased at the start.

    >>> [round(v, 3) for v in smoothed([1.0, 0.0, 0.0], 0.5)]
    [1.0, 0.333, 0.143]
    """
    out, last, debias = [], 0.0, 1.0
    for value in values:
        last = last * weight + (1 - weight) * value
        debias *= weight
        out.append(last / (1 - debias) if debias < 1 else value)
    return out


def file_name(metric: str) -> str:
    """The PNG's name for `metric`: nested names (``a/b``) and odd characters become ``_``.

    >>> file_name("eval/top-1 accuracy")
    'eval_top-1_accuracy.png'
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "_", metric).strip("_") + ".png"


def run_labels(runs: Sequence[RunScalars]) -> list[str]:
    """Each run's legend label: the directory's name, with its parents where two runs share
    a name (``a/run``, ``b/run``)."""
    labels = [run.name for run in runs]
    depth = 1
    while len(set(labels)) < len(labels) and depth < 8:
        depth += 1
        labels = ["/".join(run.root.resolve().parts[-depth:]) for run in runs]
    return labels


_STYLES: dict[str, dict[str, Any]] = {
    "train": {"linestyle": "-"},
    "eval": {"linestyle": "--", "marker": "o", "markersize": 3},
}


def _style(series: Series) -> dict[str, Any]:
    return dict(_STYLES["train" if series.is_train else "eval"])


def ranked_by_best(series: Series, best: BestExport | None) -> bool:
    """Whether `series` is the evaluation curve of the metric that `best` was ranked by: its
    name below the evaluation directory (``accuracy`` in ``eval/``, ``per_class/cat`` for
    ``eval/per_class/``) is the ledger's metric."""
    if best is None or series.is_train:
        return False
    return "/".join([*series.split.split("/")[1:], series.metric]) == best.metric


def _positive(metric: str, runs: Sequence[RunScalars]) -> bool:
    """Whether every value of `metric` in `runs` is above zero (a log axis can show them)."""
    return all(v > 0 for run in runs for series in run.get(metric) for v in series.values)


def _draw(ax: Any, metric: str, runs: Sequence[RunScalars], labels: Sequence[str],
          smooth: float) -> None:
    for index, (run, label) in enumerate(zip(runs, labels)):
        color = f"C{index % 10}"
        for series in run.get(metric):
            name = f"{label} {series.split}"
            style = _style(series)
            if smooth > 0 and len(series.values) > 2:
                ax.plot(series.steps, series.values, color=color, alpha=0.25,
                        linewidth=1, **style)
                ax.plot(series.steps, smoothed(series.values, smooth), color=color,
                        label=f"{name} (smoothed {smooth:g})", **style)
            else:
                ax.plot(series.steps, series.values, color=color, label=name, **style)
            best = run.best
            if best is None or not ranked_by_best(series, best):
                continue
            ax.plot([best.step], [best.value], marker="*", markersize=14, color=color,
                    markeredgecolor="black", linestyle="none",
                    label=f"{label} best export (step {best.step})", zorder=5)
        for number, resume in enumerate(run.resumes):
            what = "resumed" if resume.reason == "resume" else resume.reason
            ax.axvline(resume.step, color=color, linestyle=":", linewidth=1.2,
                       label=f"{label} {what}" if number == 0 else None)


def plot_runs(runs: Sequence[RunScalars], out_dir: str | os.PathLike[str],
              metrics: Sequence[str] | None = None, smooth: float = 0.0,
              log_scale: bool = False) -> list[Path]:
    """Writes one PNG per scalar of `runs` into `out_dir` (created if needed).

    Args:
        runs: what `cadence.writers.reading.read_run` read, one per run directory.
        out_dir: where the PNGs go; a file of the same name is replaced.
        metrics: names or shell patterns of the scalars to plot (`select_metrics`); None: all.
        smooth: TensorBoard's smoothing weight in [0, 1): 0 draws the values as they are,
            0.6 a moving average (over the raw values, drawn faint).
        log_scale: draw the y axes on a log scale. A metric with a value at or below zero
            keeps a linear axis, and its title says so.

    Returns:
        The paths written, one per scalar, in the order of the scalars' names.

    Raises:
        ValueError: for no `runs`, a `smooth` out of range, or a metric pattern that selects
            nothing.
        ModuleNotFoundError: if matplotlib is not installed (the message says how to).
    """
    if not runs:
        raise ValueError("`runs` is empty: pass what read_run() read from each run directory.")
    if not 0 <= smooth < 1:
        raise ValueError(f"`smooth` (got {smooth!r}) must be in [0, 1), e.g. 0.6.")
    names = select_metrics(runs, metrics)
    Figure, FigureCanvasAgg = _matplotlib()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = run_labels(runs)
    written: list[Path] = []
    taken: set[str] = set()
    for metric in names:
        figure = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
        FigureCanvasAgg(figure)
        ax = figure.add_subplot()
        _draw(ax, metric, runs, labels, smooth)
        title = metric
        if log_scale and _positive(metric, runs):
            ax.set_yscale("log")
        elif log_scale:
            title = f"{metric} (linear axis: values <= 0)"
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="best")
        name = file_name(metric)
        stem, number = name.removesuffix(".png"), 1
        while name in taken:  # two metrics that differ only in odd characters
            number += 1
            name = f"{stem}-{number}.png"
        taken.add(name)
        path = out / name
        figure.savefig(path, dpi=DPI)
        written.append(path)
    return written
