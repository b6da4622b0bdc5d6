"""`Progress`: where a run is -- steps and epochs -- with one meaning in every front-end.

The Controller's runners, the tensorpack trainers and `TrainLoop` all count with it, and every
callback sees its numbers in `RunState`:

``global_step``
    Steps completed (0 before the first). A step is one call of the step function
    (``train_step``, ``run_step``, one iteration of ``iter_steps``), however many updates it
    makes: a GAN step that updates the discriminator twice and the generator once is one step.
``epoch``
    The number of the epoch running, from 1, from its ``on_epoch_begin`` to its
    ``on_epoch_end``; between epochs, the number of the last one (0 before the first). So an
    ``on_epoch_begin`` of the first epoch sees 1, and so does its ``on_epoch_end``.
``epoch_step``
    Steps completed in that epoch.
``epoch_finished``
    Whether that epoch ran to its end: its pass over the data ended, or it made its
    ``steps_per_epoch`` steps. A stop request ends an epoch early -- its end hooks run -- but
    does not finish it: a run resumed from there reopens it, with the same number, at the step
    where it stopped, and its begin hooks run again in the new process.

``epochs_completed`` is ``epoch`` when it finished, else ``epoch - 1``.

Only the run clock (`cadence.core.clock.RunClock`) writes these numbers; everyone else reads
them -- callbacks through `RunState`, which reads through to the run's `Progress`.

A step whose body is running (``step_running``: between the clock's ``begin_step`` and
``end_step``) is not counted in ``global_step`` yet, but what a checkpoint taken now holds
(`state_dict`) and what `RunState` shows count it as done: `TrainLoop`'s step is the body of the
user's ``for`` loop, where a checkpoint, a print and its callbacks all belong to the step
running.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Progress:
    """The step and epoch counters of a run (see the module docstring); saved in checkpoints.

    Attributes:
        global_step: steps completed.
        epoch: the epoch running, or the last one between epochs.
        epoch_step: steps completed in `epoch`.
        epoch_finished: whether `epoch` ran to its end.
        epoch_open: whether `epoch`'s begin hooks ran and its end hooks have not (this
            process's bookkeeping: not saved).
        step_running: whether a step's body is running (this process's bookkeeping: saved
            as done, see the module docstring).
    """

    global_step: int = 0
    epoch: int = 0
    epoch_step: int = 0
    epoch_finished: bool = True
    epoch_open: bool = False
    step_running: bool = False

    @property
    def epochs_completed(self) -> int:
        """Epochs that ran to their end."""
        return self.epoch if self.epoch_finished else self.epoch - 1

    @property
    def steps_taken(self) -> int:
        """`global_step`, counting a step whose body is running as done: what a checkpoint
        taken now holds, and what callbacks see as ``state.global_step``."""
        return self.global_step + self.step_running

    def state_dict(self) -> dict[str, Any]:
        running = int(self.step_running)
        return {"global_step": self.global_step + running, "epoch": self.epoch,
                "epoch_step": self.epoch_step + running, "epoch_finished": self.epoch_finished}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])
        self.epoch = int(state.get("epoch", 0))
        self.epoch_step = int(state.get("epoch_step", 0))
        self.epoch_finished = bool(state.get("epoch_finished", True))
        self.epoch_open = self.step_running = False
