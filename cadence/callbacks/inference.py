"""`InferenceRunner`: evaluates the model on held-out data at each trigger (tensorpack's
``InferenceRunner`` with ``ScalarStats``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from cadence.core.callbacks import Callback, RunState
from cadence.engine.external_metrics import move_metrics, read_metric
from cadence.engine.metrics import Mean


def batch_size_of(batch: Any) -> int:
    """Examples in a batch: the length of its first tensor or array (1 if unknown)."""
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    try:
        return len(first)
    except TypeError:
        return 1


def _host_results(name: str, value: Any) -> dict[str, Any]:
    """A computed metric on the host: a scalar as a float, an array as a list, a mapping (a
    collection's results) key by key as ``name/key``."""
    if isinstance(value, Mapping):
        results: dict[str, Any] = {}
        for key, item in value.items():
            results.update(_host_results(f"{name}/{key}", item))
        return results
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return {name: float(value) if value.numel() == 1 else value.tolist()}
    return {name: value}


class InferenceRunner(Callback):
    """Runs ``infer_fn(model, batch) -> {name: scalar tensor}`` over `data` in eval mode without
    gradients, and records the example-weighted means as ``state.metrics[prefix + name]``.

    Metrics that need the whole pass (a torchmetrics ``Metric`` or ``MetricCollection``, or a
    cadence metric) go in `metrics`: ``infer_fn`` updates them (they are in its closure); the
    runner moves torchmetrics' to the model's device, resets them before each pass and reads
    them once after it (``compute()``, which gathers every rank's states).

    Args:
        data: an iterable of batches, iterated afresh at each trigger.
        infer_fn: computes the per-batch means of the metrics in `names` (and updates those of
            `metrics`).
        names: the metric names `infer_fn` returns (declared, so that a callback that reads one
            can be checked to come after this one).
        prefix: prepended to each name.
        model: the model to evaluate; default ``state.trainer.model``.
        metrics: metrics over the whole pass, by name.
    """

    def __init__(self, data: Iterable[Any],
                 infer_fn: Callable[[nn.Module, Any], Mapping[str, Any]],
                 names: Iterable[str], prefix: str = "validation_",
                 model: nn.Module | None = None,
                 metrics: Mapping[str, Any] | None = None) -> None:
        self.data = data
        self.infer_fn = infer_fn
        self.names = tuple(names)
        self.prefix = prefix
        self.model = model
        self.metrics = dict(metrics or {})
        self.provides = tuple(prefix + name for name in (*self.names, *self.metrics))
        self.last_results: dict[str, Any] = {}

    def trigger(self, state: RunState) -> None:
        model = self.model if self.model is not None else state.trainer.model
        was_training = model.training
        model.eval()
        means = {name: Mean() for name in self.names}
        parameter = next(iter(model.parameters()), None)
        if parameter is not None:
            move_metrics(self.metrics.values(), parameter.device)
        for metric in self.metrics.values():
            metric.reset()
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
        for name, metric in self.metrics.items():
            self.last_results.update(_host_results(self.prefix + name, read_metric(metric)))
        state.put_metrics(self.last_results)

    def on_epoch_end(self, state: RunState) -> None:
        self.trigger(state)
