"""`InferenceRunner`: evaluates the model on held-out data at each trigger (tensorpack's
``InferenceRunner`` with ``ScalarStats``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sized
from typing import Any

import torch
from torch import nn

from cadence.core.callbacks import Callback, RunState
from cadence.core.errors import MissingMetricError
from cadence.core.logs import plain_logs
from cadence.core.trainer_view import trained_model
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

    Attributes:
        last_results: the last pass's results, ``{prefix + name: value}`` on the host. Kept in
            checkpoints (`state_dict`, as `cadence.core.logs.plain_logs`), so a finished run
            run again has them without evaluating again; ``{}`` before the first pass.

    Raises:
        TypeError: if `infer_fn` is not callable (tensorpack's list of inferencers is
            `infer_fn` and `names` here), or `names` is a string rather than a list of them.
        ValueError: if `names` and `metrics` are both empty, or `data` is empty: the runner
            would evaluate nothing. At a trigger, also if `data` yields no batches.
        MissingMetricError: (a `KeyError`) at a trigger, if `infer_fn` does not return every
            name in `names`; the message lists what it returned.
    """

    def __init__(self, data: Iterable[Any],
                 infer_fn: Callable[[nn.Module, Any], Mapping[str, Any]],
                 names: Iterable[str] = (), prefix: str = "validation_",
                 model: nn.Module | None = None,
                 metrics: Mapping[str, Any] | None = None) -> None:
        if not callable(infer_fn):
            raise TypeError(
                f"InferenceRunner: `infer_fn` (got {infer_fn!r}) must be a function (model, "
                "batch) -> {name: scalar tensor}; tensorpack's list of inferencers is infer_fn "
                "and names here. Pass e.g. InferenceRunner(data, lambda model, batch: "
                "{'loss': loss_of(model, batch)}, names=['loss']).")
        if isinstance(names, str):
            raise TypeError(f"InferenceRunner: `names` (got {names!r}) must be a list of "
                            f"names, not one string. Pass names=[{names!r}].")
        names = tuple(names)
        if not names and not metrics:
            raise ValueError(
                f"InferenceRunner: `names` (got {list(names)!r}) and `metrics` (got "
                f"{metrics!r}) are both empty, so it would evaluate nothing. Pass the names "
                "infer_fn returns, e.g. names=['loss'], or metrics={'accuracy': metric}.")
        if isinstance(data, Sized) and len(data) == 0:
            raise ValueError("InferenceRunner: `data` is empty (its length is 0), so it would "
                             "record NaN. Pass the held-out batches to evaluate on.")
        self.data = data
        self.infer_fn = infer_fn
        self.names = tuple(names)
        self.prefix = prefix
        self.model = model
        self.metrics = dict(metrics or {})
        self.provides = tuple(prefix + name for name in (*self.names, *self.metrics))
        self.last_results: dict[str, Any] = {}

    def trigger(self, state: RunState) -> None:
        model = (self.model if self.model is not None
                 else trained_model(state.trainer, type(self).__name__))
        was_training = model.training
        model.eval()
        means = {name: Mean() for name in self.names}
        parameter = next(iter(model.parameters()), None)
        if parameter is not None:
            move_metrics(self.metrics.values(), parameter.device)
        for metric in self.metrics.values():
            metric.reset()
        batches = 0
        try:
            with torch.no_grad():
                for batch in self.data:
                    outputs = self.infer_fn(model, batch)
                    if type(outputs) is not dict:  # the common case costs this one check
                        self._check_outputs(outputs)
                    weight = float(batch_size_of(batch))
                    try:
                        for name in self.names:
                            means[name].update(outputs[name], weight)
                    except KeyError:
                        self._check_outputs(outputs)  # a mismatch, said as one; else:
                        raise
                    batches += 1
        finally:
            model.train(was_training)
        if batches == 0:
            raise ValueError("InferenceRunner: `data` yielded no batches, so there was nothing "
                             "to evaluate (a generator is used up after one pass). Pass a list, "
                             "a DataLoader or a DataFlow, which start a new pass each time.")
        self.last_results = {self.prefix + name: float(mean.result())
                             for name, mean in means.items()}
        for name, metric in self.metrics.items():
            self.last_results.update(_host_results(self.prefix + name, read_metric(metric)))
        state.put_metrics(self.last_results)

    def _check_outputs(self, outputs: Any) -> None:
        """Refuses what `infer_fn` returned if it is not a mapping holding every name in
        `names`, saying both sides of the mismatch instead of a bare ``KeyError``."""
        if not isinstance(outputs, Mapping):
            raise TypeError(f"InferenceRunner: infer_fn returned a {type(outputs).__name__}; it "
                            f"must return a dict with the `names` {list(self.names)} as "
                            "keys.") from None
        missing = [name for name in self.names if name not in outputs]
        if missing:
            returned = sorted(map(str, outputs))
            raise MissingMetricError(
                f"InferenceRunner: `names` (got {list(self.names)}) asks for {missing}, which "
                f"infer_fn did not return; it returned {returned}. Make names the keys "
                f"infer_fn returns, e.g. names={returned}.") from None

    def on_epoch_end(self, state: RunState) -> None:
        self.trigger(state)

    def state_dict(self) -> dict[str, Any]:
        """`last_results` as plain values; nothing before the first pass (a runner added to
        a resumed run then starts fresh without a warning that it has no saved state)."""
        return {"last_results": plain_logs(self.last_results)} if self.last_results else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        results = state_dict.get("last_results")  # absent from older checkpoints
        self.last_results = dict(results) if isinstance(results, dict) else {}
