"""`refuse_a_step_that_trained_nothing`: a Task's overridden ``train_step`` that trains nothing
is an error at its first step, not a run whose weights never move.

A task may override ``train_step`` to update the weights itself (a GAN with two optimizers) and
return detached values; the Trainer then only counts the step. The same override with a loss
computed under ``torch.no_grad()`` or ``.detach()``ed looks alike from outside -- a loss without
gradient -- but updates nothing. What tells them apart is whether the step touched a weight or a
gradient: the version counters torch keeps on every tensor, host-side attributes read without
a device sync, before and after the first step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

Marks = list[tuple[int, int, int]]


def update_marks(tensors: Iterable[torch.Tensor]) -> Marks:
    """For each trainable tensor: its version counter, and its gradient's identity and version
    counter. A step that updates a weight in place (``optimizer.step()``, an in-place op under
    ``torch.no_grad()``) or computes gradients (``loss.backward()``) changes some of them."""
    return [(t._version, id(t.grad), -1 if t.grad is None else t.grad._version)
            for t in tensors]


def refuse_a_step_that_trained_nothing(task: Any, before: Marks,
                                       tensors: Iterable[torch.Tensor], updated: bool) -> None:
    """Refuses the first step of `task`'s overridden ``train_step`` if it trained nothing: its
    loss has no gradient for the Trainer to update with (`updated` is False), and the step
    neither updated a weight nor computed a gradient itself (the marks taken `before` it are
    those of `tensors` now). A task that updates the weights itself passes, and so does one
    whose loss keeps its gradient.

    Known limit: a step that writes weights through ``.data`` (which bumps no version counter)
    and calls no ``backward`` is refused although it trained.

    Raises:
        RuntimeError: if the step trained nothing while there are weights to train.
    """
    if updated or not before or update_marks(tensors) != before:
        return
    raise RuntimeError(
        f"{type(task).__name__}.train_step() returned a loss {task.loss!r} that has no gradient "
        "(requires_grad=False) and updated no weight, so training would change nothing. Was the "
        "loss computed under torch.no_grad() or .detach()ed? Return it with its gradient for "
        "the Trainer to update the weights, or update them in train_step with the optimizer "
        "(and return detached values).")
