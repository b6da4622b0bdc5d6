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
    """

    global_step: int = 0
    epoch: int = 0
    epoch_step: int = 0
    epoch_finished: bool = True
    epoch_open: bool = False

    @property
    def epochs_completed(self) -> int:
        """Epochs that ran to their end."""
        return self.epoch if self.epoch_finished else self.epoch - 1

    def begin_epoch(self) -> None:
        """Opens the next epoch, or reopens one that a stop ended early."""
        if self.epoch_finished:
            self.epoch += 1
            self.epoch_step = 0
            self.epoch_finished = False
        self.epoch_open = True

    def count_step(self) -> None:
        """Counts one completed step."""
        self.global_step += 1
        self.epoch_step += 1

    def finish_epoch(self) -> None:
        """Marks the running epoch as run to its end."""
        self.epoch_finished = True

    def end_epoch(self) -> None:
        """Closes the running epoch (its end hooks run)."""
        self.epoch_open = False

    def state_dict(self) -> dict[str, Any]:
        return {"global_step": self.global_step, "epoch": self.epoch,
                "epoch_step": self.epoch_step, "epoch_finished": self.epoch_finished}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])
        self.epoch = int(state.get("epoch", 0))
        self.epoch_step = int(state.get("epoch_step", 0))
        self.epoch_finished = bool(state.get("epoch_finished", True))
        self.epoch_open = False
