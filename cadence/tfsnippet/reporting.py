"""`LoopReport`: what a `TrainLoop` reports -- collected metrics, log lines with an ETA,
summaries, the best validation metric and early stopping's parameters.

The `TrainLoop` runs the loops (counters, epochs and steps, data, checkpoints) and holds one
`LoopReport`, which watches them: the loop tells it when the ``with`` block, an epoch or a step
begins and ends, and the loop's public reporting methods (`collect_metrics`, `print_logs`,
`timeit`, `get_eta`, ...) are the report's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from cadence.core.best import BestTracker
from cadence.core.clock import RunClock
from cadence.core.eta import ETA
from cadence.core.logs import humanize_duration
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


class LoopReport:
    """Collects a loop's metrics and prints them as ``mean (±std)`` after an ``[Epoch, Step,
    ETA]`` tag, writes them as summaries, times epochs and steps (``epoch_time``,
    ``step_time``), estimates the progress and the time left, keeps the best validation metric
    and -- with early stopping -- the parameters that reached it.

    It reads the counters of `run_clock` and is told the rest by its owner: `start` and
    `finish` bound the run, `begin_epoch` / `end_epoch` and `begin_step` / `end_step` each epoch
    and step, `end_step_loop` / `end_epoch_loop` the loops (which forget what is unprinted).
    Its reporting methods work between `start` and `finish`, inside an epoch or a step.

    Args:
        run_clock: the loop's clock: its ``progress`` holds the counters (and whether an
            epoch is open), its ``step_open`` whether a step is, its ``max_epoch`` and
            ``max_step`` the limits; a print puts its metrics in the clock's ``state`` and fires
            its ``callbacks``' ``on_loop_end``.
        log: collects the metrics, and formats and writes them when printed.
        best: the validation metric (its ``monitor``) and its best value.
        params: the trained parameters: listed by `print_training_summary`, kept at their best
            with early stopping.
        events: fires the metric events (``METRICS_COLLECTED``, ...).
        source: what the events' handlers receive first (the `TrainLoop`).
        summary_writer: returns where summaries go now (None: nowhere).
        print_func: where lines go.
        clock: the time source, in seconds.
        show_eta: put the ETA in the tag.
        var_groups: name prefixes that split the parameter table into groups.
        early_stopping: keep the best parameters, and restore them at `finish`.
    """

    def __init__(self, run_clock: RunClock, log: MetricLog, best: BestTracker,
                 params: TrainedParameters, events: EventSource, source: Any,
                 summary_writer: Callable[[], SummaryManager | None],
                 print_func: Callable[[str], Any], clock: Callable[[], float], *,
                 show_eta: bool = True, var_groups: Sequence[str] | None = None,
                 early_stopping: bool = False) -> None:
        self.best = best
        self.early_stopping = early_stopping
        self.steps_in_epochs = 0
        """Steps taken inside epochs (saved: the steps of an epoch in `get_progress`)."""
        self._run_clock = run_clock
        self._progress = run_clock.progress
        self._log = log
        self._params = params
        self._events = events
        self._metrics_listeners = events.handlers(EventKeys.METRICS_COLLECTED)
        self._time_listeners = events.handlers(EventKeys.TIME_METRICS_COLLECTED)
        """Live lists (`EventSource.handlers`): a collect fires only when one is not empty."""
        self._source = source
        self._summary_writer = summary_writer
        self._print_func = print_func
        self._clock = clock
        self._show_eta = show_eta
        self._var_groups = list(var_groups) if var_groups is not None else None
        self._eta = ETA()
        self._running = False
        self._best_params: dict[str, torch.Tensor] | None = None
        self._best_flag = False  # a new best since the last print: the line gets "(*)"
        self._epoch_start = self._step_start = 0.0
        # Closed by print_logs: its time is collected, and get_progress counts it as done.
        self._epoch_closed = self._step_closed = False

    # ------------------------------------------------------------------ what the loop tells

    def start(self) -> None:
        """The run starts (or resumes): reporting is allowed, and the ETA counts from now."""
        self._running = True
        progress = self.get_progress()
        if progress is not None:
            self._eta.start(progress, self._clock())

    def finish(self, exc_type: type[BaseException] | None = None) -> None:
        """The run ends (`exc_type`: how): with early stopping, the best parameters are
        restored."""
        self._running = False
        if self.early_stopping:
            self._restore_best_params(exc_type)

    def begin_epoch(self) -> None:
        """An epoch is about to open: its time starts."""
        self._epoch_closed = False
        self._epoch_start = self._clock()

    def end_epoch(self) -> None:
        """The open epoch ends: its ``epoch_time`` is collected, unless a print closed it."""
        if not self._epoch_closed:
            self._collect_time("epoch_time", self._clock() - self._epoch_start)

    def begin_step(self) -> None:
        """A step was counted and opened: its time starts."""
        self.steps_in_epochs += 1
        self._step_closed = False
        self._step_start = self._clock()

    def end_step(self) -> None:
        """The open step ends: its ``step_time`` is collected, unless a print closed it."""
        if not self._step_closed:
            self._collect_time("step_time", self._clock() - self._step_start, within_step=True)

    def end_step_loop(self) -> None:
        """A step loop ended: what its steps collected and did not print stays in the epoch's
        statistics only."""
        self._log.clear_step()

    def end_epoch_loop(self) -> None:
        """The epoch loop ended: everything unprinted is forgotten."""
        self._log.clear()
        self._best_flag = False

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The steps in epochs, the best metric and the early-stopping parameters."""
        return {"steps_in_epochs": self.steps_in_epochs, "best": self.best.state_dict(),
                "best_params": self._best_params}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps_in_epochs = int(state.get("steps_in_epochs", 0))
        self.best.load_state_dict(state["best"])
        self._best_params = state["best_params"]

    # ------------------------------------------------------------------ metrics

    def _require_context(self, what: str) -> None:
        if not self._running:
            raise RuntimeError("Use the TrainLoop inside its `with` block.")
        if not (self._progress.epoch_open or self._run_clock.step_open):
            raise RuntimeError(f"{what} must be called inside an epoch or a step (in the body "
                               "of `for epoch in loop.iter_epochs()`).")

    def _collect_time(self, name: str, seconds: float, within_step: bool | None = None) -> None:
        if within_step is None:
            within_step = self._run_clock.step_open
        if within_step or self._progress.epoch_open:
            self._log.collect(name, seconds, within_step)
        if self._time_listeners:
            self._events.fire(EventKeys.TIME_METRICS_COLLECTED, self._source, {name: seconds})

    def collect_metrics(self, metrics: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Adds metric values (`cadence.tfsnippet.TrainLoop.collect_metrics` says how).

        Raises:
            TypeError: if `metrics` is not a mapping, or a value is not a number, an array of
                numbers, a tensor or a torchmetrics metric (a string, a dict, None), naming it.
            RuntimeError: outside an epoch or a step.
        """
        if metrics is not None and not isinstance(metrics, Mapping):
            raise TypeError(f"`metrics` (got {type(metrics).__name__}) must be a dict.")
        within_step = self._run_clock.step_open
        if not (self._running and (within_step or self._progress.epoch_open)):
            self._require_context("collect_metrics()")  # raises: inlined on the per-step path
        merged = {**(metrics or {}), **kwargs}
        collect = self._log.collect
        for name, value in merged.items():
            collect(name, value, within_step)
        if self._metrics_listeners:
            self._events.fire(EventKeys.METRICS_COLLECTED, self._source, merged)
        if self.best.monitor in merged:
            self._update_valid_metric(merged[self.best.monitor])

    def _update_valid_metric(self, value: Any) -> None:
        if is_torchmetric(value):  # computed now (and again, from its cache, when printed)
            value = compute_metric(value)
        if isinstance(value, Mapping):
            raise TypeError(f"The validation metric {self.best.monitor!r} computes several "
                            f"values ({sorted(value)}); collect one of them under that name.")
        if isinstance(value, torch.Tensor):  # the one host read of the metric
            value = float(value.detach().double().mean())
        if not self.best.update(float(np.mean(value)), self._progress.steps_taken):
            return
        self._best_flag = True
        if self.early_stopping:
            self._best_params = self._params.snapshot()

    def _restore_best_params(self, exc_type: type[BaseException] | None) -> None:
        how = "" if exc_type is None else f" (leaving on {exc_type.__name__})"
        name = self.best.monitor
        if self._best_params is None:
            logger.warning("Early stopping: no best %s was recorded, so the parameters keep their "
                           "last values%s.", name, how)
            return
        self._params.restore(self._best_params)
        self.println(f"Restored the early-stopping parameters of step {self.best.best_step} "
                     f"({name} = {self.best.best:.6g}){how}.")

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
            RuntimeError: without a summary writer.
        """
        writer = self._summary_writer()
        if writer is None:
            raise RuntimeError("add_summary() needs a summary writer: pass summary_dir= or "
                               "summary_writer= to the TrainLoop.")
        writer.write_summaries(dict(summary), step=self._progress.steps_taken)
        self._events.fire(EventKeys.SUMMARY_ADDED, self._source, summary)

    # ------------------------------------------------------------------ progress

    def get_progress(self) -> float | None:
        """The fraction of training done, or None when no limit says.

        With `max_step`: finished steps / `max_step`. With only `max_epoch`: finished steps /
        (`max_epoch` x the mean steps of a finished epoch); before an epoch has finished,
        finished epochs / `max_epoch`. The running step (or epoch) counts as finished once
        `print_logs` closed it, so a log line's ETA includes what it reports.
        """
        clock = self._run_clock
        progress, max_epoch, max_step = self._progress, clock.max_epoch, clock.max_step
        step_done = not clock.step_open or self._step_closed
        done = progress.steps_taken if step_done else progress.global_step
        if max_step is not None:
            return min(max(done / max_step, 0.0), 1.0) if max_step else None
        if max_epoch is not None:
            if not max_epoch:
                return None
            epoch_done = not progress.epoch_open or self._epoch_closed
            finished = progress.epoch if epoch_done else progress.epoch - 1
            steps_finished = self.steps_in_epochs - (
                0 if epoch_done else progress.epoch_step + progress.step_running)
            if finished > 0 and steps_finished > 0:
                per_epoch = steps_finished / finished
                return min(max(done / (max_epoch * per_epoch), 0.0), 1.0)
            return min(finished / max_epoch, 1.0)
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
        clock = self._run_clock
        progress, max_epoch, max_step = self._progress, clock.max_epoch, clock.max_step
        parts = []
        if max_epoch != 1:
            parts.append(f"Epoch {progress.epoch}" + (f"/{max_epoch}" if max_epoch else ""))
        parts.append(f"Step {progress.steps_taken}" + (f"/{max_step}" if max_step else ""))
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
        # The print closes the step (or the epoch): its time is collected now, and the ETA of
        # this line counts it as finished.
        within_step = self._run_clock.step_open
        if within_step:
            self._collect_time("step_time", self._clock() - self._step_start)
            self._step_closed = True
        else:
            self._collect_time("epoch_time", self._clock() - self._epoch_start)
            self._epoch_closed = True
        stats = self._log.take(within_step)
        line = f"{self._tag()} {self._log.line(stats)}"
        if self._best_flag:
            line += " (*)"
            self._best_flag = False
        self._print_func(line)
        means = {n: m for n, (m, _) in stats.items()}
        self._log.write_summaries(self._summary_writer(), means, self._progress.steps_taken)
        metric_stats = {n: s for n, s in stats.items() if not is_time_metric(n)}
        time_stats = {n: s for n, s in stats.items() if is_time_metric(n)}
        if metric_stats:
            self._events.fire(EventKeys.METRIC_STATS_PRINTED, self._source, metric_stats)
        if time_stats:
            self._events.fire(EventKeys.TIME_METRIC_STATS_PRINTED, self._source, time_stats)
        run_clock = self._run_clock
        run_clock.state.put_metrics(means)
        run_clock.callbacks.fire("on_loop_end", run_clock.state, means)

    def print_training_summary(self) -> None:
        """Prints the environment and a table of the trained parameters (name, shape, count) in
        the order of ``param_vars``, one per group of `var_groups` with its total, and -- with
        groups -- the grand total (tfsnippet's ``summarize_variables``)."""
        lines = environment_lines() + parameter_summary(self._params.named(), self._var_groups)
        self._print_func("\n".join(lines).rstrip())
