"""`LossGuard`: what happens when the training loss becomes NaN, infinite or blows up.

It reads the loop's mean loss once per loop, from logs the Controller has already moved to the
host, so it adds no device sync. A finite mean loss does not prove finite weights (one NaN
gradient in a loop's last step leaves the mean finite and the weights NaN), so before each
checkpoint the Controller will save after a loop, it also checks that the trainable weights
are finite: one reduction and one host sync per save, none per step. Policies (`max_trials`;
a Task config's ``trainer.recovery_max_trials``), for either problem:

* ``-1``: log a warning and go on;
* ``0`` (default): stop training with `cadence.DivergenceError` (a `FloatingPointError` and a
  `RuntimeError`) *before* the bad weights are saved;
* ``k > 0``: restore the newest checkpoint -- weights, optimizer, schedule and step -- but keep
  the data position and random state where they are, so the batches that blew up are skipped
  rather than replayed identically; after ``k`` blow-ups in a row, fail as with ``0``.

Unlike TF Model Garden, failures are counted in a row (a healthy loop resets the count), not
over the whole run.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from cadence.callbacks.logdir import run_directory
from cadence.core.callbacks import Callback, RunState
from cadence.core.controller import Controller
from cadence.core.errors import DivergenceError
from cadence.core.intervals import check_int
from cadence.engine.finite import nonfinite
from cadence.engine.rng import capture_rng_state, restore_rng_state

logger = logging.getLogger("cadence")


class LossGuard(Callback):
    """Checks the loop's loss against NaN, infinity and an upper bound.

    Args:
        key: the loss in the loop's logs.
        upper_bound: a finite loss above this is a blow-up (from `begin_step` on).
        begin_step: the step from which `upper_bound` applies (NaN and infinity always count).
        max_trials: -1 ignores blow-ups; 0 fails on the first; k restores up to k times in a
            row.
    """

    def __init__(self, key: str = "training_loss", upper_bound: float = math.inf,
                 begin_step: int = 0, max_trials: int = 0) -> None:
        max_trials = check_int("LossGuard", "max_trials", max_trials,
                               "Pass -1 to ignore blow-ups, 0 to fail on the first, or k to "
                               "restore up to k times in a row.", minimum=-1)
        if not isinstance(upper_bound, (int, float)) or math.isnan(upper_bound) or (
                upper_bound < 0):
            raise ValueError(f"`upper_bound` (got {upper_bound!r}) must be a number >= 0 "
                             "(math.inf disables the bound).")
        self.key = key
        self.upper_bound = upper_bound
        self.begin_step = begin_step
        self.max_trials = max_trials
        self.failures_in_a_row = 0

    def _weights_problem(self, state: RunState) -> str | None:
        """Why the trainer's trainable weights must not be saved (not finite), or None. Each
        rank looks at its own shards and the ranks agree (`cadence.engine.finite`)."""
        trainer = state.trainer
        if trainer is None:
            return None
        tensors = [t for t in trainer.trainable_variables
                   if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
        found = nonfinite(tensors)  # a host sync, and a collective under torchrun
        if not found:
            return None
        model = trainer.model
        names = ({id(p): n for n, p in model.named_parameters()}
                 if isinstance(model, torch.nn.Module) else {})
        bad = [names.get(id(tensors[i]), f"a tensor of shape {tuple(tensors[i].shape)}")
               for i in found.here]
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        where = (f"in {', '.join(bad[:3])}{more}" if bad else
                 "in weights of another pipeline stage")
        return (f"the weights about to be checkpointed are not finite (NaN or infinity "
                f"{where}) although the mean {self.key} is finite: a NaN or infinite gradient")

    def _problem(self, value: Any, step: int) -> str | None:
        if not isinstance(value, (int, float)):
            return None
        if not math.isfinite(value):
            return f"{self.key} is {value}"
        if step >= self.begin_step and value > self.upper_bound:
            return f"{self.key} = {value:.6g} is above the upper bound {self.upper_bound:g}"
        return None

    def on_loop_end(self, state: RunState, logs: dict[str, Any]) -> None:
        problem = self._problem(logs.get(self.key), state.global_step)
        controller = state.controller
        if problem is None and isinstance(controller, Controller) and (
                controller.checkpoint_follows_loop()):
            problem = self._weights_problem(state)
        if problem is None:
            self.failures_in_a_row = 0
            return
        if self.max_trials == -1:
            logger.warning("At step %d %s; going on (recovery disabled).", state.global_step,
                           problem)
            return
        self.failures_in_a_row += 1
        if self.failures_in_a_row > self.max_trials:
            raise DivergenceError(
                f"Training diverged at step {state.global_step}: {problem}. The weights of this "
                "loop were not saved. Lower the learning rate, clip the gradients, or give "
                "LossGuard max_trials=k to restore the last checkpoint up to k times."
            )
        trainer = state.trainer
        if not isinstance(controller, Controller) or controller.checkpoint_manager is None:
            raise DivergenceError(f"Training diverged at step {state.global_step}: {problem}, "
                                  "and nothing to restore from: LossGuard restores through the "
                                  "checkpoint manager of a Controller, and this run has none.")
        data = trainer.train_iterator if trainer is not None else None  # the data position
        data_state = data.state_dict() if data is not None else None
        rng = capture_rng_state()
        bad_step = state.global_step
        path = controller.restore_checkpoint()
        if path is None:
            raise DivergenceError(
                f"Training diverged at step {bad_step}: {problem}, and no checkpoint exists yet "
                "to restore. Save checkpoints more often (a smaller checkpoint interval)."
            )
        if data is not None and data_state is not None:
            data.load_state_dict(data_state)
        restore_rng_state(rng)
        run = run_directory(state)
        if run is not None:  # the summaries go back to this step: say why
            run.record_resume(controller.global_step, path, reason="recovery")
        logger.warning(
            "At step %d %s: restored %s (step %d), skipping the batches since then (attempt %d "
            "of %d).", bad_step, problem, path, controller.global_step, self.failures_in_a_row,
            self.max_trials,
        )
