"""`TrainLoop` (seed 004): tfsnippet's imperative loop helper, on cadence's engine.

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

Where tfsnippet had bugs or sharp edges, this one differs:

* ``ENTER_LOOP`` and ``EXIT_LOOP`` really fire (tfsnippet registered instead of firing them).
* The metric direction is explicit, or inferred from a documented list: names containing
  ``acc``, ``accuracy``, ``auc``, ``f1``, ``precision``, ``recall``, ``iou``, ``bleu``, ``map``,
  ``dice`` or ``r2`` are larger-is-better; others smaller-is-better.
* Early stopping's best parameters and best value are part of the checkpoint, so a resumed run
  goes on consistently; the best parameters are restored into the model **on every exit from the
  ``with`` block** -- normal end, an exception, or Ctrl-C -- after the last checkpoint was saved
  (the checkpoint keeps the latest parameters, so resuming continues training, not the best).
* A checkpoint taken in the middle of an epoch resumes that epoch with the next batch (tfsnippet
  counted the epoch as done and restarted the data).
* Metrics reach TensorBoard when they are printed: the mean since the last print, at the current
  step (tfsnippet wrote every collected value, which would cost a device sync per step).
* Callbacks (`cadence.Callback`) work here as in the other front-ends: ``on_train_begin/end``
  around the loop, ``on_epoch_*``, ``on_step_*``, ``on_loop_end`` with the printed metrics,
  ``on_checkpoint_saved``; a callback's ``request_stop`` ends the loops cleanly.
"""

from __future__ import annotations

import contextlib
import logging
import math
import platform
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cadence.core.best import infer_smaller_is_better
from cadence.core.callbacks import Callback, CallbackList, RunState
from cadence.core.errors import Preempted
from cadence.core.logs import humanize_duration
from cadence.core.rank import process_rank
from cadence.core.signals import stop_on_signals
from cadence.core.summary import SummaryManager, import_writer
from cadence.data.iterator import DataIterator
from cadence.engine.checkpoint import CheckpointManager
from cadence.engine.module import Module
from cadence.tfsnippet.events import EventKeys, EventSource

logger = logging.getLogger("cadence")

_RESERVED_OBJECTS = frozenset({"loop", "params", "callbacks"})

def is_time_metric(name: str) -> bool:
    """Metrics whose names end in ``time`` or ``timer`` are durations."""
    return name.endswith("time") or name.endswith("timer")


class StatisticsCollector:
    """Running mean and (population) variance of collected values.

    Tensor values stay on their device: a 0-d tensor is only remembered (no kernel, no sync) and
    everything is reduced when a statistic is read. Numbers are accumulated on the host.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forgets everything collected."""
        self._scalars: list[torch.Tensor] = []
        self._sum = 0.0
        self._square = 0.0
        self._weight = 0.0
        self.counter = 0
        """How many times `collect` was called."""

    def collect(self, values: Any, weight: float = 1.0) -> None:
        """Adds `values` (a number, an array or a tensor; each element counts) with `weight`."""
        self.counter += 1
        if isinstance(values, torch.Tensor):
            values = values.detach()
            if values.dim() == 0 and weight == 1.0:
                self._scalars.append(values)
                return
            values = values.double().flatten()
            self._scalars.append(torch.stack([(values * weight).sum(),
                                              (values * values * weight).sum(),
                                              torch.tensor(float(values.numel()) * weight,
                                                           dtype=torch.float64,
                                                           device=values.device)]))
            return
        if isinstance(values, (int, float)):
            value = float(values)
            self._sum += value * weight
            self._square += value * value * weight
            self._weight += weight
            return
        array = np.asarray(values, dtype=np.float64).ravel()
        self._sum += float(array.sum()) * weight
        self._square += float((array * array).sum()) * weight
        self._weight += float(array.size) * weight

    def _reduce(self) -> None:
        if not self._scalars:
            return
        plain = [t for t in self._scalars if t.dim() == 0]
        reduced = [t for t in self._scalars if t.dim() == 1]
        self._scalars = []
        if plain:
            stacked = torch.stack([t.to(plain[0].device) for t in plain]).double()
            self._sum += float(stacked.sum())
            self._square += float((stacked * stacked).sum())
            self._weight += len(plain)
        for triple in reduced:
            total, square, weight = triple.tolist()
            self._sum += total
            self._square += square
            self._weight += weight

    @property
    def has_value(self) -> bool:
        """Whether anything was collected."""
        return self.counter > 0

    @property
    def weight_sum(self) -> float:
        """The total weight (elements x weights) collected."""
        self._reduce()
        return self._weight

    @property
    def mean(self) -> float:
        """The weighted mean (NaN before anything was collected)."""
        self._reduce()
        return self._sum / self._weight if self._weight else math.nan

    @property
    def square(self) -> float:
        """The weighted mean of the squares."""
        self._reduce()
        return self._square / self._weight if self._weight else math.nan

    @property
    def var(self) -> float:
        """The population variance."""
        return max(self.square - self.mean**2, 0.0)

    @property
    def stddev(self) -> float:
        """The population standard deviation."""
        return math.sqrt(self.var)


