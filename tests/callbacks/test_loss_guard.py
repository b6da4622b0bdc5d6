"""LossGuard on its own: its errors speak of its own arguments, in every front-end."""

import math

import pytest

import cadence
from cadence.core.callbacks import RunState


class Driver:
    """What drives a run but is not a Controller (a TrainLoop, say)."""

    checkpoint_manager = object()

    def save_checkpoint(self) -> str:
        return "ckpt"


def test_a_divergence_names_lossguards_arguments_not_a_task_configs_keys():
    with pytest.raises(cadence.DivergenceError) as error:
        cadence.LossGuard().on_loop_end(RunState(global_step=7), {"training_loss": math.nan})
    message = str(error.value)
    assert message.startswith("Training diverged at step 7: training_loss is nan.")
    assert "LossGuard max_trials=k" in message and "trainer." not in message


def test_recovery_without_a_controller_is_a_divergence_error_that_says_so():
    guard = cadence.LossGuard(max_trials=1)
    with pytest.raises(cadence.DivergenceError, match=r"restores through the checkpoint "
                       r"manager of a Controller, and this run has none"):
        guard.on_loop_end(RunState(global_step=7, controller=Driver()),
                          {"training_loss": math.inf})
