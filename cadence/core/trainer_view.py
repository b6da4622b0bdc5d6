"""`TrainerView`: what a callback reads of the trainer a run drives, declared once.

``RunState.trainer`` is a `TrainerView`: the built-in callbacks read these members and nothing
else, without probing (``getattr(state.trainer, "model", None)``), and a user's callback gets
the same typed view. Every front-end's trainer is one -- `cadence.StandardTrainer` (and so the
Task `Trainer` and the tensorpack trainers) and `cadence.tfsnippet.TrainLoop` -- with None for
what it does not have (a runner whose step reads its own input has no ``train_iterator``). A
trainer that is not one (any object with ``train(num_steps)``) is shown through
`PlainTrainerView`, which answers None for the members the object lacks and passes every other
attribute through to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from cadence.core.progress import Progress

VIEW_MEMBERS = ("global_step", "model", "optimizer", "progress", "train_iterator",
                "examples_per_step", "data_wait_s", "trainable_variables", "logdir")


@runtime_checkable
class TrainerView(Protocol):
    """The members of a trainer that callbacks read (see the module docstring)."""

    @property
    def global_step(self) -> int | None:
        """Completed steps, as the trainer counts them now -- also in the middle of a loop (a
        Python int: reading it never waits for a device)."""

    @property
    def model(self) -> Any:
        """The ``nn.Module`` trained (what exports, early stopping's best weights and the model
        summary read), or None."""

    @property
    def optimizer(self) -> Any:
        """The optimizer (what learning-rate schedules set and hyper-parameter logs read), or
        None."""

    @property
    def progress(self) -> Progress | None:
        """The run's step and epoch counters (`cadence.core.progress`), or None for a trainer
        that counts its own steps."""

    @property
    def train_iterator(self) -> Any:
        """The iterator over the training data, whose position (``state_dict`` /
        ``load_state_dict``) a loss guard keeps when it restores a checkpoint, or None."""

    @property
    def examples_per_step(self) -> int | None:
        """Examples in a step (one rank's), when the data says (for examples/sec)."""

    @property
    def data_wait_s(self) -> float:
        """Seconds the training thread has waited for its input so far (a host clock, read
        around each fetch: no device sync); the run's timeline records each loop's share."""

    @property
    def trainable_variables(self) -> Sequence[Any]:
        """The trained tensors (a loss guard checks that they are finite)."""

    @property
    def logdir(self) -> Any:
        """The trainer's own run directory (tensorpack's ``logdir``), or None."""


class PlainTrainerView:
    """A `TrainerView` of a trainer that is not one: each member it lacks is None (an empty
    sequence of variables); every other attribute is the trainer's own.

    Args:
        trainer: any object with ``train(num_steps)``.
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def __getattr__(self, name: str) -> Any:
        if name in VIEW_MEMBERS:  # read when asked: a trainer may set its model later
            default: Any = {"trainable_variables": (), "data_wait_s": 0.0}.get(name)
            return getattr(self.trainer, name, default)
        return getattr(self.trainer, name)

    def __repr__(self) -> str:
        return f"PlainTrainerView({self.trainer!r})"


def view_of(trainer: Any) -> TrainerView | None:
    """`trainer` itself when it is a `TrainerView`, else a `PlainTrainerView` of it (None for
    None)."""
    if trainer is None or isinstance(trainer, TrainerView):
        return trainer
    return PlainTrainerView(trainer)


def trained_model(trainer: TrainerView | None, what: str) -> Any:
    """``trainer.model``, for `what` (a callback's name) that needs it.

    Raises:
        ValueError: when there is no trainer or it has no model.
    """
    model = trainer.model if trainer is not None else None
    if model is None:
        raise ValueError(f"{what} reads the trainer's model (state.trainer.model), and this "
                         "run's trainer has none: name the trained module `self.model` in the "
                         f"trainer, or pass the model to {what}.")
    return model
