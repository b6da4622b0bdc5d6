"""Which way a metric improves: one vocabulary for every front-end.

Early stopping, the best-weights exporters and the savers compare values of a monitored metric.
They name the direction in their seeds' words (``mode="min"``, ``metric_comp="lower"``,
``smaller_is_better=True``, ``MinSaver``); all of them mean ``"min"`` or ``"max"`` here. When a
direction is not given it is inferred from the metric's name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from cadence.core.errors import MissingMetricError

LARGER_IS_BETTER = ("acc", "accuracy", "auc", "f1", "precision", "recall", "iou", "bleu", "map",
                    "dice", "r2")
"""Name parts that make a validation metric larger-is-better when the direction is not given."""

def infer_smaller_is_better(name: str) -> bool:
    """Whether smaller values of the metric `name` are better, from its name (see
    `LARGER_IS_BETTER`).

    >>> infer_smaller_is_better("valid_loss"), infer_smaller_is_better("valid_auc")
    (True, False)
    """
    parts = re.split(r"[^a-z0-9]+", name.lower())
    return not any(part in LARGER_IS_BETTER for part in parts)


MODES = ("min", "max")
"""The one vocabulary of directions: smaller is better, or larger is better."""

COMP_TO_MODE = {"lower": "min", "higher": "max"}
"""TF Model Garden's ``best_checkpoint_metric_comp`` words, in this vocabulary."""


def check_mode(mode: str | None, name: str = "mode") -> str | None:
    """Returns `mode` if it is ``"min"``, ``"max"`` or None.

    Raises:
        ValueError: for anything else.
    """
    if mode not in (None, *MODES):
        raise ValueError(f"`{name}` (got {mode!r}) must be 'min', 'max' or None (inferred from "
                         "the metric's name).")
    return mode


def mode_of(metric: str, mode: str | None = None) -> str:
    """`mode` when given, else the direction inferred from the metric's name.

    >>> mode_of("valid_loss"), mode_of("val_accuracy"), mode_of("val_accuracy", "min")
    ('min', 'max', 'min')
    """
    return check_mode(mode) or ("min" if infer_smaller_is_better(metric) else "max")


def is_better(value: float, than: float | None, mode: str, min_delta: float = 0.0) -> bool:
    """Whether `value` improves on `than` (None: anything does) by more than `min_delta`.
    NaN never improves."""
    if math.isnan(value):
        return False
    if than is None:
        return True
    return value < than - min_delta if mode == "min" else value > than + min_delta


def lookup(metrics: Mapping[str, Any], name: str, what: str) -> Any:
    """``metrics[name]``, or None while the run has produced no metric at all (a trigger before
    the first loop ended); `what` -- the callback or option reading it -- is named when the
    metric is missing from metrics there are.

    Raises:
        MissingMetricError: listing the metrics there are.
    """
    if name in metrics:
        return metrics[name]
    if not metrics:
        return None
    raise MissingMetricError(
        f"{what} monitors {name!r}, which is not among the metrics ({', '.join(sorted(metrics))})."
        " Monitor one of them, or put the callback that produces it first (and trigger this one "
        "after it)."
    )


class BestTracker:
    """The best value of a monitored metric so far, and how long ago it was seen.

    Early stopping, the best-weights exporters and `TrainLoop`'s best validation metric all
    keep one; its state goes into checkpoints, so a resumed run compares with the same best.

    Args:
        monitor: the metric's name.
        mode: ``"min"`` or ``"max"``; None infers it from the name (see `LARGER_IS_BETTER`).
        min_delta: the smallest change that counts as an improvement.

    >>> tracker = BestTracker("valid_loss")
    >>> [tracker.update(v, step) for step, v in enumerate([3.0, 1.0, 2.0])]
    [True, True, False]
    >>> tracker.best, tracker.best_step, tracker.wait
    (1.0, 1, 1)
    """

    def __init__(self, monitor: str, mode: str | None = None, min_delta: float = 0.0) -> None:
        self.monitor = monitor
        self.mode = mode_of(monitor, mode)
        self.min_delta = abs(min_delta)
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait = 0
        """Updates since the last improvement."""

    def update(self, value: float, step: int) -> bool:
        """Records `value` seen at `step`; returns whether it is a new best."""
        value = float(value)
        if is_better(value, self.best, self.mode, self.min_delta):
            self.best, self.best_step, self.wait = value, step, 0
            return True
        self.wait += 1
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
        self.best_step = state["best_step"]
        self.wait = int(state.get("wait", 0))
