"""Intervals: *when* something happens, kept apart from *what* happens.

Bookkeeping runs once per loop, not once per step, so an interval fires when a boundary was
crossed since it last fired (``step // every > last // every``), not on ``step % every == 0``.
The Controller also asks each interval for its next boundary and ends loops there, so periodic
work lands exactly on multiples of the interval whatever ``steps_per_loop`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def check_interval(name: str, value: int | None) -> int | None:
    """Validates an optional interval argument: None, or a positive int.

    Raises:
        TypeError: if `value` is not an int (bools are rejected too).
        ValueError: if `value` is not positive.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` (got {value!r}) must be a positive int or None.")
    if value <= 0:
        raise ValueError(
            f"`{name}` (got {value}) must be a positive number of steps. "
            f"Pass None to turn it off instead."
        )
    return value


def check_steps_per_loop(value: Any) -> int | Callable[[int], int]:
    """Validates ``steps_per_loop``: a positive int, or a function of the global step.

    Raises:
        ValueError: for anything else.
    """
    if callable(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"`steps_per_loop` (got {value!r}) must be a positive int, or a function of the global "
            "step returning one. It is required when a trainer is given."
        )
    return value


def check_count(name: str, value: Any) -> int | None:
    """Validates an optional target (a global step, a number of epochs): None or an int >= 0.

    Raises:
        ValueError: for anything else.
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"`{name}` (got {value!r}) must be a non-negative int or None.")
    return value


def check_eval_steps(steps: Any) -> int:
    """Validates a number of evaluation steps: positive, or -1 for all the data.

    Raises:
        ValueError: for anything else.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or (steps <= 0 and steps != -1):
        raise ValueError(
            f"`steps` (got {steps!r}) must be a positive number of evaluation steps, or -1 "
            "to evaluate until the data is exhausted."
        )
    return steps


@dataclass
class Interval:
    """Fires every `every` global steps, at absolute multiples of `every`.

    Args:
        every: the period in steps; None means "never fires, imposes no boundary".
        last: the step at which it last fired (or the step a run resumed from).
    """

    every: int | None
    last: int = 0

    def crossed(self, step: int) -> bool:
        """Whether a multiple of `every` lies in ``(last, step]``."""
        return self.every is not None and step // self.every > self.last // self.every

    def next_boundary(self, step: int) -> int | None:
        """The first multiple of `every` strictly after `step`, or None if there is no interval."""
        if self.every is None:
            return None
        return (step // self.every + 1) * self.every

    def mark(self, step: int) -> None:
        """Records that the action ran at `step`."""
        self.last = step


def steps_until_boundary(step: int, target: int, *intervals: Interval) -> int:
    """The number of steps to run from `step` so as to stop at `target` or the first boundary."""
    end = target
    for interval in intervals:
        boundary = interval.next_boundary(step)
        if boundary is not None:
            end = min(end, boundary)
    return end - step
