"""Callbacks that stop training: `EarlyStopping` and `StopAtTimeLimit`.

(The NaN/Inf guard is `cadence.LossGuard`: it stops training, or restores a checkpoint, when the
loss of a loop is not finite.)
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

from cadence.core.best import BestTracker, check_mode, lookup
from cadence.core.callbacks import Callback, RunState, overridden_hooks
from cadence.core.intervals import check_int
from cadence.core.logs import is_scalar
from cadence.core.trainer_view import trained_model

logger = logging.getLogger("cadence")


class EarlyStopping(Callback):
    """Stops training when `monitor` has not improved for `patience` triggers (epochs, by
    default; evaluations with ``after="evaluation"``); with `restore_best`, puts the best
    weights back into ``state.trainer.model`` when training ends. The best value, the waiting
    count and the best weights are checkpointed.

    Args:
        monitor: the metric in ``state.metrics``; a trigger without it is an error that lists
            the metrics there are (early stopping that silently never happens is worse).
        patience: triggers without improvement before stopping (a NaN is no improvement).
        min_delta: the smallest change that counts as an improvement.
        mode: ``"min"`` or ``"max"``; None infers it from the name (see
            `cadence.core.best.LARGER_IS_BETTER`).
        restore_best: restore the best weights at the end.
        after: ``"epoch"``: trigger at each epoch's end (or where a scheduling wrapper says);
            ``"evaluation"``: after each Controller evaluation (``on_eval_end``; monitor an
            ``eval/<name>`` metric), as the Task front-end's ``trainer.early_stopping`` does.

    Raises:
        ValueError: for a bad `mode`, `patience` or `after`.
    """

    def __init__(self, monitor: str, patience: int = 3, min_delta: float = 0.0,
                 mode: str | None = None, restore_best: bool = False,
                 after: str = "epoch") -> None:
        check_mode(mode)
        patience = check_int("EarlyStopping", "patience", patience, "Pass e.g. patience=3.")
        if after not in ("epoch", "evaluation"):
            raise ValueError(f"`after` (got {after!r}) must be 'epoch' or 'evaluation'.")
        self.after = after
        # Dispatched at the epoch's end or the evaluation's, never both.
        unused = "on_eval_end" if after == "epoch" else "on_epoch_end"
        self.active_hooks = overridden_hooks(self) - {unused}
        self.monitor = monitor
        self.requires = (monitor,)
        self.patience = patience
        self.tracker = BestTracker(monitor, mode, min_delta)
        self.restore_best = restore_best
        self.best_weights: dict[str, torch.Tensor] | None = None

    @property
    def mode(self) -> str:
        """``"min"`` or ``"max"``."""
        return self.tracker.mode

    @property
    def best(self) -> float | None:
        """The best value so far."""
        return self.tracker.best

    @property
    def best_step(self) -> int | None:
        """The global step of the best value."""
        return self.tracker.best_step

    @property
    def wait(self) -> int:
        """Triggers since the last improvement."""
        return self.tracker.wait

    def trigger(self, state: RunState) -> None:
        value = lookup(state.metrics, self.monitor, "EarlyStopping")
        if value is None:  # nothing measured yet
            return
        if self.tracker.update(value, state.global_step):
            if self.restore_best:
                model = trained_model(state.trainer, "EarlyStopping(restore_best=True)")
                self.best_weights = {k: v.detach().to("cpu", copy=True)
                                     for k, v in model.state_dict().items()}
            return
        if self.wait >= self.patience:
            unit = "epochs" if self.after == "epoch" else "evaluations"
            state.request_stop(f"early stopping: {self.monitor} did not improve for "
                               f"{self.wait} {unit} (best {self.best:.6g} at step "
                               f"{self.best_step})")
            logger.info("Early stopping at step %d: %s did not improve on %.6g for %d %s.",
                        state.global_step, self.monitor, self.best, self.wait, unit)

    def on_epoch_end(self, state: RunState) -> None:
        self.trigger(state)

    def on_eval_end(self, state: RunState, logs: dict[str, Any]) -> None:
        self.trigger(state)

    def on_train_end(self, state: RunState) -> None:
        if self.restore_best and self.best_weights is not None:
            trained_model(state.trainer, "EarlyStopping").load_state_dict(self.best_weights)
            logger.info("Restored the weights of step %s (%s = %.6g).", self.best_step,
                        self.monitor, self.best)

    def state_dict(self) -> dict[str, Any]:
        return {**self.tracker.state_dict(), "best_weights": self.best_weights}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state_dict)
        self.best_weights = state_dict.get("best_weights")


class StopAtTimeLimit(Callback):
    """Stops training cleanly after `seconds` of training in this process (checked after every
    step, so the overrun is at most one step). The stop is a pause: run again, training goes on
    from the checkpoint it saves, and an epoch it cut short ends once, in the run that finishes
    it.

    Raises:
        ValueError: if `seconds` is not a positive finite number (NaN would never stop).
    """

    def __init__(self, seconds: float) -> None:
        if not (is_scalar(seconds) and 0 < seconds < math.inf):
            raise ValueError(f"StopAtTimeLimit: `seconds` (got {seconds!r}) must be a positive "
                             "number of seconds. Pass e.g. StopAtTimeLimit(3600) for an hour.")
        self.seconds = seconds
        self._deadline = math.inf

    def on_train_begin(self, state: RunState) -> None:
        self._deadline = time.monotonic() + self.seconds

    def on_step_end(self, state: RunState) -> None:
        if time.monotonic() >= self._deadline and not state.stop_requested:
            state.request_stop(f"time limit of {self.seconds:g}s reached", pause=True)
            logger.info("Time limit of %gs reached at step %d: stopping.", self.seconds,
                        state.global_step)
