"""`TrainLoop` (seed 004): tfsnippet's imperative loop helper, built from the engine's parts.

You write the loops; the `TrainLoop` keeps the counters, times epochs and steps, collects metrics
(mean ± std since the last print), prints log lines with an ETA, writes TensorBoard summaries,
checkpoints (atomically, with the data position and random state), tracks the best validation
metric, and restores the best parameters when early stopping is on::

    with cadence.TrainLoop(model, max_epoch=10, early_stopping=True,
                           checkpoint_dir="runs/loop", checkpoint_epoch_freq=1) as loop:
        loop.print_training_summary()
        for epoch in loop.iter_epochs():
            for step, (x, y) in loop.iter_steps(train_flow):
                loss = train_step(x, y)
                loop.collect_metrics(loss=loss)        # a tensor: no host sync until printing
            with loop.timeit("valid_time"):
                loop.collect_metrics(valid_loss=evaluate())
            loop.print_logs()

It is the engine's parts behind tfsnippet's API: the counters are a `cadence.core.clock.RunClock`
(the numbers every front-end's callbacks see), the reporting a
`cadence.tfsnippet.reporting.LoopReport`, checkpoints a
`cadence.tfsnippet.checkpoints.LoopCheckpoints`, summaries a `cadence.SummaryManager`, signals a
`cadence.core.preemption.Preemption`; `cadence.Callback` objects work as in every front-end
(``on_loop_end`` is a print). Where it differs from tfsnippet
on purpose (events that fire, checkpoints that resume mid-epoch, best parameters restored on
every exit, summaries written when printed, 5 checkpoints kept by default), ``docs/callbacks.md``
says why.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cadence.core.arguments import (
    check_bool,
    check_callable,
    check_items,
    check_mapping,
    check_path,
    check_str,
)
from cadence.core.best import BestTracker
from cadence.core.callbacks import Callback, CallbackList, RunState
from cadence.core.checkpoint_dir import DEFAULT_MAX_TO_KEEP
from cadence.core.clock import RunClock
from cadence.core.hook_checks import describe
from cadence.core.intervals import check_int
from cadence.core.notebook import show_log_lines
from cadence.core.preemption import Preemption
from cadence.core.progress import Progress
from cadence.core.rank import is_chief
from cadence.core.run_dir import RunDirectory
from cadence.core.summary import (
    DEFAULT_WRITERS,
    SummaryManager,
    WriterSpec,
    check_writers,
    closing_summaries,
    import_writer,
)
from cadence.data.iterator import DataIterator
from cadence.engine.checkpoint import CheckpointManager
from cadence.engine.runtime import is_distributed
from cadence.engine.stop_agreement import StopAgreement
from cadence.records.run_record import RunRecord
from cadence.tfsnippet.checkpoints import LoopCheckpoints
from cadence.tfsnippet.events import EventKeys, EventSource
from cadence.tfsnippet.formatting import DefaultMetricFormatter
from cadence.tfsnippet.metric_log import MetricLog
from cadence.tfsnippet.params import TrainedParameters
from cadence.tfsnippet.reporting import LoopReport
from cadence.tfsnippet.statistics import StatisticsCollector


def _check_arguments(max_epoch: Any, max_step: Any, checkpoint_dir: Any,
                     checkpoint_epoch_freq: Any, checkpoint_max_to_keep: Any,
                     checkpoint_save_objects: Any, summary_commit_freqs: Any,
                     early_stopping: Any) -> tuple[Any, Any, Any, Any]:
    """Refuses `TrainLoop` arguments that cannot work, before anything is made (see the
    class's Raises); returns ``(max_epoch, max_step, checkpoint_epoch_freq,
    checkpoint_max_to_keep)`` as plain ints (or None)."""
    counts = (
        check_int("TrainLoop", "max_epoch", max_epoch, "Pass the last epoch to train, e.g. "
                  "max_epoch=10, or None for no limit.", none_ok=True),
        check_int("TrainLoop", "max_step", max_step, "Pass the last global step to train, e.g. "
                  "max_step=1000, or None for no limit.", none_ok=True),
        check_int("TrainLoop", "checkpoint_epoch_freq", checkpoint_epoch_freq,
                  "Pass how many epochs apart to checkpoint, e.g. checkpoint_epoch_freq=1, or "
                  "None to checkpoint only with make_checkpoint().", none_ok=True),
        check_int("TrainLoop", "checkpoint_max_to_keep", checkpoint_max_to_keep,
                  "Pass how many checkpoints to keep, e.g. checkpoint_max_to_keep=5, or None to "
                  "keep all.", minimum=0, none_ok=True))
    for metric, freq in (summary_commit_freqs or {}).items():
        check_int("TrainLoop", f"summary_commit_freqs[{metric!r}]", freq,
                  f"Pass how many prints apart to write {metric!r}, e.g. "
                  f"summary_commit_freqs={{{metric!r}: 2}}; 1 writes it at every print.")
    if not isinstance(early_stopping, bool):
        raise TypeError(
            f"TrainLoop: `early_stopping` (got {early_stopping!r}) must be True or False: "
            "it keeps the best parameters and restores them on exit, and has no patience. "
            "To stop after epochs without improvement, add the callback "
            "cadence.callbacks.EarlyStopping(monitor, patience=...) instead.")
    if checkpoint_dir is None and (checkpoint_epoch_freq or checkpoint_save_objects):
        raise ValueError("`checkpoint_epoch_freq` and `checkpoint_save_objects` need a "
                         "`checkpoint_dir`.")
    return counts


def _check_kinds(*, var_groups: Any, show_eta: Any, print_func: Any, checkpoint_dir: Any,
                 checkpoint_save_objects: Any, restore_checkpoint: Any, summary_dir: Any,
                 summary_writer: Any, summary_commit_freqs: Any, valid_metric_name: Any,
                 valid_metric_smaller_is_better: Any, callbacks: Any, clock: Any,
                 handle_signals: Any) -> list[Callback]:
    """Refuses `TrainLoop` arguments of the wrong kind, before anything is made, naming each
    and what it must be; returns the callbacks as a list.

    Raises:
        TypeError: for an argument of the wrong kind.
    """
    owner = "TrainLoop"
    if var_groups is not None:
        check_items(owner, "var_groups", var_groups, "a list of name prefixes",
                    "e.g. var_groups=['encoder', 'decoder']", lambda one: isinstance(one, str))
    check_bool(owner, "show_eta", show_eta, "e.g. show_eta=False")
    check_callable(owner, "print_func", print_func, "e.g. print_func=logging.info")
    check_path(owner, "checkpoint_dir", checkpoint_dir, "e.g. checkpoint_dir='runs/loop'",
               none_ok=True)
    check_mapping(owner, "checkpoint_save_objects", checkpoint_save_objects,
                  "e.g. checkpoint_save_objects={'optimizer': optimizer}", none_ok=True)
    if not isinstance(restore_checkpoint, bool):
        check_path(owner, "restore_checkpoint", restore_checkpoint,
                   "True (the newest checkpoint), False, or a checkpoint's path")
    check_path(owner, "summary_dir", summary_dir, "e.g. summary_dir='runs/loop/train'",
               none_ok=True)
    if summary_writer is not None and not callable(getattr(summary_writer, "write_summaries",
                                                           None)):
        raise TypeError(f"{owner}: `summary_writer` (got {describe(summary_writer)}) must be a "
                        "cadence.SummaryManager or None; to write into a directory, pass "
                        "summary_dir instead.")
    check_mapping(owner, "summary_commit_freqs", summary_commit_freqs,
                  "e.g. summary_commit_freqs={'loss': 10}", none_ok=True)
    check_str(owner, "valid_metric_name", valid_metric_name, "e.g. valid_metric_name='valid_loss'")
    check_bool(owner, "valid_metric_smaller_is_better", valid_metric_smaller_is_better,
               "e.g. valid_metric_smaller_is_better=False (None: from the metric's name)",
               none_ok=True)
    checked = check_items(owner, "callbacks", callbacks, "a list of cadence.Callback objects",
                          "e.g. callbacks=[cadence.callbacks.EarlyStopping('valid_loss')]",
                          lambda one: isinstance(one, Callback))
    check_callable(owner, "clock", clock, "e.g. clock=time.perf_counter")
    check_bool(owner, "handle_signals", handle_signals, "e.g. handle_signals=False")
    return checked


class EpochPaused(BaseException):
    """Leaves the body of an epoch that a pause cut short (a signal, a time limit): the rest of
    the body -- its validation, its log line -- belongs to the run that continues the epoch,
    as in an uninterrupted run. Raised by `TrainLoop.iter_steps` and ended by the ``with``
    block, which saves a checkpoint (then raises `cadence.Preempted` after a signal). A
    `BaseException`, as ``KeyboardInterrupt`` is: a body's ``except Exception`` lets it pass."""


