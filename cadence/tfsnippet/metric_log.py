"""`MetricLog`: what a `TrainLoop` collected since its last print, and where it goes when printed.

Metrics are collected per epoch and, inside a step, per step too; each name has a
`StatisticsCollector` (tensors stay on their device). A print turns them into ``mean (±std)``
text and writes the means as summaries -- skipping durations by default, and writing a metric
only every k-th time when asked -- then forgets them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from cadence.core.summary import SummaryManager
from cadence.tfsnippet.formatting import DefaultMetricFormatter, format_stats
from cadence.tfsnippet.statistics import StatisticsCollector

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
        self.epoch: dict[str, StatisticsCollector] = {}
        self.step: dict[str, StatisticsCollector] = {}

    def collect(self, name: str, value: Any, within_step: bool) -> None:
        """Adds a value to the epoch's collector of `name`, and to the step's inside a step."""
        for metrics in (self.epoch, self.step) if within_step else (self.epoch,):
            collector = metrics.get(name)  # per step: no collector is built unless it is new
            if collector is None:
                collector = metrics[name] = StatisticsCollector()
            collector.collect(value)

    def take(self, within_step: bool) -> Stats:
        """The statistics of the step's (inside a step) or the epoch's metrics, which are then
        forgotten (a host read of each)."""
        collectors = self.step if within_step else self.epoch
        stats = {name: (c.mean, c.stddev if c.weight_sum > 1 else None)
                 for name, c in collectors.items() if c.has_value}
        collectors.clear()
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

    def clear(self) -> None:
        """Forgets everything collected."""
        self.epoch.clear()
        self.step.clear()
