"""What a `TrainLoop` reports: collected metrics, log lines with an ETA, summaries, the best
validation metric and early stopping's parameters.

`LoopReporting` is the half of `TrainLoop` that watches the loops (the other half runs them:
counters, epochs and steps, checkpoints); it is not used on its own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from cadence.core.best import BestTracker
from cadence.core.callbacks import CallbackList, RunState
from cadence.core.eta import ETA
from cadence.core.logs import humanize_duration
from cadence.core.progress import Progress
from cadence.core.summary import SummaryManager
from cadence.engine.external_metrics import compute_metric, is_torchmetric
from cadence.tfsnippet.events import EventKeys, EventSource
from cadence.tfsnippet.formatting import (
    environment_lines,
    is_time_metric,
    parameter_summary,
)
from cadence.tfsnippet.metric_log import MetricLog
from cadence.tfsnippet.params import TrainedParameters
from cadence.tfsnippet.statistics import StatisticsCollector

logger = logging.getLogger("cadence")


class LoopReporting:
    """Metrics, log lines, ETA, summaries and the best validation metric of a `TrainLoop`."""

    # Set by TrainLoop.__init__.
    _entered: bool
    _exited: bool
    max_epoch: int | None
    max_step: int | None
    _progress: Progress
    _within_epoch: bool
    _within_step: bool
    _epoch_closed: bool
    _step_closed: bool
    _epoch_start: float
    _step_start: float
    _steps_in_epochs: int
    _committed: set[str]
    _clock: Callable[[], float]
    _print_func: Callable[[str], Any]
    _show_eta: bool
    _eta: ETA
    _log: MetricLog
    _best: BestTracker
    _best_params: dict[str, torch.Tensor] | None
    _best_flag: bool
    _early_stopping: bool
    _params: TrainedParameters
    _var_groups: list[str] | None
    _events: EventSource
    _callbacks: CallbackList
    _state: RunState
    _summary_writer: SummaryManager | None

    @property
    def epoch(self) -> int:
        """The epoch counter, from 1 (0 before the first epoch)."""
        return self._progress.epoch

    @property
    def step(self) -> int:
        """The global step counter, from 1 (0 before the first step): inside a step, the
        number of the step running."""
        return self._progress.global_step

    def _require_entered(self) -> None:
        if not self._entered or self._exited:
            raise RuntimeError("Use the TrainLoop inside its `with` block.")

    def _require_context(self, what: str) -> None:
        self._require_entered()
        if not (self._within_epoch or self._within_step):
            raise RuntimeError(f"{what} must be called inside an epoch or a step (in the body "
                               "of `for epoch in loop.iter_epochs()`).")

    def _sync_state(self) -> None:
        """Puts the counters where callbacks read them."""
        self._state.global_step = self._progress.global_step
        self._state.epoch = self._progress.epoch

    # ------------------------------------------------------------------ metrics

    def _collect_time(self, name: str, seconds: float) -> None:
        if self._within_epoch or self._within_step:
            self._log.collect(name, seconds, self._within_step)
        if self._events.has_handlers(EventKeys.TIME_METRICS_COLLECTED):
            self._events.fire(EventKeys.TIME_METRICS_COLLECTED, self, {name: seconds})

    def collect_metrics(self, metrics: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Adds metric values (numbers, arrays, or tensors: tensors stay on the device until the
        next `print_logs`). Collecting the validation metric updates the best value (one host
        read) and, with early stopping, remembers the parameters.

        A torchmetrics ``Metric`` (or ``MetricCollection``) is collected as itself: the print
        reads it with ``compute()`` (across ranks, by torchmetrics' own gathering) and, at the
        end of the epoch, resets it. Pass it in ``checkpoint_save_objects`` too for a
        checkpoint taken inside an epoch to hold its states.

        Raises:
            TypeError: if `metrics` is not a mapping.
            RuntimeError: outside an epoch or a step.
        """
        if metrics is not None and not isinstance(metrics, Mapping):
            raise TypeError(f"`metrics` (got {type(metrics).__name__}) must be a dict.")
        self._require_context("collect_metrics()")
        merged = {**(metrics or {}), **kwargs}
        for name, value in merged.items():
            self._log.collect(name, value, self._within_step)
        if self._events.has_handlers(EventKeys.METRICS_COLLECTED):
            self._events.fire(EventKeys.METRICS_COLLECTED, self, merged)
        if self._best.monitor in merged:
            self._update_valid_metric(merged[self._best.monitor])

    def _update_valid_metric(self, value: Any) -> None:
        if is_torchmetric(value):  # computed now (and again, from its cache, when printed)
            value = compute_metric(value)
        if isinstance(value, Mapping):
            raise TypeError(f"The validation metric {self._best.monitor!r} computes several "
                            f"values ({sorted(value)}); collect one of them under that name.")
        if isinstance(value, torch.Tensor):  # the one host read of the metric
            value = float(value.detach().double().mean())
        if not self._best.update(float(np.mean(value)), self.step):
            return
        self._best_flag = True
        if self._early_stopping:
            self._best_params = self._params.snapshot()

    def _restore_best_params(self, exc_type: Any) -> None:
        how = "" if exc_type is None else f" (leaving on {exc_type.__name__})"
        name = self._best.monitor
        if self._best_params is None:
            logger.warning("Early stopping: no best %s was recorded, so the parameters keep their "
                           "last values%s.", name, how)
            return
        self._params.restore(self._best_params)
        self.println(f"Restored the early-stopping parameters of step {self._best.best_step} "
                     f"({name} = {self._best.best:.6g}){how}.")

    @contextlib.contextmanager
    def timeit(self, metric_name: str) -> Iterator[None]:
        """Times the block and collects the duration as `metric_name` (which should end in
        ``time`` or ``timer`` to be shown as a duration).

        Raises:
            RuntimeError: outside an epoch or a step.
        """
        self._require_context("timeit()")
        start = self._clock()
        try:
            yield
        finally:
            self._collect_time(metric_name, self._clock() - start)

    @contextlib.contextmanager
    def metric_collector(self, metric_name: str) -> Iterator[StatisticsCollector]:
        """Yields a `StatisticsCollector`; its mean is collected as `metric_name` at the end.

        Raises:
            RuntimeError: outside an epoch or a step.
        """
        self._require_context("metric_collector()")
        collector = StatisticsCollector()
        yield collector
        if collector.has_value:
            self.collect_metrics({metric_name: collector.mean})

    def add_summary(self, summary: Mapping[str, Any]) -> None:
        """Writes ``{tag: value}`` summaries at the current step.

        Raises:
            RuntimeError: if the loop has no summary writer.
        """
        if self._summary_writer is None:
            raise RuntimeError("add_summary() needs a summary writer: pass summary_dir= or "
                               "summary_writer= to the TrainLoop.")
        self._summary_writer.write_summaries(dict(summary), step=self.step)
        self._events.fire(EventKeys.SUMMARY_ADDED, self, summary)

    # ------------------------------------------------------------------ progress

    def get_progress(self) -> float | None:
        """The fraction of training done, or None when no limit says.

        With `max_step`: finished steps / `max_step`. With only `max_epoch`: finished steps /
        (`max_epoch` x the mean steps of a finished epoch); before an epoch has finished,
        finished epochs / `max_epoch`. The running step (or epoch) counts as finished once
        `print_logs` closed it, so a log line's ETA includes what it reports.
        """
        step_done = not self._within_step or self._step_closed
        done = self.step if step_done else self.step - 1
        if self.max_step is not None:
            return min(max(done / self.max_step, 0.0), 1.0) if self.max_step else None
        if self.max_epoch is not None:
            if not self.max_epoch:
                return None
            epoch_done = not self._within_epoch or self._epoch_closed
            finished = self.epoch if epoch_done else self.epoch - 1
            steps_finished = self._steps_in_epochs - (
                0 if epoch_done else self._progress.epoch_step)
            if finished > 0 and steps_finished > 0:
                per_epoch = steps_finished / finished
                return min(max(done / (self.max_epoch * per_epoch), 0.0), 1.0)
            return min(finished / self.max_epoch, 1.0)
        return None

    def get_eta(self) -> float | None:
        """Seconds left, from the average rate since the loop started (or resumed); None when
        it cannot be estimated yet."""
        progress = self.get_progress()
        if progress is None:
            return None
        if not self._eta.started:
            self._eta.start(progress, self._clock())
            return None
        return self._eta.estimate(progress, 1.0, self._clock())

    # ------------------------------------------------------------------ printing

    def println(self, message: str, with_tag: bool = False) -> None:
        """Prints `message` with `print_func`, after the ``[Epoch, Step, ETA]`` tag if asked.

        Raises:
            RuntimeError: for `with_tag` outside an epoch or a step (the tag names them).
        """
        if with_tag:
            self._require_context("println(with_tag=True)")
        self._print_func(f"{self._tag()} {message}" if with_tag else message)

    def _tag(self) -> str:
        parts = []
        if self.max_epoch != 1:
            parts.append(f"Epoch {self.epoch}" + (f"/{self.max_epoch}" if self.max_epoch else ""))
        parts.append(f"Step {self.step}" + (f"/{self.max_step}" if self.max_step else ""))
        if self._show_eta:
            eta = self.get_eta()
            if eta is not None:
                parts.append(f"ETA {humanize_duration(eta)}")
        return f"[{', '.join(parts)}]"

    def print_logs(self) -> None:
        """Prints the metrics since the last print (the step's inside a step, else the epoch's)
        as ``mean (±std)``, writes their means as summaries, and clears them.

        Raises:
            RuntimeError: outside an epoch or a step.
        """
        self._require_context("print_logs()")
        # The print closes the step (or the epoch): its time is committed now, and the ETA of
        # this line counts it as finished.
        if self._within_step:
            self._collect_time("step_time", self._clock() - self._step_start)
            self._committed.add("step_time")
            self._step_closed = True
        else:
            self._collect_time("epoch_time", self._clock() - self._epoch_start)
            self._committed.add("epoch_time")
            self._epoch_closed = True
        stats = self._log.take(self._within_step)
        line = f"{self._tag()} {self._log.line(stats)}"
        if self._best_flag:
            line += " (*)"
            self._best_flag = False
        self._print_func(line)
        means = {n: m for n, (m, _) in stats.items()}
        self._log.write_summaries(self._summary_writer, means, self.step)
        metric_stats = {n: s for n, s in stats.items() if not is_time_metric(n)}
        time_stats = {n: s for n, s in stats.items() if is_time_metric(n)}
        if metric_stats:
            self._events.fire(EventKeys.METRIC_STATS_PRINTED, self, metric_stats)
        if time_stats:
            self._events.fire(EventKeys.TIME_METRIC_STATS_PRINTED, self, time_stats)
        self._sync_state()
        self._state.put_metrics(means)
        self._callbacks.fire("on_loop_end", self._state, means)

    def print_training_summary(self) -> None:
        """Prints the environment and a table of the trained parameters (name, shape, count) in
        the order of ``param_vars``, one per group of `var_groups` with its total, and -- with
        groups -- the grand total (tfsnippet's ``summarize_variables``)."""
        lines = environment_lines() + parameter_summary(self._params.named(), self._var_groups)
        self._print_func("\n".join(lines).rstrip())
