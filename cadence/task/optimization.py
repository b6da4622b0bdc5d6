"""Optimizers, learning-rate schedules and weight averaging built from the config.

`create_optimizer` builds a `torch.optim` optimizer from an `OptimizerConfig`;
`create_lr_schedule` a ``LambdaLR`` whose multiplier is a linear warmup followed by the
configured decay, stepped once per training step. `ExponentialMovingAverage` keeps the averaged
weights that evaluation and exports use when ``trainer.ema.enabled``.

>>> from torch import nn
>>> from cadence.task.config import OptimizationConfig
>>> config = OptimizationConfig()
>>> config.learning_rate.schedule, config.learning_rate.warmup_steps = "cosine", 10
>>> multiplier = lr_multiplier(config.learning_rate, train_steps=110)
>>> [round(multiplier(step), 3) for step in (0, 5, 10, 60, 110)]
[0.0, 0.5, 1.0, 0.5, 0.0]
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from cadence.task.config import LearningRateConfig, OptimizerConfig

_OPTIMIZERS: dict[str, tuple[str, tuple[str, ...]]] = {
    # name: (torch.optim class, the config fields it takes besides lr and weight_decay)
    "sgd": ("SGD", ("momentum", "nesterov")),
    "adam": ("Adam", ("betas", "eps")),
    "adamw": ("AdamW", ("betas", "eps")),
    "rmsprop": ("RMSprop", ("momentum", "eps")),
    "adagrad": ("Adagrad", ("eps",)),
}


def create_optimizer(
    config: OptimizerConfig, parameters: nn.Module | Iterable[Any]
) -> torch.optim.Optimizer:
    """The `torch.optim` optimizer that `config` describes, over `parameters` (a module's
    trainable parameters, or parameter groups).

    Raises:
        ValueError: for an unknown optimizer name or an argument it does not take.
    """
    if config.name not in _OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {config.name!r}; valid: {', '.join(_OPTIMIZERS)}.")
    class_name, fields = _OPTIMIZERS[config.name]
    cls = getattr(torch.optim, class_name)
    if isinstance(parameters, nn.Module):
        parameters = [p for p in parameters.parameters() if p.requires_grad]
    kwargs: dict[str, Any] = {"lr": config.learning_rate, "weight_decay": config.weight_decay}
    for name in fields:
        value = getattr(config, name)
        kwargs[name] = tuple(value) if isinstance(value, list) else value
    kwargs.update(config.kwargs)
    try:
        return cls(parameters, **kwargs)
    except TypeError as error:
        raise ValueError(
            f"torch.optim.{class_name} rejected the config's arguments {sorted(kwargs)}: {error}. "
            "Fix trainer.optimizer_config.optimizer.kwargs."
        ) from error


def lr_multiplier(config: LearningRateConfig, train_steps: int) -> Callable[[int], float]:
    """The learning-rate multiplier as a function of the step: warmup, then decay."""
    warmup = config.warmup_steps
    decay_steps = config.decay_steps or max(train_steps - warmup, 1)
    start, end = config.warmup_init_factor, config.end_factor

    def multiplier(step: int) -> float:
        if step < warmup:
            return start + (1.0 - start) * step / warmup
        t = min(step - warmup, decay_steps)
        if config.schedule == "cosine":
            return end + (1.0 - end) * 0.5 * (1.0 + math.cos(math.pi * t / decay_steps))
        if config.schedule == "linear":
            return 1.0 + (end - 1.0) * t / decay_steps
        if config.schedule == "step":
            return float(config.gamma ** ((step - warmup) // config.step_size))
        if config.schedule == "exponential":
            return float(config.gamma ** (step - warmup))
        return 1.0

    return multiplier


def create_lr_schedule(
    config: LearningRateConfig, optimizer: torch.optim.Optimizer, train_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` over `optimizer` with `lr_multiplier`, to be stepped once per step.

    Its state (the step count) is checkpointed; the multiplier itself is rebuilt from the
    config, so no function is ever pickled.
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(config, train_steps))


class ExponentialMovingAverage:
    """An averaged copy of a model's weights, updated after each step without host syncs.

    ``torch.optim.swa_utils.AveragedModel`` would read its update counter on the host each step
    (a device sync on a GPU); this keeps the step count on the host and updates all tensors with
    one fused ``lerp``.

    A sharded model (FSDP2, tensor parallelism: parameters that are DTensors) is averaged
    shard by shard: `average` is then a copy of the model spread over the ranks as the model
    is, and each rank averages its own shards -- no gather, no communication.

    Args:
        model: the model to average.
        decay: the decay per step.
        dynamic_decay: use ``min(decay, (1 + t) / (10 + t))`` at averaging step ``t``.
        start_step: until this step the average copies the weights.
        average: the module that holds the average, shaped (and sharded) as `model`; default a
            deep copy of `model`. It is put in eval mode, without gradients.
    """

    def __init__(self, model: nn.Module, decay: float = 0.999, dynamic_decay: bool = True,
                 start_step: int = 0, average: nn.Module | None = None) -> None:
        self.decay = decay
        self.dynamic_decay = dynamic_decay
        self.start_step = start_step
        self.model = model
        chosen = average if average is not None else copy.deepcopy(model)
        self.average = chosen.eval().requires_grad_(False)
        self._pairs = [
            (avg, live) for avg, live in zip(self._tensors(self.average), self._tensors(model))
        ]

    @property
    def sharded(self) -> bool:
        """Whether the average is spread over the ranks (its parameters are DTensors)."""
        return any(hasattr(p, "to_local") for p in self.average.parameters())

    @staticmethod
    def _tensors(model: nn.Module) -> list[torch.Tensor]:
        """The averaged tensors: each parameter's (this rank's shard of a DTensor) and the
        floating-point buffers."""
        tensors = [p.to_local() if hasattr(p, "to_local") else p.data
                   for p in model.parameters()]
        tensors += [b for b in model.buffers() if b.is_floating_point()]
        return tensors

    def decay_at(self, step: int) -> float:
        """The decay used by the update after `step` steps."""
        t = step - self.start_step
        if t <= 0:
            return 0.0
        return min(self.decay, (1.0 + t) / (10.0 + t)) if self.dynamic_decay else self.decay

    @torch.no_grad()
    def reset(self) -> None:
        """Makes the average the model's weights as they are now (after loading weights into
        the model, the average of the weights before means nothing)."""
        torch._foreach_copy_([a for a, _ in self._pairs], [w for _, w in self._pairs])

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Moves the average towards the current weights, after `step` completed steps."""
        averages = [a for a, _ in self._pairs]
        weights = [w for _, w in self._pairs]
        decay = self.decay_at(step)
        if decay == 0.0:
            torch._foreach_copy_(averages, weights)
        else:
            torch._foreach_lerp_(averages, weights, 1.0 - decay)

    def state_dict(self) -> dict[str, Any]:
        return self.average.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.average.load_state_dict(state_dict)
