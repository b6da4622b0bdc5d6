"""The runner protocol (Orbit): the only thing a Controller needs from a trainer or evaluator."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from cadence.engine.module import Module

Output = Mapping[str, Any]
"""Logs: names to tensors, arrays, numbers, or nested `Output`. Nesting becomes sub-directories
of the summaries."""


class AbstractTrainer(Module, metaclass=abc.ABCMeta):
    """A `Module` that trains in inner loops of `num_steps` steps."""

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
