"""`MetricLog`: what a `TrainLoop` collected since its last print, and where it goes when printed.

Metrics are collected per epoch and, inside a step, per step too; each name has the engine's
`cadence.engine.metrics.Moments` (tensors stay on their device; every element of a collected
array is one value). A value collected inside a step is added once, to the step's collector,
which joins the epoch's (`Moments.merge`) when the step's metrics are printed or the step loop
ends: the epoch's statistics hold every value, at one update per value. A print turns them
into ``mean (±std)``
text and writes the means as summaries -- skipping durations by default, and writing a metric
only every k-th time when asked -- then forgets them.

A torchmetrics metric collected as a value (``loop.collect_metrics(accuracy=metric)``, at any
step or once per epoch) is kept as it is, and read at the print with ``compute()`` -- once, and
across ranks by torchmetrics' own gathering; its result counts as the values of an array do (a
scalar prints as itself), a collection's results as ``name/key``. Once the epoch's print has read
it, it is reset, as the collected values are forgotten; a step's print reads it without
resetting it when the epoch collects it too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from cadence.core.hook_checks import describe
from cadence.core.summary import SummaryManager
from cadence.engine.external_metrics import compute_metric, is_torchmetric
from cadence.engine.metrics import Moments
from cadence.tfsnippet.formatting import DefaultMetricFormatter, format_stats

Stats = dict[str, tuple[float, float | None]]
"""``{name: (mean, std or None)}``: std is None for a single value."""


class MetricLog:
    """Collectors of the running epoch and step, and their printing.

    Args:
        formatter: orders and formats the metrics of a line.
        summary_prefix: prefix of the summary tags.
        skip: metrics whose names match are not written as summaries.
        commit_freqs: ``{metric: k}``: write that metric only every k-th print.
    """

    def __init__(self, formatter: DefaultMetricFormatter, summary_prefix: str,
                 skip: re.Pattern[str] | None, commit_freqs: Mapping[str, int]) -> None:
        self.formatter = formatter
        self.summary_prefix = summary_prefix
        self.skip = skip
        self.commit_freqs = dict(commit_freqs)
        self._commit_counts: dict[str, int] = {}
        self.epoch: dict[str, Moments] = {}
        self.step: dict[str, Moments] = {}
        self.epoch_metrics: dict[str, Any] = {}
        """torchmetrics metrics collected in the epoch, by name (read when printed)."""
        self.step_metrics: dict[str, Any] = {}

    def collect(self, name: str, value: Any, within_step: bool) -> None:
        """Adds a value to the epoch's collector of `name`, and to the step's inside a step.

        Raises:
            TypeError: for a name collected both as values and as a torchmetrics metric; for a
                value that is not a number, an array of numbers, a tensor or a torchmetrics
                metric (a string, a dict, None).
        """
        kind = type(value)  # a step's tensor or time is not a torchmetrics metric: no lookup
        if kind is not torch.Tensor and kind is not float and kind is not int:
            if is_torchmetric(value):
                self._collect_metric(name, value, within_step)
                return
            value = _as_values(name, value)
            if value is None:
                return  # an empty array adds nothing
        collectors = self.step if within_step else self.epoch
        collector = collectors.get(name)  # per step: no collector is built unless it is new
        if collector is None:
            if name in self.epoch_metrics:
                raise TypeError(f"Metric {name!r} was collected as a torchmetrics metric "
                                "and now as a value: collect one or the other.")
            collector = collectors[name] = Moments()
        collector.update(value)

    def _collect_metric(self, name: str, metric: Any, within_step: bool) -> None:
        if name in self.epoch or name in self.step:
            raise TypeError(f"Metric {name!r} was collected as values and now as a torchmetrics "
                            "metric: collect one or the other.")
        self.epoch_metrics[name] = metric
        if within_step:
            self.step_metrics[name] = metric

    def take(self, within_step: bool) -> Stats:
        """The statistics of the step's (inside a step) or the epoch's metrics, which are then
        forgotten (a host read of each); torchmetrics metrics are computed, and reset once the
        epoch's are read."""
        if not within_step:
            self._step_into_epoch()  # nothing is left there: a step loop's end moved it
        collectors = self.step if within_step else self.epoch
        stats: Stats = {}
        for name, collector in collectors.items():
            stats.update(_moments_of(name, collector))
        if within_step:
            self._step_into_epoch()
        collectors.clear()
        metrics = self.step_metrics if within_step else self.epoch_metrics
        for name, metric in metrics.items():
            stats.update(_stats_of(name, compute_metric(metric)))
            if not within_step:
                metric.reset()
        metrics.clear()
        return stats

    def line(self, stats: Stats) -> str:
        """``name: mean (±std); ...``."""
        return format_stats(stats, self.formatter)

    def write_summaries(self, writer: SummaryManager | None, means: Mapping[str, float],
                        step: int) -> None:
        """Writes the means (all but the skipped ones, each at its commit frequency)."""
        if writer is None:
            return
        values = {}
        for name, mean in means.items():
            if self.skip is not None and self.skip.match(name):
                continue
            count = self._commit_counts[name] = self._commit_counts.get(name, 0) + 1
            if (count - 1) % self.commit_freqs.get(name, 1):
                continue
            values[f"{self.summary_prefix}{name}"] = mean
        if values:
            writer.write_summaries(values, step=step)

    def clear_step(self) -> None:
        """Ends the step's collecting (when the step loop ends): what it collected and did not
        print stays in the epoch's statistics only."""
        self._step_into_epoch()
        self.step_metrics.clear()

    def _step_into_epoch(self) -> None:
        """Moves the step's collectors into the epoch's: merged into one of the same name, or
        taken over as they are."""
        epoch = self.epoch
        for name, collector in self.step.items():
            into = epoch.get(name)
            if into is None:
                epoch[name] = collector
            else:
                into.merge(collector)
        self.step.clear()

    def clear(self) -> None:
        """Forgets everything collected (torchmetrics metrics keep their states: they are the
        caller's)."""
        self.epoch.clear()
        self.step.clear()
        self.epoch_metrics.clear()
        self.step_metrics.clear()


