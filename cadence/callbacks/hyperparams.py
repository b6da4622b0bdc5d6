"""Hyper-parameter schedules applied to an optimizer (tensorpack's ``HyperParamSetter``s).

The value is a function of the absolute epoch (or step), computed again at the start of training,
so a resumed run sets the same value as an uninterrupted one (tensorpack #473, #1081). Any key of
the optimizer's parameter groups can be scheduled; ``learning_rate`` means ``lr``::

    ScheduledHyperParamSetter("learning_rate", [(1, 0.1), (30, 0.01), (60, 0.001)])
    ScheduledHyperParamSetter("learning_rate", [(0, 0.0), (5, 0.1)], interp="linear")
    HyperParamSetterWithFunc("momentum", lambda epoch, value: 0.9 if epoch > 2 else 0.5)
    HyperParamSetterWithFunc("learning_rate", cosine_schedule(0.1, 0.0, total=90))
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cadence.core.callbacks import Callback, RunState


def cosine_schedule(start: float, end: float, total: int) -> Callable[[int, Any], float]:
    """A function of the epoch (or step) ``t`` that goes from `start` to `end` along a half
    cosine over `total`, and stays at `end` after it."""

    def value(t: int, current: Any = None) -> float:
        fraction = min(max(t, 0), total) / total
        return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * fraction))

    return value


class HyperParamSetter(Callback):
    """Sets ``param`` of every parameter group of the optimizer before each epoch (or step).

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
        """The value at epoch (or step) `t`; None keeps the current one."""
        raise NotImplementedError

    def _optimizer(self, state: RunState) -> torch.optim.Optimizer:
        optimizer = self.optimizer or getattr(state.trainer, "optimizer", None)
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
        # Resume-safe: the value of the epoch/step training continues from.
        self._apply(state, state.global_step if self.step_based else state.epoch + 1)

    def on_epoch_begin(self, state: RunState) -> None:
        self._apply(state, state.epoch)

    def on_step_begin(self, state: RunState) -> None:
        self._apply(state, state.global_step)


class ScheduledHyperParamSetter(HyperParamSetter):
    """Sets the value from a schedule of ``(epoch or step, value)`` points: piecewise constant
    (a value holds from its point until the next), or linearly interpolated with
    ``interp="linear"``. Before the first point the value is left as it is."""

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
    """Sets the value to ``func(epoch or step, current value)``."""

    def __init__(self, param: str, func: Callable[[int, Any], Any], step_based: bool = False,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        super().__init__(param, step_based, optimizer)
        self.func = func

    def value_at(self, t: int, current: Any) -> Any:
        return self.func(t, current)
