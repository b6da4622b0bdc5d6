"""The runner protocol (Orbit): the only thing a Controller needs from a trainer or evaluator."""

from __future__ import annotations

import abc
from typing import Any

from cadence.core.progress import Progress
from cadence.engine.module import Module

Output = Any
"""What `train` and `evaluate` return (Orbit's ``orbit.runner.Output``): a tensor, an array, a
number, or a mapping of names to them (nested mappings too). The Controller writes a mapping as
summaries -- nesting becomes sub-directories -- and says once that it writes nothing of any
other output (`cadence.core.logs.summary_logs`)."""


class AbstractTrainer(Module, metaclass=abc.ABCMeta):
    """A `Module` that trains in inner loops of `num_steps` steps.

    It is a `cadence.core.trainer_view.TrainerView` -- what callbacks read of a trainer --
    with None for each member a subclass does not set: a subclass that trains a model names it
    ``self.model`` (and its optimizer ``self.optimizer``), so that exports, early stopping,
    schedules and summaries find them.
    """

    model: Any = None
    """The ``nn.Module`` trained, or None."""
    optimizer: Any = None
    """The optimizer, or None."""
    logdir: Any = None
    """The trainer's own run directory, or None."""

    @property
    def progress(self) -> Progress | None:
        """The step and epoch counters, when the trainer counts on a run clock."""
        return None

    @property
    def train_iterator(self) -> Any:
        """The iterator over the training data, with its position, or None."""
        return None

    @property
    def examples_per_step(self) -> int | None:
        """Examples in a step, when the data says."""
        return None

    @property
    def data_wait_s(self) -> float:
        """Seconds the training thread waited for input so far (0: a trainer that does not
        say)."""
        return 0.0

    @abc.abstractmethod
    def train(self, num_steps: int) -> Output | None:
        """Runs `num_steps` steps of training.

        The Controller calls this for the inner loop, which amortizes the cost of bookkeeping
        (checkpoints, evaluation, summaries) over `num_steps` steps. What a step is belongs to
        the implementation: a GAN step may do several updates. The global step must advance by
        exactly `num_steps` unless training stops early.

        Returns:
            None, or logs to write as summaries (nested mappings become sub-directories).
        """


class AbstractEvaluator(Module, metaclass=abc.ABCMeta):
    """A `Module` that evaluates."""

    @abc.abstractmethod
    def evaluate(self, num_steps: int) -> Output | None:
        """Runs `num_steps` steps of evaluation; -1 means until the data is exhausted.

        Returns:
            None, or logs to write as summaries (nested mappings become sub-directories).
        """
