"""`InferenceRunner`: evaluates the model on held-out data at each trigger (tensorpack's
``InferenceRunner`` with ``ScalarStats``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from cadence.core.callbacks import Callback, RunState
from cadence.engine.metrics import Mean


def batch_size_of(batch: Any) -> int:
    """Examples in a batch: the length of its first tensor or array (1 if unknown)."""
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    try:
        return len(first)
    except TypeError:
        return 1


class InferenceRunner(Callback):
    """Runs ``infer_fn(model, batch) -> {name: scalar tensor}`` over `data` in eval mode without
    gradients, and records the example-weighted means as ``state.metrics[prefix + name]``.

    Args:
        data: an iterable of batches, iterated afresh at each trigger.
        infer_fn: computes the per-batch means of the metrics.
        names: the metric names `infer_fn` returns (declared, so that a callback that reads one
            can be checked to come after this one).
        prefix: prepended to each name.
        model: the model to evaluate; default ``state.trainer.model``.
    """

    def __init__(self, data: Iterable[Any],
                 infer_fn: Callable[[nn.Module, Any], Mapping[str, Any]],
                 names: Iterable[str], prefix: str = "validation_",
                 model: nn.Module | None = None) -> None:
        self.data = data
        self.infer_fn = infer_fn
        self.names = tuple(names)
        self.prefix = prefix
        self.model = model
        self.provides = tuple(prefix + name for name in self.names)
        self.last_results: dict[str, float] = {}

    def trigger(self, state: RunState) -> None:
        model = self.model if self.model is not None else state.trainer.model
        was_training = model.training
        model.eval()
        means = {name: Mean() for name in self.names}
        try:
            with torch.no_grad():
                for batch in self.data:
                    outputs = self.infer_fn(model, batch)
                    weight = float(batch_size_of(batch))
                    for name in self.names:
                        means[name].update(outputs[name], weight)
        finally:
            model.train(was_training)
        self.last_results = {self.prefix + name: float(mean.result())
                             for name, mean in means.items()}
        state.put_metrics(self.last_results)

    def on_epoch_end(self, state: RunState) -> None:
        self.trigger(state)