class TrainLoop:
    """A context manager that keeps the bookkeeping of a hand-written training loop.

    It runs the loops (counters, epochs, steps, data, checkpoints); its metrics, log lines, ETA,
    summaries and best validation metric are its `cadence.tfsnippet.reporting.LoopReport`'s.

    Args:
        param_vars: what is trained: parameters, ``nn.Module`` objects or a `cadence.Module`
            (or a list or dict of them). Saved in checkpoints; early stopping keeps the best
            values of their parameters; `print_training_summary` lists them.
        var_groups: name prefixes that split the parameter table into groups.
        show_eta: put the ETA in log lines.
        print_func: where log lines go.
        max_epoch: the last epoch (None: unlimited). Settable while running.
        max_step: the last global step (None: unlimited). Settable while running.
        metric_formatter: orders and formats metrics in log lines.
        checkpoint_dir: enables checkpoints (`make_checkpoint`, `checkpoint_epoch_freq`); it is
            the run's directory too: inside the ``with`` block the loop holds its lock
            (``train.lock``: a second trainer there is refused) and records the run's timeline
            (``cadence goodput DIR``) and where it resumed (``resumes.jsonl``, ``cadence
            plot``).
        checkpoint_epoch_freq: checkpoint after every this many epochs.
        checkpoint_max_to_keep: checkpoints to keep (None or 0: all).
        checkpoint_save_objects: more stateful objects to save, by name (optimizers,
            schedulers, ...).
        restore_checkpoint: True resumes from the newest checkpoint in `checkpoint_dir`; a path
            restores that checkpoint; False starts afresh (and still saves).
        summary_dir: write summaries here (TensorBoard and JSON lines; see `writers`).
        summary_writer: a `SummaryManager` to write to instead (not closed by the loop).
        summary_metric_prefix: prefix of metric summary tags.
        summary_skip_pattern: metrics whose names match are not written (durations by default).
        summary_commit_freqs: ``{metric: k}``: write that metric only every k-th time.
        valid_metric_name: the validation metric that decides "best".
        valid_metric_smaller_is_better: its direction; None infers it from the name.
        early_stopping: keep the best parameters and restore them on exit.
        callbacks: `cadence.Callback` objects (see the module docstring).
        clock: the time source, in seconds (tests pass a fake one).
        handle_signals: inside the ``with`` block, SIGTERM and Ctrl-C end the loops after the
            current step (the epoch then ends as usual); on leaving the block a checkpoint is
            saved (with a `checkpoint_dir`) and `cadence.Preempted` is raised.
        writers: the metric writers of `summary_dir`: names (``tensorboard``, ``jsonl``,
            ``csv``, ``mlflow``, ``wandb``) or functions of a directory (see
            ``docs/writers.md``); MLflow and W&B keep their run in `summary_dir`.

    Raises:
        ValueError: for a `max_epoch`, `max_step`, `checkpoint_epoch_freq` or a
            `summary_commit_freqs` value that is not a positive int (None allowed but for the
            frequencies of `summary_commit_freqs`), a `checkpoint_max_to_keep` that is not a
            non-negative int or None, checkpoint options without a `checkpoint_dir`, or an
            unknown writer.
        TypeError: for an `early_stopping` that is not a bool (it has no patience), or another
            argument of the wrong kind (a `checkpoint_dir` that is not a path, a `print_func`
            that cannot be called, ...): the message names it and what it must be.
        KeyError: if `checkpoint_save_objects` uses a reserved name.
    """

    def __init__(
        self,
        param_vars: Any,
        var_groups: Sequence[str] | None = None,
        show_eta: bool = True,
        print_func: Callable[[str], Any] = print,
        max_epoch: int | None = None,
        max_step: int | None = None,
        metric_formatter: DefaultMetricFormatter | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_epoch_freq: int | None = None,
        checkpoint_max_to_keep: int | None = DEFAULT_MAX_TO_KEEP,
        checkpoint_save_objects: Mapping[str, Any] | None = None,
        restore_checkpoint: bool | str | Path = True,
        summary_dir: str | Path | None = None,
        summary_writer: SummaryManager | None = None,
        summary_metric_prefix: str = "metrics/",
        summary_skip_pattern: re.Pattern[str] | str | None = re.compile(r".*(time|timer)$"),
        summary_commit_freqs: Mapping[str, int] | None = None,
        valid_metric_name: str = "valid_loss",
        valid_metric_smaller_is_better: bool | None = None,
        early_stopping: bool = False,
        callbacks: Iterable[Callback] = (),
        clock: Callable[[], float] = time.perf_counter,
        handle_signals: bool = True,
        writers: Sequence[WriterSpec] = DEFAULT_WRITERS,
    ) -> None:
        callbacks = _check_kinds(
            var_groups=var_groups, show_eta=show_eta, print_func=print_func,
            checkpoint_dir=checkpoint_dir, checkpoint_save_objects=checkpoint_save_objects,
            restore_checkpoint=restore_checkpoint, summary_dir=summary_dir,
            summary_writer=summary_writer, summary_commit_freqs=summary_commit_freqs,
            valid_metric_name=valid_metric_name,
            valid_metric_smaller_is_better=valid_metric_smaller_is_better, callbacks=callbacks,
            clock=clock, handle_signals=handle_signals)
        max_epoch, max_step, checkpoint_epoch_freq, checkpoint_max_to_keep = _check_arguments(
            max_epoch, max_step, checkpoint_dir, checkpoint_epoch_freq, checkpoint_max_to_keep,
            checkpoint_save_objects, summary_commit_freqs, early_stopping)
        self._checkpoints = LoopCheckpoints(checkpoint_dir, checkpoint_max_to_keep,
                                            checkpoint_save_objects, restore_checkpoint)
        self._checkpoint_epoch_freq = checkpoint_epoch_freq
        self._param_vars = param_vars
        self._optimizer = (checkpoint_save_objects or {}).get("optimizer")
        self._params = TrainedParameters(param_vars)
        self._var_groups = list(var_groups) if var_groups is not None else None
        self._summary_dir = summary_dir
        self._summary_writer = summary_writer
        self._own_writer = summary_writer is None and summary_dir is not None
        self._writers = check_writers(writers)
        if self._own_writer and is_chief():
            import_writer(self._writers)  # at construction: not inside the first epoch
        self._callbacks = CallbackList(callbacks)
        self._events = EventSource(EventKeys.all())

        self._progress = Progress()
        self._entered = self._exited = False
        self._step_data: Any = None
        self._data: DataIterator | None = None
        self._pending_data_state: dict[str, Any] | None = None
        self._state = RunState(progress=self._progress, trainer=self, controller=self)
        # Counts steps and epochs, keeps the limits and fires the hooks, as in every front-end.
        self._run_clock = RunClock(state=self._state, callbacks=self._callbacks,
                                   max_step=max_step, max_epoch=max_epoch)
        self._preemption = Preemption(handle_signals)
        self._signals = contextlib.ExitStack()
        self._record: RunRecord | None = None
        """The run's record, inside the ``with`` block of a loop with a `checkpoint_dir`."""
        self._loop_began: tuple[float, int, float] | None = None
        """Where the steps not yet in the timeline began: (time, global step, input wait)."""

        self._report = self._new_report(
            MetricLog(metric_formatter or DefaultMetricFormatter(), summary_metric_prefix,
                      re.compile(summary_skip_pattern) if isinstance(summary_skip_pattern, str)
                      else summary_skip_pattern, summary_commit_freqs or {}),
            valid_metric_name, valid_metric_smaller_is_better, print_func, clock, show_eta,
            early_stopping)

    def _new_report(self, log: MetricLog, valid_metric_name: str,
                    valid_metric_smaller_is_better: bool | None,
                    print_func: Callable[[str], Any], clock: Callable[[], float],
                    show_eta: bool, early_stopping: bool) -> LoopReport:
        """The loop's `LoopReport`: it reads the summary writer when used (opened on entering)."""
        mode = (None if valid_metric_smaller_is_better is None
                else "min" if valid_metric_smaller_is_better else "max")
        return LoopReport(self._run_clock, log, BestTracker(valid_metric_name, mode),
                          self._params, self._events, self, lambda: self._summary_writer,
                          print_func, clock, show_eta=show_eta, var_groups=self._var_groups,
                          early_stopping=early_stopping)

    # ------------------------------------------------------------------ properties

    @property
    def max_epoch(self) -> int | None:
        """The last epoch (None: unlimited). Settable while running."""
        return self._run_clock.max_epoch

    @max_epoch.setter
    def max_epoch(self, value: int | None) -> None:
        self._run_clock.max_epoch = check_int(
            "TrainLoop", "max_epoch", value, "Pass the last epoch to train, e.g. max_epoch=10, "
            "or None for no limit.", none_ok=True)

    @property
    def max_step(self) -> int | None:
        """The last global step (None: unlimited). Settable while running."""
        return self._run_clock.max_step

    @max_step.setter
    def max_step(self, value: int | None) -> None:
        self._run_clock.max_step = check_int(
            "TrainLoop", "max_step", value, "Pass the last global step to train, e.g. "
            "max_step=1000, or None for no limit.", none_ok=True)

    @property
    def epoch(self) -> int:
        """The epoch counter, from 1 (0 before the first epoch)."""
        return self._progress.epoch

    @property
    def step(self) -> int:
        """The global step counter, from 1 (0 before the first step): inside a step, the
        number of the step running."""
        return self._progress.steps_taken

    @property
    def param_vars(self) -> Any:
        """What is trained, as given."""
        return self._param_vars

    @property
    def var_groups(self) -> list[str] | None:
        """The name prefixes of the parameter table."""
        return self._var_groups

    @property
    def progress(self) -> Progress:
        """The step and epoch counters (what callbacks see in `RunState`)."""
        return self._progress

    # ------------------------------------------------------------------ what callbacks read
    # (`cadence.core.trainer_view.TrainerView`: a TrainLoop is the trainer its callbacks see)

    @property
    def global_step(self) -> int:
        """Completed steps, a step whose body runs counted (`step`)."""
        return self._progress.steps_taken

    @property
    def model(self) -> nn.Module | None:
        """`param_vars` when it is one ``nn.Module`` (what exports and early stopping read),
        else None."""
        return self._param_vars if isinstance(self._param_vars, nn.Module) else None

    @property
    def optimizer(self) -> Any:
        """The optimizer among `checkpoint_save_objects` (``"optimizer"``), else None."""
        return self._optimizer

    @property
    def train_iterator(self) -> DataIterator | None:
        """The iterator over the data of `iter_steps`, with its position (None before)."""
        return self._data

    @property
    def examples_per_step(self) -> int | None:
        """The batch size of the data of `iter_steps`, when it says."""
        return self._data.batch_size if self._data is not None else None

    @property
    def data_wait_s(self) -> float:
        """Seconds spent waiting for the batches of `iter_steps` so far."""
        return self._data.wait_s if self._data is not None else 0.0

    @property
    def trainable_variables(self) -> list[torch.Tensor]:
        """The trained parameters that require gradients."""
        return [p for p in self._params.named().values() if p.requires_grad]

    @property
    def logdir(self) -> None:
        """None: a TrainLoop writes where its arguments say (`checkpoint_dir`,
        `summary_dir`)."""
        return None

    @property
    def events(self) -> EventSource:
        """The `EventSource` that fires `EventKeys`."""
        return self._events

    @property
    def step_data(self) -> Any:
        """The batch of the current step (from `iter_steps`)."""
        return self._step_data

    @property
    def summary_writer(self) -> SummaryManager | None:
        """Where summaries go, if anywhere."""
        return self._summary_writer

    @property
    def use_early_stopping(self) -> bool:
        """Whether the best parameters are restored on exit."""
        return self._report.early_stopping

    @property
    def valid_metric_name(self) -> str:
        """The validation metric that decides "best"."""
        return self._report.best.monitor

    @property
    def valid_metric_smaller_is_better(self) -> bool:
        """Its direction."""
        return self._report.best.mode == "min"

    @property
    def best_valid_metric(self) -> float | None:
        """The best validation metric so far."""
        return self._report.best.best

    @property
    def within_epoch(self) -> bool:
        """Whether an epoch is open (from its ``BEFORE_EPOCH`` to its ``on_epoch_end``)."""
        return self._progress.epoch_open

    @property
    def within_step(self) -> bool:
        """Whether a step is open."""
        return self._run_clock.step_open

    @property
    def callbacks(self) -> CallbackList:
        """The callbacks, in order."""
        return self._callbacks

    @property
    def checkpoint_manager(self) -> CheckpointManager | None:
        """The manager of `checkpoint_dir` (inside the ``with`` block)."""
        return self._checkpoints.manager

    # ------------------------------------------------------------------ reporting (the report's)

    def collect_metrics(self, metrics: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Adds metric values (numbers, arrays, or tensors: tensors stay on the device until the
        next `print_logs`). Collecting the validation metric updates the best value (one host
        read) and, with early stopping, remembers the parameters.

        A torchmetrics ``Metric`` (or ``MetricCollection``) is collected as itself: the print
        reads it with ``compute()`` (across ranks, by torchmetrics' own gathering) and, at the
        end of the epoch, resets it. Pass it in ``checkpoint_save_objects`` too for a
        checkpoint taken inside an epoch to hold its states.

        Raises:
            TypeError: if `metrics` is not a mapping, or a value is not a number, an array of
                numbers, a tensor or a torchmetrics metric (a string, a dict, None), naming it.
            RuntimeError: outside an epoch or a step.
        """
        self._report.collect_metrics(metrics, **kwargs)

    def timeit(self, metric_name: str) -> contextlib.AbstractContextManager[None]:
        """Times the block and collects the duration as `metric_name` (which should end in
        ``time`` or ``timer`` to be shown as a duration).

        Raises:
            RuntimeError: outside an epoch or a step.
        """
        return self._report.timeit(metric_name)

    def metric_collector(
            self, metric_name: str) -> contextlib.AbstractContextManager[StatisticsCollector]:
        """Yields a `StatisticsCollector`; its mean is collected as `metric_name` at the end.

        Raises:
            RuntimeError: outside an epoch or a step.
        """
        return self._report.metric_collector(metric_name)

    def add_summary(self, summary: Mapping[str, Any]) -> None:
        """Writes ``{tag: value}`` summaries at the current step.

        Raises:
            RuntimeError: if the loop has no summary writer.
        """
        self._report.add_summary(summary)

    def get_progress(self) -> float | None:
        """The fraction of training done, or None when no limit says: finished steps /
        `max_step`, or else / (`max_epoch` x the mean steps of an epoch); a step (or epoch) that
        `print_logs` closed counts as finished (`LoopReport.get_progress` says more)."""
        return self._report.get_progress()

    def get_eta(self) -> float | None:
        """Seconds left, from the average rate since the loop started (or resumed); None when
        it cannot be estimated yet."""
        return self._report.get_eta()

    def println(self, message: str, with_tag: bool = False) -> None:
        """Prints `message` with `print_func`, after the ``[Epoch, Step, ETA]`` tag if asked.

        Raises:
            RuntimeError: for `with_tag` outside an epoch or a step (the tag names them).
        """
        self._report.println(message, with_tag)

    def print_logs(self) -> None:
        """Prints the metrics since the last print (the step's inside a step, else the epoch's)
        as ``mean (±std)``, writes their means as summaries, and clears them.

        Raises:
            RuntimeError: outside an epoch or a step.
        """
        self._report.print_logs()

    def print_training_summary(self) -> None:
        """Prints the environment and a table of the trained parameters (name, shape, count),
        one per group of `var_groups` (tfsnippet's ``summarize_variables``)."""
        self._report.print_training_summary()

    # ------------------------------------------------------------------ context

    def _require_entered(self) -> None:
        if not self._entered or self._exited:
            raise RuntimeError("Use the TrainLoop inside its `with` block.")

    def __enter__(self) -> TrainLoop:
        if self._entered:
            raise RuntimeError("A TrainLoop can be entered only once; create a new one.")
        self._entered = True
        show_log_lines()  # to the terminal, unless the user configured logging
        directory = self._checkpoints.directory
        if directory is not None:  # the run's directory: its lock, timeline and resumes
            self._record = RunRecord(directory).__enter__()
            self._preemption.on_signal = self._record.timeline.signal
        try:
            self._open_run()
        except BaseException as error:
            self._end_record(error)
            raise
        self._events.fire(EventKeys.ENTER_LOOP, self)
        self._callbacks.fire("on_train_begin", self._state)
        return self

    def _open_run(self) -> None:
        """The summaries, the checkpoint restored (recorded in the run's timeline, and as a
        resume for ``cadence plot``), the report's clock, the stop agreement, the signals."""
        if self._own_writer:
            self._summary_writer = SummaryManager(str(self._summary_dir), lambda: self.step,
                                                  writers=self._writers)
        record = self._record
        if record is not None:
            record.timeline.restore_begin()
        path = self._checkpoints.open({"loop": self, "callbacks": self._callbacks,
                                       **self._params.stateful()},
                                      on_commit=record.timeline.commit if record else None)
        if record is not None:
            record.timeline.restore_end(self.step, path)
            if path is not None and self.step > 0 and (self.max_step is None
                                                       or self.step < self.max_step):
                RunDirectory(record.run_dir).record_resume(self.step, path)
        if path is not None:
            self.println(f"Resume training: epoch {self.epoch}, step {self.step}, from "
                         f"checkpoint {path}")
        self._report.start()
        if is_distributed():  # a stop requested on one rank is taken by all at the same step
            self._run_clock.agreement = StopAgreement()
        self._signals.enter_context(self._preemption.watch(self._state))

    def _end_record(self, error: BaseException | None) -> None:
        """Records how the attempt ended (`error` None: finished) and releases the run."""
        record, self._record = self._record, None
        if record is not None:
            record.__exit__(type(error) if error is not None else None, error, None)

    def _record_loop(self) -> None:
        """Records the steps since the last record as one loop of the run's timeline (its wall
        time and input wait): at the end of each step loop, and before a checkpoint inside
        one -- never per step."""
        began, self._loop_began = self._loop_began, None
        if self._record is None or began is None:
            return
        started, step, waited = began
        self._record.timeline.loop_end(
            self.step, max(self.step - step, 0), time.perf_counter() - started,
            data_wait_s=max(self.data_wait_s - waited, 0.0))

    def _begin_recording(self) -> None:
        if self._record is not None:
            self._loop_began = (time.perf_counter(), self.step, self.data_wait_s)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        # How the run ends -- the exception leaving the block, or one raised here (`Preempted`
        # after a signal, a failed save) -- is the run's timeline's last record. An epoch
        # paused (`EpochPaused`) ends the block as a stop at the epoch's end would: saved, and
        # swallowed here (True) -- preempted where a signal paused it.
        ended = None if isinstance(exc, EpochPaused) else exc
        try:
            paused = self._leave(exc_type, exc)
        except BaseException as raised:
            ended = raised
            raise
        finally:
            self._end_record(ended)
        return paused

    def _leave(self, exc_type: Any, exc: Any) -> bool:
        # How the run ends -- the exception leaving the block, or one raised here (`Preempted`
        # after a signal, a failed save) -- reaches the summary writers the loop owns when they
        # close: MLflow's run status, W&B's exit code (`closing_summaries`).
        paused = exc_type is EpochPaused  # a pause in an epoch: not an error, and saved
        if paused:
            exc_type = exc = None
        writer = [self._summary_writer] if self._summary_writer is not None else []
        with closing_summaries(close=writer if self._own_writer else [],
                               flush=[] if self._own_writer else writer, error=exc):
            saved = None
            try:
                self._events.reverse_fire(EventKeys.EXIT_LOOP, self)
                self._state.error = exc
                self._callbacks.fire_teardown("on_train_end", self._state)
                self._state.error = None
                # A signal to any rank preempts all: every rank saves, as the ranks agreed.
                preempted = (self._preemption.agree(self._run_clock.agree) if exc_type is None
                             else False)
                if (preempted or paused) and self._checkpoints.manager is not None:
                    saved = self.make_checkpoint()
            finally:
                self._signals.close()
                self._exited = True
                self._run_clock.leave_step()  # a body that raised: its step ran
                self._run_clock.leave_epoch()
                self._data = None  # ends the data's running pass: a DataFlow is not reentrant
                self._report.finish(exc_type)
            if exc_type is None:
                self._preemption.finish(lambda: saved)
        return paused

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The loop's counters, best metric, early-stopping parameters and data position.

        Saved inside a step, the step counts as done; inside an epoch, the epoch is resumed."""
        return {
            "progress": self._progress.state_dict(),
            **self._report.state_dict(),  # steps_in_epochs, best, best_params
            "data": self._data.state_dict() if self._data is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._progress.load_state_dict(state["progress"])
        self._report.load_state_dict(state)
        self._pending_data_state = state["data"]
        self._data = None

    # ------------------------------------------------------------------ loops

    def iter_epochs(self) -> Iterator[int]:
        """Yields the epoch counter (from 1) until `max_epoch` or `max_step` is reached, or a
        callback requests a stop. A checkpoint taken inside an epoch resumes that epoch.

        Raises:
            RuntimeError: outside the ``with`` block, or inside another epoch loop.
        """
        self._require_entered()
        progress, clock = self._progress, self._run_clock
        if progress.epoch_open:
            raise RuntimeError("iter_epochs() is already running; epoch loops do not nest.")
        try:
            while clock.begin_epoch(announce=self._epoch_beginning):
                yield progress.epoch
                clock.end_epoch(announce=self._epoch_ending)
                # an epoch-end callback's stop, on every rank (the decision, not the flag: a
                # signal may set it on this rank alone after the agreement)
                clock.agree_to_stop()
                if (self._checkpoint_epoch_freq is not None and progress.epoch_finished
                        and progress.epoch % self._checkpoint_epoch_freq == 0):
                    self.make_checkpoint()
        finally:
            clock.leave_epoch()  # a body that breaks or raises: no end hooks
            self._report.end_epoch_loop()

    def _epoch_beginning(self) -> None:
        """tfsnippet's epoch start: the epoch's time starts, then ``BEFORE_EPOCH``."""
        self._report.begin_epoch()
        self._events.fire(EventKeys.BEFORE_EPOCH, self)

    def _epoch_ending(self) -> None:
        """tfsnippet's epoch end: ``AFTER_EPOCH`` (reversed), then ``epoch_time``."""
        self._events.reverse_fire(EventKeys.AFTER_EPOCH, self)
        self._report.end_epoch()

    def _data_iterator(self, data: Any) -> DataIterator:
        if self._data is None or self._data.source is not data:
            self._data = DataIterator(data)
            if self._pending_data_state is not None:
                self._data.load_state_dict(self._pending_data_state)
                self._pending_data_state = None
        return self._data

    def iter_steps(self, data_generator: Any = None) -> Iterator[Any]:
        """Yields the global step counter (from 1), or ``(step, batch)`` with `data_generator`,
        until the data's pass ends, `max_step` is reached, or a stop is requested.

        A pause (a signal, a time limit) in the middle of the epoch does not return to the
        epoch's body: it raises `EpochPaused`, which leaves the body and the epoch loop for the
        ``with`` block, which saves a checkpoint -- the run that continues it runs the rest of
        the epoch and its end once, as an uninterrupted run does.

        Raises:
            EpochPaused: after a pause in the middle of the epoch (see above).
            RuntimeError: outside an epoch, or inside another step loop.
            ValueError: without data and without `max_step` (the loop would never end), or if
                the data yields no batches at the start of a pass.
        """
        self._require_entered()
        progress, clock, report = self._progress, self._run_clock, self._report
        if not progress.epoch_open:
            raise RuntimeError("iter_steps() must run inside iter_epochs().")
        if clock.step_open:
            raise RuntimeError("iter_steps() is already running; step loops do not nest.")
        if data_generator is None and self.max_step is None:
            raise ValueError("iter_steps() needs data or a max_step; otherwise the step loop "
                             "would never end.")
        data = self._data_iterator(data_generator) if data_generator is not None else None
        begin_step, end_step = report.begin_step, report.end_step  # bound once: per step below
        events = self._events
        before_step = events.handlers(EventKeys.BEFORE_STEP)  # live lists: fired when not empty
        after_step = events.handlers(EventKeys.AFTER_STEP)
        clock.begin_loop()  # until the data's pass ends, max_step, or a stop
        self._begin_recording()
        try:
            while clock.begin_step():
                batch = None
                if data is not None:
                    try:
                        batch = data.next_in_pass()
                    except StopIteration:
                        clock.data_ran_out()  # the pass ends the step loop
                        break
                begin_step()
                self._step_data = batch
                if before_step:
                    events.fire(EventKeys.BEFORE_STEP, self)
                yield progress.steps_taken if data is None else (progress.steps_taken, batch)
                if after_step:  # tfsnippet's order: AFTER_STEP, step_time, then the hooks
                    events.reverse_fire(EventKeys.AFTER_STEP, self)
                end_step()
                if not clock.end_step(data is not None and data.end_pass_at_last_batch()):
                    break
            clock.end_loop()
            if clock.epoch_cut_short:  # the rest of the epoch's body belongs to the resumed run
                raise EpochPaused
        finally:
            clock.leave_step()  # a body that broke out of the loop: its step ran
            self._step_data = None
            report.end_step_loop()
            self._record_loop()

    # ------------------------------------------------------------------ checkpoints

    def make_checkpoint(self) -> str:
        """Saves a checkpoint now (the loop state, parameters, `checkpoint_save_objects`, the
        callbacks, the data position and random state). Call it at the end of a step's or an
        epoch's body: the checkpoint holds the state of that moment.

        Raises:
            RuntimeError: without a `checkpoint_dir`.
        """
        self._require_entered()
        within = self._loop_began is not None
        self._record_loop()  # the steps the checkpoint holds are in the timeline before it
        started = time.perf_counter()
        path = self._checkpoints.save(self.step)
        if self._record is not None:
            self._record.timeline.save(self.step, time.perf_counter() - started)
        if within:
            self._begin_recording()
        self._callbacks.fire("on_checkpoint_saved", self._state, path)
        return path

    def save_checkpoint(self) -> str:
        """`make_checkpoint`, by the name every driver of a run has (`cadence.Controller`'s):
        what `cadence.callbacks.ModelSaver` calls."""
        return self.make_checkpoint()
