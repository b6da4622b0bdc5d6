"""`LossGuard`: what happens when the training loss becomes NaN, infinite or blows up.

It reads the loop's mean loss once per loop, from logs the Controller has already moved to the
host, so it adds no device sync. Policies (``trainer.recovery_max_trials``):

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

from cadence.core.callbacks import Callback, RunState
from cadence.core.errors import DivergenceError
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
        if max_trials < -1:
            raise ValueError(f"`max_trials` (got {max_trials}) must be -1, 0 or positive.")
        self.key = key
        self.upper_bound = upper_bound
        self.begin_step = begin_step
        self.max_trials = max_trials
        self.failures_in_a_row = 0

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
                "loop were not saved. Lower the learning rate, set "
                "trainer.optimizer_config.gradient_clip_norm, or set "
                "trainer.recovery_max_trials=k to restore the last checkpoint up to k times."
            )
        controller, trainer = state.controller, state.trainer
        if controller is None or controller.checkpoint_manager is None:
            raise DivergenceError(f"Training diverged at step {state.global_step}: {problem}, "
                                     "and there is no checkpoint manager to restore from.")
        data = getattr(trainer, "_train_data", None)
        data_state = data.state_dict() if data is not None else None
        rng = capture_rng_state()
        bad_step = state.global_step
        path = controller.restore_checkpoint()
        if path is None:
            raise DivergenceError(
                f"Training diverged at step {bad_step}: {problem}, and no checkpoint exists yet "
                "to restore. Set a smaller trainer.checkpoint_interval."
            )
        if data is not None and data_state is not None:
            data.load_state_dict(data_state)
        restore_rng_state(rng)
        logger.warning(
            "At step %d %s: restored %s (step %d), skipping the batches since then (attempt %d "
            "of %d).", bad_step, problem, path, controller.global_step, self.failures_in_a_row,
            self.max_trials,
        )
