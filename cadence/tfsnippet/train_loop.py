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

It is the engine's parts behind tfsnippet's API: the counters are a
`cadence.core.progress.Progress` (the numbers every front-end's callbacks see), the statistics
`cadence.Moments`, the best metric a `cadence.core.best.BestTracker`, the ETA a
`cadence.core.eta.ETA`, checkpoints a `cadence.CheckpointManager`, summaries a
`cadence.SummaryManager`, signals a `cadence.core.preemption.Preemption`; `cadence.Callback`
objects work as in every front-end (``on_loop_end`` is a print). Where it differs from tfsnippet
on purpose (events that fire, checkpoints that resume mid-epoch, best parameters restored on
every exit, summaries written when printed, 5 checkpoints kept by default), ``docs/callbacks.md``
says why.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cadence.core.best import BestTracker
from cadence.core.callbacks import Callback, CallbackList, RunState
from cadence.core.checkpoint_dir import DEFAULT_MAX_TO_KEEP
from cadence.core.eta import ETA
from cadence.core.intervals import check_int
from cadence.core.preemption import Preemption
from cadence.core.progress import Progress
from cadence.core.rank import is_chief
from cadence.core.summary import (
    DEFAULT_WRITERS,
    SummaryManager,
    WriterSpec,
    check_writers,
    import_writer,
)
from cadence.data.iterator import DataIterator
from cadence.engine.checkpoint import CheckpointManager
from cadence.engine.distributed import StopAgreement, agree_on_stop, any_rank, is_distributed
from cadence.tfsnippet.events import EventKeys, EventSource
from cadence.tfsnippet.formatting import (
    DefaultMetricFormatter,
)
from cadence.tfsnippet.metric_log import MetricLog
from cadence.tfsnippet.params import TrainedParameters
from cadence.tfsnippet.reporting import LoopReporting

logger = logging.getLogger("cadence")

_RESERVED_OBJECTS = frozenset({"loop", "params", "callbacks"})


class TrainLoop(LoopReporting):
    """A context manager that keeps the bookkeeping of a hand-written training loop.

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
        checkpoint_dir: enables checkpoints (`make_checkpoint`, `checkpoint_epoch_freq`).
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
        TypeError: for an `early_stopping` that is not a bool (it has no patience).
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
        max_epoch = check_int("TrainLoop", "max_epoch", max_epoch, "Pass the last epoch to "
                              "train, e.g. max_epoch=10, or None for no limit.", none_ok=True)
        max_step = check_int("TrainLoop", "max_step", max_step, "Pass the last global step to "
                             "train, e.g. max_step=1000, or None for no limit.", none_ok=True)
        checkpoint_epoch_freq = check_int(
            "TrainLoop", "checkpoint_epoch_freq", checkpoint_epoch_freq,
            "Pass how many epochs apart to checkpoint, e.g. checkpoint_epoch_freq=1, or None "
            "to checkpoint only with make_checkpoint().", none_ok=True)
        checkpoint_max_to_keep = check_int(
            "TrainLoop", "checkpoint_max_to_keep", checkpoint_max_to_keep,
            "Pass how many checkpoints to keep, e.g. checkpoint_max_to_keep=5, or None to keep "
            "all.", minimum=0, none_ok=True)
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
        objects = dict(checkpoint_save_objects or {})
        taken = _RESERVED_OBJECTS.intersection(objects)
        if taken:
            raise KeyError(f"checkpoint_save_objects uses reserved names {sorted(taken)}; rename "
                           "them.")
        self._param_vars = param_vars
        self._params = TrainedParameters(param_vars)
        self._var_groups = list(var_groups) if var_groups is not None else None
        self._show_eta = show_eta
        self._print_func = print_func
        self.max_epoch = max_epoch
        self.max_step = max_step
        self._checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self._checkpoint_epoch_freq = checkpoint_epoch_freq
        self._checkpoint_max_to_keep = checkpoint_max_to_keep or None
        self._save_objects = objects
        self._restore_checkpoint = restore_checkpoint
        self._summary_dir = summary_dir
        self._summary_writer = summary_writer
        self._own_writer = summary_writer is None and summary_dir is not None
        self._writers = check_writers(writers)
        if self._own_writer and is_chief():
            import_writer(self._writers)  # at construction: not inside the first epoch
        skip = (re.compile(summary_skip_pattern) if isinstance(summary_skip_pattern, str)
                else summary_skip_pattern)
        self._log = MetricLog(metric_formatter or DefaultMetricFormatter(),
                              summary_metric_prefix, skip, summary_commit_freqs or {})
        mode = (None if valid_metric_smaller_is_better is None
                else "min" if valid_metric_smaller_is_better else "max")
        self._best = BestTracker(valid_metric_name, mode)
        self._best_params: dict[str, torch.Tensor] | None = None
        self._best_flag = False
        self._early_stopping = early_stopping
        self._callbacks = CallbackList(callbacks)
        self._clock = clock
        self._events = EventSource(EventKeys.all())

        self._progress = Progress()
        self._entered = self._exited = False
        self._stop_agreed = False
        self._within_epoch = self._within_step = False
        self._pass_over = False  # the running epoch's pass of the data ended
        self._epoch_closed = self._step_closed = False  # by print_logs (see get_progress)
        self._step_data: Any = None
        self._committed: set[str] = set()
        self._epoch_start = self._step_start = 0.0
        self._steps_in_epochs = 0
        self._eta = ETA()
        self._data: DataIterator | None = None
        self._pending_data_state: dict[str, Any] | None = None
        self._manager: CheckpointManager | None = None
        self._state = RunState(trainer=self, controller=self)
        self._preemption = Preemption(handle_signals)
        self._signals = contextlib.ExitStack()

    # ------------------------------------------------------------------ properties

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
        return self._early_stopping

    @property
    def valid_metric_name(self) -> str:
        """The validation metric that decides "best"."""
        return self._best.monitor

    @property
    def valid_metric_smaller_is_better(self) -> bool:
        """Its direction."""
        return self._best.mode == "min"

    @property
    def best_valid_metric(self) -> float | None:
        """The best validation metric so far."""
        return self._best.best

    @property
    def within_epoch(self) -> bool:
        """Whether an epoch is open."""
        return self._within_epoch

    @property
    def within_step(self) -> bool:
        """Whether a step is open."""
        return self._within_step

    @property
    def callbacks(self) -> CallbackList:
        """The callbacks, in order."""
        return self._callbacks

    @property
    def checkpoint_manager(self) -> CheckpointManager | None:
        """The manager of `checkpoint_dir` (inside the ``with`` block)."""
        return self._manager

    # ------------------------------------------------------------------ context

    def __enter__(self) -> TrainLoop:
        if self._entered:
            raise RuntimeError("A TrainLoop can be entered only once; create a new one.")
        self._entered = True
        if self._own_writer:
            self._summary_writer = SummaryManager(str(self._summary_dir), lambda: self.step,
                                                  writers=self._writers)
        if self._checkpoint_dir is not None:
            objects: dict[str, Any] = {"loop": self, "callbacks": self._callbacks,
                                       **self._params.stateful(), **self._save_objects}
            self._manager = CheckpointManager(objects, self._checkpoint_dir,
                                              max_to_keep=self._checkpoint_max_to_keep)
            path: str | None = None
            if isinstance(self._restore_checkpoint, (str, Path)):
                path = str(self._restore_checkpoint)
                self._manager.restore(path)
            elif self._restore_checkpoint:
                path = self._manager.restore_or_initialize()
            if path is not None:
                self.println(f"Resume training: epoch {self.epoch}, step {self.step}, from "
                             f"checkpoint {path}")
        progress = self.get_progress()
        if progress is not None:
            self._eta.start(progress, self._clock())
        self._sync_state()
        self._signals.enter_context(self._preemption.watch(self._state))
        self._events.fire(EventKeys.ENTER_LOOP, self)
        self._callbacks.fire("on_train_begin", self._state)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        saved = None
        try:
            self._events.reverse_fire(EventKeys.EXIT_LOOP, self)
            self._callbacks.fire_teardown("on_train_end", self._state)
            # A signal to any rank preempts all: every rank saves, as the ranks agreed.
            preempted = self._preemption.agree(any_rank) if exc_type is None else False
            if preempted and self._manager is not None:
                saved = self.make_checkpoint()
        finally:
            self._signals.close()
            self._exited = True
            self._within_epoch = self._within_step = False
            self._data = None  # ends the data's running pass: a DataFlow is not reentrant
            if self._early_stopping:
                self._restore_best_params(exc_type)
            if self._summary_writer is not None:
                if self._own_writer:
                    self._summary_writer.close()
                else:
                    self._summary_writer.flush()
        if exc_type is None:
            self._preemption.finish(lambda: saved)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The loop's counters, best metric, early-stopping parameters and data position.

        Saved inside a step, the step counts as done; inside an epoch, the epoch is resumed."""
        return {
            "progress": self._progress.state_dict(),
            "steps_in_epochs": self._steps_in_epochs,
            "best": self._best.state_dict(),
            "best_params": self._best_params,
            "data": self._data.state_dict() if self._data is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._progress.load_state_dict(state["progress"])
        self._steps_in_epochs = int(state.get("steps_in_epochs", 0))
        self._best.load_state_dict(state["best"])
        self._best_params = state["best_params"]
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
        if self._within_epoch:
            raise RuntimeError("iter_epochs() is already running; epoch loops do not nest.")
        progress, state = self._progress, self._state
        try:
            while not self._stopping():
                if progress.epoch_finished:  # else: reopen the epoch a checkpoint was taken in
                    if self.max_epoch is not None and progress.epoch >= self.max_epoch:
                        break
                    if self.max_step is not None and progress.global_step >= self.max_step:
                        break
                progress.begin_epoch()
                self._pass_over = False
                self._within_epoch, self._epoch_closed = True, False
                self._epoch_start = self._clock()
                self._committed.discard("epoch_time")
                self._sync_state()
                self._events.fire(EventKeys.BEFORE_EPOCH, self)
                self._callbacks.fire("on_epoch_begin", state)
                yield progress.epoch
                # A stop ends the epoch without finishing it -- unless its pass was over: then
                # a resumed run goes on with the next epoch, not an empty rerun of this one.
                if not self._stopping() or self._pass_over:
                    progress.finish_epoch()
                self._sync_state()
                self._events.reverse_fire(EventKeys.AFTER_EPOCH, self)
                self._callbacks.fire("on_epoch_end", state)
                progress.end_epoch()
                if is_distributed():
                    # an epoch-end callback's stop, on every rank (the decision, not the
                    # flag: a signal may set it on this rank alone after the agreement)
                    self._stop_agreed = agree_on_stop(state)
                if "epoch_time" not in self._committed:
                    self._collect_time("epoch_time", self._clock() - self._epoch_start)
                self._within_epoch = False
                if (self._checkpoint_epoch_freq is not None and progress.epoch_finished
                        and progress.epoch % self._checkpoint_epoch_freq == 0):
                    self.make_checkpoint()
        finally:
            self._within_epoch = False
            self._log.clear()
            self._best_flag = False

    def _stopping(self) -> bool:
        """Whether the loop stops. In one process: whether a stop was requested. Across ranks:
        whether the ranks agreed to stop at the last agreement (the end of a step loop or of an
        epoch), so that a signal arriving on one rank after it cannot end that rank's loop
        alone; the next agreement takes it."""
        return self._stop_agreed if is_distributed() else self._state.stop_requested

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

        Raises:
            RuntimeError: outside an epoch, or inside another step loop.
            ValueError: without data and without `max_step` (the loop would never end), or if
                the data yields no batches at the start of a pass.
        """
        self._require_entered()
        if not self._within_epoch:
            raise RuntimeError("iter_steps() must run inside iter_epochs().")
        if self._within_step:
            raise RuntimeError("iter_steps() is already running; step loops do not nest.")
        if data_generator is None and self.max_step is None:
            raise ValueError("iter_steps() needs data or a max_step; otherwise the step loop "
                             "would never end.")
        data = self._data_iterator(data_generator) if data_generator is not None else None
        progress, state = self._progress, self._state
        step_hooks = self._callbacks if self._callbacks.has_step_hooks else None
        # Several ranks stop together: a local request counts once the ranks agreed on it.
        agreement = StopAgreement() if is_distributed() else None
        try:
            while not (state.stop_requested and agreement is None):
                if self.max_step is not None and progress.global_step >= self.max_step:
                    break
                batch = None
                if data is not None:
                    try:
                        batch = data.next_in_pass()
                    except StopIteration:
                        self._pass_over = True
                        break
                if step_hooks is not None:
                    self._sync_state()  # completed steps, before this one
                    step_hooks.fire("on_step_begin", state)
                # The body of the loop is the step: it counts from here, so that a checkpoint
                # made in it holds it.
                progress.count_step()
                self._steps_in_epochs += 1
                self._within_step, self._step_closed = True, False
                self._step_data = batch
                self._committed.discard("step_time")
                self._step_start = self._clock()
                self._events.fire(EventKeys.BEFORE_STEP, self)
                yield progress.global_step if data is None else (progress.global_step, batch)
                self._events.reverse_fire(EventKeys.AFTER_STEP, self)
                if step_hooks is not None:
                    self._sync_state()
                    step_hooks.fire("on_step_end", state)
                if "step_time" not in self._committed:
                    self._collect_time("step_time", self._clock() - self._step_start)
                self._within_step = False
                if data is not None and data.batches == data.pass_length:
                    data.end_pass()  # the last batch of a sized source: the pass ends now
                    self._pass_over = True
                    break
                if agreement is not None and agreement.after_step(state):
                    break
            if agreement is not None:
                self._stop_agreed = agreement.at_loop_end(state)
        finally:
            self._within_step = False
            self._step_data = None
            self._log.clear_step()

    # ------------------------------------------------------------------ checkpoints

    def make_checkpoint(self) -> str:
        """Saves a checkpoint now (the loop state, parameters, `checkpoint_save_objects`, the
        callbacks, the data position and random state). Call it at the end of a step's or an
        epoch's body: the checkpoint holds the state of that moment.

        Raises:
            RuntimeError: without a `checkpoint_dir`.
        """
        self._require_entered()
        if self._manager is None:
            raise RuntimeError("make_checkpoint() needs a checkpoint_dir.")
        path = self._manager.save(self.step)
        self._sync_state()
        self._callbacks.fire("on_checkpoint_saved", self._state, path)
        return path

    def save_checkpoint(self) -> str:
        """`make_checkpoint`, by the name every driver of a run has (`cadence.Controller`'s):
        what `cadence.callbacks.ModelSaver` calls."""
        return self.make_checkpoint()
