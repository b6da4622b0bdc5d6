"""Hyper-parameter schedules applied to an optimizer (tensorpack's ``HyperParamSetter``s).

The value is a function of the number of *finished* epochs (or of completed steps), as in
tensorpack: a schedule point ``(e, value)`` takes effect after epoch ``e`` completes, i.e. from
epoch ``e + 1`` on (``(0, value)``: before the first epoch). It is computed again at the start of
training, so a resumed run sets the same value as an uninterrupted one (tensorpack #473, #1081).
Any key of the optimizer's parameter groups can be scheduled; ``learning_rate`` means ``lr``::

    ScheduledHyperParamSetter("learning_rate", [(1, 0.1), (30, 0.01), (60, 0.001)])
    ScheduledHyperParamSetter("learning_rate", [(0, 0.0), (5, 0.1)], interp="linear")
    HyperParamSetterWithFunc("momentum", lambda finished, value: 0.9 if finished >= 2 else 0.5)
    HyperParamSetterWithFunc("learning_rate", lambda finished, value: value * 0.9)
    HyperParamSetterWithFunc("learning_rate", cosine_schedule(0.1, 0.0, total=90))
    StatMonitorParamSetter("learning_rate", "validation_error", lambda lr: lr * 0.2,
                           threshold=0.0, last_k=5)    # decay on a plateau
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cadence.core.best import lookup
from cadence.core.callbacks import Callback, RunState
from cadence.core.intervals import check_int

logger = logging.getLogger("cadence")


def cosine_schedule(start: float, end: float, total: int) -> Callable[[int, Any], float]:
    """A function of the epoch (or step) ``t`` that goes from `start` to `end` along a half
    cosine over `total`, and stays at `end` after it."""

    def value(t: int, current: Any = None) -> float:
        fraction = min(max(t, 0), total) / total
        return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * fraction))

    return value


def _epochs_finished(state: RunState) -> int:
    """Epochs completed, also when training resumes inside an epoch (which is then running)."""
    return state.progress.epochs_completed


class HyperParamSetter(Callback):
    """Sets ``param`` of every parameter group of the optimizer when training starts and before
    each epoch (or step), to `value_at` the number of finished epochs (or completed steps).

    Args:
        param: ``learning_rate`` (= ``lr``) or another parameter-group key.
        step_based: follow the global step instead of the epoch (adds work to every step).
        optimizer: the optimizer; default ``state.trainer.optimizer``.
    """

    def __init__(self, param: str, step_based: bool = False,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        self.param = param
        self.key = "lr" if param == "learning_rate" else param
        self.step_based = step_based
        self.optimizer = optimizer
        self.provides = (param,)
        self.active_hooks = frozenset({"on_train_begin",
                                       "on_step_begin" if step_based else "on_epoch_begin"})

    def value_at(self, t: int, current: Any) -> Any:
        """The value once `t` epochs are finished (or `t` steps completed); None keeps the
        current one."""
        raise NotImplementedError

    def _optimizer(self, state: RunState) -> torch.optim.Optimizer:
        optimizer = self.optimizer or (
            state.trainer.optimizer if state.trainer is not None else None)
        if optimizer is None:
            raise ValueError(f"{type(self).__name__}({self.param!r}) needs an optimizer: pass "
                             "optimizer=..., or give the trainer an `optimizer` attribute.")
        if self.key not in optimizer.param_groups[0]:
            keys = sorted(k for k in optimizer.param_groups[0] if k != "params")
            raise ValueError(f"The optimizer ({type(optimizer).__name__}) has no {self.key!r}; "
                             f"it has {keys}.")
        return optimizer

    def _apply(self, state: RunState, t: int) -> None:
        optimizer = self._optimizer(state)
        current = optimizer.param_groups[0][self.key]
        value = self.value_at(t, current)
        if value is not None:
            for group in optimizer.param_groups:
                group[self.key] = value
            current = value
        if isinstance(current, (int, float)):
            state.metrics[self.param] = float(current)

    def on_train_begin(self, state: RunState) -> None:
        # Resume-safe: the value for where training continues from.
        self._apply(state, state.global_step if self.step_based else _epochs_finished(state))

    def on_epoch_begin(self, state: RunState) -> None:
        self._apply(state, state.epoch - 1)  # the epochs before the one starting are finished

    def on_step_begin(self, state: RunState) -> None:
        self._apply(state, state.global_step)


class ScheduledHyperParamSetter(HyperParamSetter):
    """Sets the value from a schedule of ``(epoch or step, value)`` points.

    A point ``(e, value)`` takes effect after epoch ``e`` completes (tensorpack's rule): with
    ``[(0, 0.1), (30, 0.01)]`` epochs 1-30 run with 0.1 and epoch 31 on with 0.01. Step-based,
    ``(s, value)`` takes effect once `s` steps are completed. Piecewise constant (a value holds
    from its point until the next; unlike tensorpack, which sets a value only at its point, so
    that a resumed run gets the same value), or linearly interpolated with ``interp="linear"``.
    Before the first point the value is left as it is.
    """

    def __init__(self, param: str, schedule: Sequence[tuple[int, float]],
                 interp: str | None = None, step_based: bool = False,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        super().__init__(param, step_based, optimizer)
        if interp not in (None, "linear"):
            raise ValueError(f"`interp` (got {interp!r}) must be None or 'linear'.")
        points = sorted((int(t), float(v)) for t, v in schedule)
        if not points:
            raise ValueError("`schedule` must have at least one (epoch, value) point.")
        self.points = points
        self.interp = interp

    def value_at(self, t: int, current: Any) -> float | None:
        times = [p[0] for p in self.points]
        index = bisect.bisect_right(times, t) - 1
        if index < 0:
            return None
        if self.interp is None or index == len(self.points) - 1:
            return self.points[index][1]
        (t0, v0), (t1, v1) = self.points[index], self.points[index + 1]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


class HyperParamSetterWithFunc(HyperParamSetter):
    """Sets the value to ``func(finished, current value)``, where `finished` is the number of
    finished epochs (or completed steps), as tensorpack does.

    `func` is called once for each value of `finished` -- at the start of training, then before
    each epoch (or step) -- and never twice for the same one, also across a resume (the last
    one is saved in checkpoints): a multiplicative schedule such as ``lambda e, x: x * 0.9``
    compounds exactly once per epoch.
    """

    def __init__(self, param: str, func: Callable[[int, Any], Any], step_based: bool = False,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        super().__init__(param, step_based, optimizer)
        self.func = func
        self.last_applied: int | None = None
        """The `finished` count `func` was last called with."""

    def value_at(self, t: int, current: Any) -> Any:
        return self.func(t, current)

    def _apply(self, state: RunState, t: int) -> None:
        if t == self.last_applied:  # this epoch's (or step's) value is set already
            return
        self.last_applied = t
        super()._apply(state, t)

    def state_dict(self) -> dict[str, Any]:
        return {"last_applied": self.last_applied}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        last = state_dict.get("last_applied")
        self.last_applied = None if last is None else int(last)


class StatMonitorParamSetter(HyperParamSetter):
    """Changes ``param`` to ``value_func(current value)`` when the metric `stat_name` stopped
    decreasing (or increasing, with `reverse`) by more than `threshold` over its last `last_k`
    observations: plateau decay, as tensorpack's ``StatMonitorParamSetter``.

    Each trigger (by default, each epoch's end: put it after the callback that produces the
    metric) observes the latest value of `stat_name` once; a trigger at a global step already
    observed adds nothing. Once `last_k` observations are kept, the value changes when
    ``min(history) >= history[0] - threshold`` (with `reverse`: ``max(history) <= history[0] +
    threshold``), and the history starts again. Nothing is set when training starts. The
    history is saved in checkpoints, so a resumed run counts on from where it stopped::

        StatMonitorParamSetter("learning_rate", "validation_error", lambda lr: lr * 0.2,
                               threshold=0.0, last_k=5)

    Args:
        param: ``learning_rate`` (= ``lr``) or another parameter-group key.
        stat_name: the metric in ``state.metrics``; a trigger without it is an error that lists
            the metrics there are.
        value_func: ``current value -> new value``.
        threshold: the change that counts as progress.
        last_k: how many observations make a plateau.
        reverse: watch for an increase instead of a decrease.
        optimizer: the optimizer; default ``state.trainer.optimizer``.

    Raises:
        ValueError: if `last_k` is not a positive int.
    """

    def __init__(self, param: str, stat_name: str, value_func: Callable[[Any], Any],
                 threshold: float, last_k: int, reverse: bool = False,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        last_k = check_int("StatMonitorParamSetter", "last_k", last_k,
                           "Pass the number of observations that make a plateau, e.g. last_k=5.")
        super().__init__(param, optimizer=optimizer)
        self.stat_name = stat_name
        self.value_func = value_func
        self.threshold = float(threshold)
        self.last_k = last_k
        self.reverse = reverse
        self.requires = (stat_name,)
        self.active_hooks = frozenset({"on_epoch_end"})  # tensorpack: not set before training
        self.history: deque[tuple[int, float]] = deque(maxlen=last_k)
        """The last observations, as ``(global_step, value)``."""

    def trigger(self, state: RunState) -> None:
        value = lookup(state.metrics, self.stat_name, "StatMonitorParamSetter")
        if value is None:  # nothing measured yet
            return
        if self.history and self.history[-1][0] == state.global_step:
            return  # observed already
        self.history.append((state.global_step, float(value)))
        self._apply(state, state.global_step)

    def on_epoch_end(self, state: RunState) -> None:
        self.trigger(state)

    def value_at(self, t: int, current: Any) -> Any:
        if len(self.history) < self.last_k:
            return None
        values = [value for _, value in self.history]
        first = values[0]
        if self.reverse:
            if max(values) > first + self.threshold:  # still rising
                return None
        elif min(values) < first - self.threshold:  # still falling
            return None
        self.history.clear()
        new = self.value_func(current)
        logger.info("StatMonitorParamSetter: %s plateaued over %s; %s %s -> %s.", self.stat_name,
                    ", ".join(f"{v:.4g}" for v in values), self.param, current, new)
        return new

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(item) for item in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history.clear()
        for step, value in state_dict.get("history", []):
            self.history.append((int(step), float(value)))
