"""`StepExecutor`: the one place where a training step's forward, loss and backward happen.

A step is one or more microbatches (gradient accumulation: ``microbatches`` batches, one
update). For each, in order::

    with autocast(dtype), no gradient sync unless it is the step's last microbatch:
        loss = loss_fn(microbatch)          # the model's forward, the loss, the metrics' updates
    (loss / microbatches, scaled by fp16's GradScaler).backward()   # when it has a gradient

The update -- clipping, the optimizer's step, the schedule -- is the caller's: the executor
leaves the gradients where backward put them. A loss without a gradient (a step that updated the
weights itself, a GAN's) is only returned.

Between microbatches the gradients are not averaged across ranks: DDP's ``no_sync()`` and FSDP2's
``set_requires_gradient_sync(False)``, then on for the last one, so a step of N microbatches
costs one gradient all-reduce, not N.

The Task `Trainer` runs every step through one (`loss_fn`: the task's default forward, or its own
``train_step``); a `cadence.StandardTrainer` of one's own may too::

    executor = StepExecutor(model, lambda batch: loss_of(model(batch[0]), batch[1]),
                            microbatches=4)

    def train_step(self, iterator):
        executor.run([next(iterator) for _ in range(4)])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

A pipeline-parallel step (`cadence.engine.pipeline`) is the same seam with the model split into
stages: one batch, split into microbatches that the pipeline's schedule runs through them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn


class StepExecutor:
    """Runs the forward, loss and backward of a step's microbatches (see the module docstring).

    Args:
        model: the module that trains (a DDP or FSDP2 module switches its gradient sync
            between microbatches).
        loss_fn: one microbatch's loss: calls the model, computes the loss (with its gradient,
            for the executor's backward), updates metrics.
        microbatches: microbatches per step (gradient accumulation).
        autocast: the dtype of the forward's autocast (bf16, fp16), or None.
        scaler: fp16's ``torch.amp.GradScaler``, or None.

    Raises:
        ValueError: for `microbatches` that is not a positive int.
    """

    def __init__(self, model: nn.Module, loss_fn: Callable[[Any], torch.Tensor],
                 microbatches: int = 1, autocast: torch.dtype | None = None,
                 scaler: torch.amp.GradScaler | None = None) -> None:
        if type(microbatches) is not int or microbatches < 1:
            raise ValueError(f"StepExecutor: `microbatches` (got {microbatches!r}) must be a "
                             "positive int: the batches each step runs before its update.")
        self.model = model
        self.loss_fn = loss_fn
        self.microbatches = microbatches
        self.autocast = autocast
        self.scaler = scaler
        self._device_type = next((p.device.type for p in model.parameters()), "cpu")
        self._switches_sync = microbatches > 1 and (
            isinstance(model, nn.parallel.DistributedDataParallel)
            or callable(getattr(model, "set_requires_gradient_sync", None)))
        self._plain = autocast is None and not self._switches_sync
        """Nothing to enter around a microbatch: no autocast, no sync switch (the common
        case, and the cheapest)."""

    def run(self, batches: Sequence[Any]) -> tuple[torch.Tensor, bool]:
        """Runs the step's forward, loss and backward over `batches` (its microbatches).

        Returns:
            The last microbatch's loss, and whether any backward ran (a loss had a gradient).
        """
        loss: Any = None
        backward = False
        last = len(batches) - 1
        for index, batch in enumerate(batches):
            if self._plain:
                loss = self.loss_fn(batch)
            else:
                with self._context(last=index == last):
                    loss = self.loss_fn(batch)
            if loss.requires_grad:
                self._backward(loss)
                backward = True
        return loss, backward

    def _context(self, last: bool) -> contextlib.ExitStack:
        """Autocast, and -- but for the step's last microbatch -- no gradient sync."""
        stack = contextlib.ExitStack()
        model = self.model
        if self._switches_sync:
            if isinstance(model, nn.parallel.DistributedDataParallel):
                if not last:
                    stack.enter_context(model.no_sync())
            else:  # FSDP2
                model.set_requires_gradient_sync(last)  # type: ignore[operator]
        if self.autocast is not None:
            stack.enter_context(torch.autocast(self._device_type, dtype=self.autocast))
        return stack

    def _backward(self, loss: torch.Tensor) -> None:
        if self.microbatches > 1:
            loss = loss / self.microbatches
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
