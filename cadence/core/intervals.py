"""Intervals: *when* something happens, kept apart from *what* happens.

Bookkeeping runs once per loop, not once per step, so an interval fires when a boundary was
crossed since it last fired (``step // every > last // every``), not on ``step % every == 0``.
The Controller also asks each interval for its next boundary and ends loops there, so periodic
work lands exactly on multiples of the interval whatever ``steps_per_loop`` is.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard


def is_int(value: Any) -> TypeGuard[int]:
    """Whether `value` is an integer: a Python or numpy int, but not a bool (which Python
    counts as an int, so ``steps=True`` would otherwise run one step).

    This is the one integer test of the package; `check_int` and the checks below build on it.
    """
    # A plain int first: `train(num_steps)` checks once per loop, and a loop may be one step.
    return type(value) is int or (isinstance(value, numbers.Integral)
                                  and not isinstance(value, bool))


def check_int(owner: str, name: str, value: Any, fix: str, *, minimum: int = 1,
              none_ok: bool = False) -> Any:
    """Validates a count or a period given by a user (epochs, steps, a frequency): an integer
    of at least `minimum`, or None where `none_ok` (None then means "no limit" or "off").

    Every front-end checks its schedule arguments with this, so that a no-op or misread
    schedule (``max_epoch=0``, ``every_k_epochs=1.5``, ``steps_per_epoch=True``) is refused with
    the same one line instead of training nothing. A bool is refused although Python counts it
    as an int; a numpy integer is accepted.

    >>> check_int("TrainLoop", "max_step", 100, "Pass e.g. 100.")
    100
    >>> check_int("TrainConfig", "max_epoch", 2.5, "Pass e.g. max_epoch=10.")
    Traceback (most recent call last):
    ...
    ValueError: TrainConfig: `max_epoch` (got 2.5) must be a positive int. Pass e.g. max_epoch=10.

    Args:
        owner: what the argument belongs to (a class, a function), named first in the message.
        name: the argument's name.
        value: what was given.
        fix: what to do instead, as a sentence with an example of the right usage.
        minimum: the smallest value allowed (1: positive, 0: non-negative).
        none_ok: whether None is allowed.

    Returns:
        `value` (as a plain int, or None).

    Raises:
        ValueError: if `value` is not an integer (a float such as 2.5, a bool, a string; None
            without `none_ok`) or is below `minimum`. A wrong kind is a ValueError too: the
            schedule checks of every front-end raised that before, and callers catch it.
    """
    if value is None and none_ok:
        return None
    if is_int(value) and int(value) >= minimum:
        return int(value)
    kind = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
    raise ValueError(f"{owner}: `{name}` (got {value!r}) must be {kind}"
                     f"{' or None' if none_ok else ''}. {fix}")


def check_interval(name: str, value: int | None) -> int | None:
    """Validates an optional interval argument: None, or a positive int.

    Raises:
        TypeError: if `value` is not an int (bools are rejected too).
        ValueError: if `value` is not positive.
    """
    if value is None:
        return None
    if not is_int(value):
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
    if not is_int(value) or value <= 0:
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
    if value is not None and (not is_int(value) or value < 0):
        raise ValueError(f"`{name}` (got {value!r}) must be a non-negative int or None.")
    return value


def check_eval_steps(steps: Any) -> int:
    """Validates a number of evaluation steps: positive, or -1 for all the data.

    Raises:
        ValueError: for anything else.
    """
    if not is_int(steps) or (steps <= 0 and steps != -1):
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