def _stats_of(name: str, value: Any) -> Stats:
    """The statistics of a computed metric: a scalar as itself, an array as its elements, a
    mapping (a collection's results) key by key as ``name/key``."""
    if isinstance(value, Mapping):
        stats: Stats = {}
        for key, item in value.items():
            stats.update(_stats_of(f"{name}/{key}", item))
        return stats
    values = value if isinstance(value, (int, float)) else _as_values(name, value)
    if values is None:
        return {}
    collector = Moments()
    collector.update(values)
    return _moments_of(name, collector)


def _as_values(name: str, value: Any) -> Any:
    """A collected value as `Moments` takes it: a tensor (detached) or a number as it is, an
    array or a list of numbers as a float64 tensor; None for an empty one.

    Raises:
        TypeError: for anything else -- a string (NumPy would read ``"1.5"`` as a number), a
            dict, None (NumPy would make it NaN) -- naming the metric.
    """
    if isinstance(value, torch.Tensor):
        return value.detach() if value.numel() else None
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # a ragged list, an object NumPy cannot read
        array = None
    if array is None or array.dtype.kind not in "biuf":  # bool, int, unsigned, float
        raise TypeError(f"TrainLoop.collect_metrics(): {name!r} (got {describe(value)}) must "
                        "be a number, an array of numbers, a tensor or a torchmetrics Metric.")
    if array.size == 0:
        return None
    array = array.astype(np.float64, copy=False)
    return float(array) if array.ndim == 0 else torch.from_numpy(array)


def _moments_of(name: str, moments: Moments) -> Stats:
    """``{name: (mean, std)}`` of what `moments` saw (std None for a single value), or ``{}``
    when it saw nothing: a host read."""
    weight = moments.weight()
    if not weight > 0:
        return {}
    return {name: (float(moments.result()), float(moments.stddev()) if weight > 1 else None)}