class DefaultMetricFormatter:
    """Orders metrics (durations first, then by name) and formats their values."""

    def sort_metrics(self, names: Iterable[str]) -> list[str]:
        return sorted(names, key=lambda n: (not is_time_metric(n), n))

    def format_metric(self, name: str, value: float) -> str:
        if is_time_metric(name):
            return humanize_duration(value)
        return f"{value:.6g}"


class _NamedTensors:
    """Loose tensors (not owned by a module) saved and restored by name."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = dict(tensors)

    def state_dict(self) -> dict[str, Any]:
        return {name: t.detach() for name, t in self.tensors.items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, tensor in self.tensors.items():
            tensor.copy_(state[name])


def _flatten_param_vars(param_vars: Any) -> tuple[dict[str, nn.Module], dict[str, torch.Tensor]]:
    """Modules and loose tensors of `param_vars`, by name."""
    modules: dict[str, nn.Module] = {}
    tensors: dict[str, torch.Tensor] = {}

    def add(name: str, value: Any) -> None:
        if isinstance(value, nn.Module):
            modules[name or "model"] = value
        elif isinstance(value, Module):
            for path, obj in value.checkpoint_items().items():
                if isinstance(obj, nn.Module):
                    modules[f"{name}.{path}" if name else path] = obj
        elif isinstance(value, torch.Tensor):
            tensors[name or "param"] = value
        else:
            raise TypeError(
                f"param_vars holds a {type(value).__name__} at {name or 'the top level'!r}; "
                "pass parameters, nn.Modules or a cadence.Module (or a list/dict of them)."
            )

    if isinstance(param_vars, Mapping):
        for key, value in param_vars.items():
            add(str(key), value)
    elif isinstance(param_vars, (list, tuple)):
        for index, value in enumerate(param_vars):
            add(str(index), value)
    else:
        add("", param_vars)
    return modules, tensors


class TrainLoop:
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
        checkpoint_max_to_keep: checkpoints to keep (None: all).
        checkpoint_save_objects: more stateful objects to save, by name (optimizers,
            schedulers, ...).
        restore_checkpoint: True resumes from the newest checkpoint in `checkpoint_dir`; a path
            restores that checkpoint; False starts afresh (and still saves).
        summary_dir: write TensorBoard summaries here.
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

    Raises:
        ValueError: for a bad `checkpoint_epoch_freq`, or checkpoint options without a
            `checkpoint_dir`.
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
        checkpoint_max_to_keep: int | None = None,
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
    ) -> None:
        freq = checkpoint_epoch_freq
        if freq is not None and (isinstance(freq, bool) or not isinstance(freq, int) or freq < 1):
            raise ValueError(f"`checkpoint_epoch_freq` (got {checkpoint_epoch_freq!r}) must be a "
                             "positive int or None.")
        if checkpoint_dir is None and (checkpoint_epoch_freq or checkpoint_save_objects):
            raise ValueError("`checkpoint_epoch_freq` and `checkpoint_save_objects` need a "
                             "`checkpoint_dir`.")
        objects = dict(checkpoint_save_objects or {})
        taken = _RESERVED_OBJECTS.intersection(objects)
        if taken:
            raise KeyError(f"checkpoint_save_objects uses reserved names {sorted(taken)}; rename "
                           "them.")
        self._param_vars = param_vars
        self._modules, self._tensors = _flatten_param_vars(param_vars)
        self._var_groups = list(var_groups) if var_groups is not None else None
        self._show_eta = show_eta
        self._print_func = print_func
        self.max_epoch = max_epoch
        self.max_step = max_step
        self._formatter = metric_formatter or DefaultMetricFormatter()
        self._checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self._checkpoint_epoch_freq = checkpoint_epoch_freq
        self._checkpoint_max_to_keep = checkpoint_max_to_keep
        self._save_objects = objects
        self._restore_checkpoint = restore_checkpoint
        self._summary_dir = summary_dir
        self._summary_writer = summary_writer
        self._own_writer = summary_writer is None and summary_dir is not None
        if self._own_writer and process_rank() == 0:
            import_writer()  # at construction: not inside the first epoch
        self._summary_prefix = summary_metric_prefix
        self._skip = (re.compile(summary_skip_pattern) if isinstance(summary_skip_pattern, str)
                      else summary_skip_pattern)
        self._commit_freqs = dict(summary_commit_freqs or {})
        self._commit_counts: dict[str, int] = {}
        self._valid_metric_name = valid_metric_name
        self._smaller_is_better = (valid_metric_smaller_is_better
                                   if valid_metric_smaller_is_better is not None
                                   else infer_smaller_is_better(valid_metric_name))
        self._early_stopping = early_stopping
        self._callbacks = CallbackList(callbacks)
        self._clock = clock
        self._events = EventSource(EventKeys.all())

        self._epoch = 0
        self._step = 0
        self._entered = False
        self._exited = False
        self._within_epoch = False
        self._within_step = False
        self._resume_open_epoch = False
        self._step_data: Any = None
        self._best_valid_metric: float | None = None
        self._best_step: int | None = None
        self._best_params: dict[str, torch.Tensor] | None = None
        self._best_flag = False
        self._epoch_metrics: dict[str, StatisticsCollector] = {}
        self._step_metrics: dict[str, StatisticsCollector] = {}
        self._committed: set[str] = set()
        self._epoch_start = 0.0
        self._step_start = 0.0
        self._steps_in_epochs = 0
        self._eta_start: tuple[float, float] | None = None
        self._data: DataIterator | None = None
        self._pending_data_state: dict[str, Any] | None = None
        self._manager: CheckpointManager | None = None
        self._state = RunState(trainer=self)
        self._handle_signals = handle_signals
        self._signals = contextlib.ExitStack()
        self._received: list[int] = []

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
    def events(self) -> EventSource:
        """The `EventSource` that fires `EventKeys`."""
        return self._events

    @property
    def epoch(self) -> int:
        """The epoch counter, from 1 (0 before the first epoch)."""
        return self._epoch

    @property
    def step(self) -> int:
        """The global step counter, from 1 (0 before the first step)."""
        return self._step

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
        return self._early_stopping

    @property
    def valid_metric_name(self) -> str:
        return self._valid_metric_name

    @property
    def valid_metric_smaller_is_better(self) -> bool:
        return self._smaller_is_better

    @property
    def best_valid_metric(self) -> float | None:
        """The best validation metric so far."""
        return self._best_valid_metric

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
        return self._callbacks

    # ------------------------------------------------------------------ context

    def __enter__(self) -> TrainLoop:
        if self._entered:
            raise RuntimeError("A TrainLoop can be entered only once; create a new one.")
        self._entered = True
        if self._own_writer:
            self._summary_writer = SummaryManager(str(self._summary_dir), lambda: self._step)
        if self._checkpoint_dir is not None:
            objects: dict[str, Any] = {"loop": self, "callbacks": self._callbacks,
                                       **self._modules}
            if self._tensors:
                objects["params"] = _NamedTensors(self._tensors)
            objects.update(self._save_objects)
            self._manager = CheckpointManager(objects, self._checkpoint_dir,
                                              max_to_keep=self._checkpoint_max_to_keep)
            path: str | None = None
            if isinstance(self._restore_checkpoint, (str, Path)):
                path = str(self._restore_checkpoint)
                self._manager.restore(path)
            elif self._restore_checkpoint:
                path = self._manager.restore_or_initialize()
            if path is not None:
                self.println(f"Resume training: epoch {self._epoch}, step {self._step}, from "
                             f"checkpoint {path}")
        progress = self.get_progress()
        if progress is not None:
            self._eta_start = (progress, self._clock())
        self._state.global_step = self._step
        self._state.epoch = self._epoch
        self._received = self._signals.enter_context(
            stop_on_signals(self._state, self._handle_signals))
        self._events.fire(EventKeys.ENTER_LOOP, self)
        self._callbacks.fire("on_train_begin", self._state)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        saved = None
        try:
            self._events.reverse_fire(EventKeys.EXIT_LOOP, self)
            self._callbacks.fire("on_train_end", self._state)
            if self._received and exc_type is None and self._manager is not None:
                saved = self.make_checkpoint()
        finally:
            self._signals.close()
            self._exited = True
            self._within_epoch = self._within_step = False
            if self._early_stopping:
                self._restore_best_params(exc_type)
            if self._summary_writer is not None:
                if self._own_writer:
                    self._summary_writer.close()
                else:
                    self._summary_writer.flush()
        if self._received and exc_type is None:
            raise Preempted(self._received[0], saved)

    def _require_entered(self) -> None:
        if not self._entered or self._exited:
            raise RuntimeError("Use the TrainLoop inside its `with` block.")

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The loop's counters, best metric, early-stopping parameters and data position."""
        return {
            "epoch": self._epoch,
            "step": self._step,
            "epoch_open": self._within_epoch,
            "steps_in_epochs": self._steps_in_epochs,
            "best_valid_metric": self._best_valid_metric,
            "best_step": self._best_step,
            "best_params": self._best_params,
            "data": self._data.state_dict() if self._data is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._epoch = int(state["epoch"])
        self._step = int(state["step"])
        self._resume_open_epoch = bool(state["epoch_open"])
        self._steps_in_epochs = int(state.get("steps_in_epochs", 0))
        self._best_valid_metric = state["best_valid_metric"]
        self._best_step = state["best_step"]
        self._best_params = state["best_params"]
        self._pending_data_state = state["data"]
        self._data = None

    # ------------------------------------------------------------------ loops

    def _stop_requested(self) -> bool:
        return self._state.stop_requested

    def iter_epochs(self) -> Iterator[int]:
        """Yields the epoch counter (from 1) until `max_epoch` or `max_step` is reached, or a
        callback requests a stop. A checkpoint taken inside an epoch resumes that epoch.

        Raises:
            RuntimeError: outside the ``with`` block, or inside another epoch loop.
        """
        self._require_entered()
        if self._within_epoch:
            raise RuntimeError("iter_epochs() is already running; epoch loops do not nest.")
        try:
            while not self._stop_requested():
                if self._resume_open_epoch:
                    self._resume_open_epoch = False
                else:
                    if self.max_epoch is not None and self._epoch >= self.max_epoch:
                        break
                    if self.max_step is not None and self._step >= self.max_step:
                        break
                    self._epoch += 1
                self._within_epoch = True
                self._epoch_start = self._clock()
                self._committed.discard("epoch_time")
                self._state.epoch = self._epoch
                self._state.global_step = self._step
                self._events.fire(EventKeys.BEFORE_EPOCH, self)
                self._callbacks.fire("on_epoch_begin", self._state)
                yield self._epoch
                self._state.global_step = self._step
                self._events.reverse_fire(EventKeys.AFTER_EPOCH, self)
                self._callbacks.fire("on_epoch_end", self._state)
                if "epoch_time" not in self._committed:
                    self._collect_time("epoch_time", self._clock() - self._epoch_start)
                self._within_epoch = False
                if (self._checkpoint_epoch_freq is not None
                        and self._epoch % self._checkpoint_epoch_freq == 0):
                    self.make_checkpoint()
        finally:
            self._within_epoch = False
            self._epoch_metrics.clear()
            self._step_metrics.clear()
            self._best_flag = False

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
        step_hooks = self._callbacks if self._callbacks.has_step_hooks else None
        try:
            while not self._stop_requested():
                if self.max_step is not None and self._step >= self.max_step:
                    break
                batch = None
                if data is not None:
                    try:
                        batch = data.next_in_pass()
                    except StopIteration:
                        break
                self._step += 1
                self._steps_in_epochs += 1
                self._within_step = True
                self._step_data = batch
                self._committed.discard("step_time")
                self._step_start = self._clock()
                self._events.fire(EventKeys.BEFORE_STEP, self)
                if step_hooks is not None:
                    self._state.global_step = self._step
                    step_hooks.fire("on_step_begin", self._state)
                yield self._step if data is None else (self._step, batch)
                self._events.reverse_fire(EventKeys.AFTER_STEP, self)
                if step_hooks is not None:
                    step_hooks.fire("on_step_end", self._state)
                if "step_time" not in self._committed:
                    self._collect_time("step_time", self._clock() - self._step_start)
                self._within_step = False
                if data is not None and data.batches == data.pass_length:
                    data.end_pass()  # the last batch of a sized source: the pass ends now
                    break
        finally:
            self._within_step = False
            self._step_data = None
            self._step_metrics.clear()

    # ------------------------------------------------------------------ metrics

    def _collect(self, name: str, value: Any) -> None:
        collectors = (self._epoch_metrics, self._step_metrics) if self._within_step else (
            self._epoch_metrics,)
        for metrics in collectors:  # per step: no collector is built unless it is new
            collector = metrics.get(name)
            if collector is None:
                collector = metrics[name] = StatisticsCollector()
            collector.collect(value)

    def _collect_time(self, name: str, seconds: float) -> None:
        if self._within_epoch or self._within_step:
            self._collect(name, seconds)
        if self._events.has_handlers(EventKeys.TIME_METRICS_COLLECTED):
            self._events.fire(EventKeys.TIME_METRICS_COLLECTED, self, {name: seconds})

    def collect_metrics(self, metrics: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Adds metric values (numbers, arrays, or tensors: tensors stay on the device until the
        next `print_logs`). Collecting the validation metric updates the best value (one host
        read) and, with early stopping, remembers the parameters.

        Raises:
            TypeError: if `metrics` is not a mapping.
            RuntimeError: outside an epoch or a step.
        """
        if metrics is not None and not isinstance(metrics, Mapping):
            raise TypeError(f"`metrics` (got {type(metrics).__name__}) must be a dict.")
        self._require_entered()
        if not (self._within_epoch or self._within_step):
            raise RuntimeError("collect_metrics() must be called inside an epoch or a step.")
        merged = {**(metrics or {}), **kwargs}
        for name, value in merged.items():
            self._collect(name, value)
        if self._events.has_handlers(EventKeys.METRICS_COLLECTED):
            self._events.fire(EventKeys.METRICS_COLLECTED, self, merged)
        if self._valid_metric_name in merged:
            self._update_valid_metric(merged[self._valid_metric_name])

    def _update_valid_metric(self, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().double().mean()
        value = float(value)
        best = self._best_valid_metric
        if math.isnan(value):
            return
        improved = best is None or (value < best if self._smaller_is_better else value > best)
        if not improved:
            return
        self._best_valid_metric = value
        self._best_step = self._step
        self._best_flag = True
        if self._early_stopping:
            self._best_params = {name: p.detach().to("cpu", copy=True)
                                 for name, p in self._named_parameters().items()}

    def _named_parameters(self) -> dict[str, torch.Tensor]:
        named: dict[str, torch.Tensor] = {
            f"{prefix}.{n}": p for prefix, module in self._modules.items()
            for n, p in module.named_parameters()}
        named.update(self._tensors)
        return named

    @torch.no_grad()
    def _restore_best_params(self, exc_type: Any) -> None:
        how = "" if exc_type is None else f" (leaving on {exc_type.__name__})"
        if self._best_params is None:
            logger.warning("Early stopping: no best %s was recorded, so the parameters keep their "
                           "last values%s.", self._valid_metric_name, how)
            return
        for name, tensor in self._named_parameters().items():
            if name in self._best_params:
                tensor.copy_(self._best_params[name])
        self.println(f"Restored the early-stopping parameters of step {self._best_step} "
                     f"({self._valid_metric_name} = {self._best_valid_metric:.6g}){how}.")

    @contextlib.contextmanager
    def timeit(self, metric_name: str) -> Iterator[None]:
        """Times the block and collects the duration as `metric_name` (which should end in
        ``time`` or ``timer`` to be shown as a duration)."""
        start = self._clock()
        try:
            yield
        finally:
            self._collect_time(metric_name, self._clock() - start)

    @contextlib.contextmanager
    def metric_collector(self, metric_name: str) -> Iterator[StatisticsCollector]:
        """Yields a `StatisticsCollector`; its mean is collected as `metric_name` at the end."""
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
        self._summary_writer.write_summaries(dict(summary), step=self._step)
        self._events.fire(EventKeys.SUMMARY_ADDED, self, summary)

    # ------------------------------------------------------------------ progress

    def get_progress(self) -> float | None:
        """The fraction of training done, or None when no limit says."""
        if self.max_step is not None:
            done = self._step - 1 if self._within_step else self._step
            return min(max(done / self.max_step, 0.0), 1.0) if self.max_step else None
        if self.max_epoch is not None:
            finished = self._epoch - 1 if self._within_epoch else self._epoch
            if finished > 0 and self._steps_in_epochs > 0:
                per_epoch = self._steps_in_epochs / max(finished, 1)
                done = self._step - 1 if self._within_step else self._step
                return min(done / (self.max_epoch * per_epoch), 1.0)
            return finished / self.max_epoch if self.max_epoch else None
        return None

    def get_eta(self) -> float | None:
        """Seconds left, from the average rate since the loop started (or resumed); None when
        it cannot be estimated yet."""
        progress = self.get_progress()
        if progress is None:
            return None
        if self._eta_start is None:
            self._eta_start = (progress, self._clock())
            return None
        start_progress, start_time = self._eta_start
        if progress - start_progress < 1e-7:
            return None
        elapsed = self._clock() - start_time
        return elapsed / (progress - start_progress) * (1.0 - progress)

    # ------------------------------------------------------------------ printing

    def println(self, message: str, with_tag: bool = False) -> None:
        """Prints `message` with `print_func`, after the ``[Epoch, Step, ETA]`` tag if asked."""
        self._print_func(f"{self._tag()} {message}" if with_tag else message)

    def _tag(self) -> str:
        parts = []
        if self.max_epoch != 1:
            parts.append(f"Epoch {self._epoch}" + (f"/{self.max_epoch}" if self.max_epoch else ""))
        parts.append(f"Step {self._step}" + (f"/{self.max_step}" if self.max_step else ""))
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
        self._require_entered()
        if self._within_step:
            self._collect_time("step_time", self._clock() - self._step_start)
            self._committed.add("step_time")
            collectors = self._step_metrics
        elif self._within_epoch:
            self._collect_time("epoch_time", self._clock() - self._epoch_start)
            self._committed.add("epoch_time")
            collectors = self._epoch_metrics
        else:
            raise RuntimeError("print_logs() must be called inside an epoch or a step.")
        stats = {name: (c.mean, c.stddev if c.weight_sum > 1 else None)
                 for name, c in collectors.items() if c.has_value}
        texts = []
        for name in self._formatter.sort_metrics(stats):
            mean, std = stats[name]
            text = f"{name.replace('_', ' ')}: {self._formatter.format_metric(name, mean)}"
            if std is not None:
                text += f" (±{self._formatter.format_metric(name, std)})"
            texts.append(text)
        line = f"{self._tag()} {'; '.join(texts)}"
        if self._best_flag:
            line += " (*)"
            self._best_flag = False
        self._print_func(line)
        self._write_summaries({name: mean for name, (mean, _) in stats.items()})
        metric_stats = {n: s for n, s in stats.items() if not is_time_metric(n)}
        time_stats = {n: s for n, s in stats.items() if is_time_metric(n)}
        if metric_stats:
            self._events.fire(EventKeys.METRIC_STATS_PRINTED, self, metric_stats)
        if time_stats:
            self._events.fire(EventKeys.TIME_METRIC_STATS_PRINTED, self, time_stats)
        self._state.global_step = self._step
        means = {n: m for n, (m, _) in stats.items()}
        self._state.put_metrics(means)
        self._callbacks.fire("on_loop_end", self._state, means)
        collectors.clear()

    def _write_summaries(self, means: dict[str, float]) -> None:
        if self._summary_writer is None:
            return
        values = {}
        for name, mean in means.items():
            if self._skip is not None and self._skip.match(name):
                continue
            count = self._commit_counts[name] = self._commit_counts.get(name, 0) + 1
            if (count - 1) % self._commit_freqs.get(name, 1):
                continue
            values[f"{self._summary_prefix}{name}"] = mean
        if values:
            self._summary_writer.write_summaries(values, step=self._step)

    def print_training_summary(self) -> None:
        """Prints the environment and a table of the trained parameters (name, shape, count),
        split by `var_groups`."""
        device = (f"CUDA ({torch.cuda.get_device_name()})" if torch.cuda.is_available()
                  else "CPU")
        from cadence import __version__

        lines = [
            "Execution environment",
            f"  Python {platform.python_version()} ({sys.executable}), torch {torch.__version__},"
            f" cadence {__version__}, {device}, {torch.get_num_threads()} threads",
            "",
        ]
        named = self._named_parameters()
        trainable = {n: p for n, p in named.items() if p.requires_grad}
        other = {n: p for n, p in named.items() if not p.requires_grad}
        groups: list[tuple[str, dict[str, torch.Tensor]]] = []
        if self._var_groups:
            rest = dict(trainable)
            for prefix in self._var_groups:
                members = {n[len(prefix):].lstrip("./"): p for n, p in trainable.items()
                           if n.startswith(prefix)}
                for n in list(rest):
                    if n.startswith(prefix):
                        del rest[n]
                if members:
                    groups.append((f"Trainable Parameters ({prefix})", members))
            if rest:
                groups.append(("Other Trainable Parameters", rest))
        if not groups:
            groups = [("Trainable Parameters", trainable)]
        if other:
            groups.append(("Other Parameters", other))
        for title, members in groups:
            lines += [*_parameter_table(title, members), ""]
        self._print_func("\n".join(lines).rstrip())

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
        path = self._manager.save(self._step)
        self._state.global_step = self._step
        self._callbacks.fire("on_checkpoint_saved", self._state, path)
        return path


def _parameter_table(title: str, params: Mapping[str, torch.Tensor]) -> list[str]:
    total = sum(p.numel() for p in params.values())
    header = f"{title} ({total:,} in total)"
    rows = [(name, str(tuple(p.shape)), f"{p.numel():,}") for name, p in sorted(params.items())]
    widths = [max([len(r[i]) for r in rows] + [0]) for i in range(3)]
    lines = [header, "-" * max(len(header), sum(widths) + 4)]
    lines += [f"{n:<{widths[0]}}  {s:<{widths[1]}}  {c:>{widths[2]}}" for n, s, c in rows]
    return lines
