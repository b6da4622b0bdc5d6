"""`StatisticsCollector`: tfsnippet's running statistics, on the engine's one accumulator.

For scalar values (the default ``shape=()``) it is `cadence.Moments` -- the mean and variance
that every front-end's metrics use, kept on the device for tensors and on the host for numbers
-- with tfsnippet's names: `collect`, `counter`, `has_value`, `weight_sum`, and the statistics as
floats (each read is a host read). With a `shape`, as tfsnippet's collector, the statistics are
kept per element of values of that shape, and are read as arrays of it.

Each collected value counts with its weight; a batch of values can have one weight per value.
`counter` counts the values collected, as tfsnippet's does:

>>> collector = StatisticsCollector()
>>> collector.collect([1.0, 2.0]); collector.collect(3.0, weight=2.0)
>>> collector.mean, collector.weight_sum, collector.counter
(2.25, 4.0, 3)
>>> rows = StatisticsCollector(shape=(2,))
>>> rows.collect([[1.0, 10.0], [3.0, 30.0]], weight=[1.0, 3.0])   # two values of shape (2,)
>>> rows.mean.tolist(), rows.counter
([2.5, 25.0], 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cadence.core.logs import is_scalar
from cadence.engine.metrics import Moments


class StatisticsCollector(Moments):
    """Running (weighted) mean and population variance of collected values.

    Args:
        shape: the shape of one value; statistics are kept per element of it (``()``: values
            are scalars, and every element of a collected array is one value).
    """

    def __init__(self, shape: Sequence[int] = ()) -> None:
        super().__init__()
        self.shape = tuple(int(d) for d in shape)
        """The shape of one value."""
        self.counter = 0
        """How many values were collected (the elements of the batch shape of each call)."""
        self._per_element: list[Any] | None = None  # total, square (of `shape`), weight

    def reset(self) -> None:
        """Forgets everything collected."""
        super().reset()
        self.counter = 0
        self._per_element = None

    def collect(self, values: Any, weight: Any = 1.0) -> None:
        """Adds `values`: a number, an array or a tensor whose shape ends with `shape` (what
        comes before is the batch of values), with `weight` -- a number, or one weight per value
        (broadcast against the batch shape); an empty `weight` (``[]``) is 1, as in tfsnippet.
        An empty array of values adds nothing.

        Raises:
            ValueError: if the shape of `values` does not end with `shape`.
        """
        if not self.shape and (type(weight) is float or is_scalar(weight)):
            kind = type(values)  # exact types first: this runs for every metric of every step
            if (kind is torch.Tensor or isinstance(values, torch.Tensor)) and values.dim() == 0:
                self.counter += 1  # the per-step path of a collected loss: stays on the device
                self.update(values.detach(), weight)
                return
            if kind is float or kind is int or is_scalar(values):
                self.counter += 1  # the host path (a step time): no tensor is made
                self.update(float(values), float(weight))
                return
        if isinstance(values, torch.Tensor):
            tensor = values.detach()
        else:
            tensor = torch.from_numpy(np.asarray(values, dtype=np.float64))
        if tensor.numel() == 0:
            return
        rank = tensor.dim() - len(self.shape)
        if rank < 0 or tuple(tensor.shape[rank:]) != self.shape:
            raise ValueError(f"`values` of shape {tuple(tensor.shape)} do not end with the "
                             f"collector's shape {self.shape}; collect values of that shape, or "
                             "batches of them.")
        batch_shape = tuple(tensor.shape[:rank])
        weights = self._weights(weight, batch_shape, tensor.device)
        self.counter += math.prod(batch_shape)
        if not self.shape:
            self.update(tensor, (float(weight) if is_scalar(weight) else 1.0)
                        if weights is None else weights)
            return
        self._update_per_element(tensor.double(), weights, batch_shape, weight)

    def _weights(self, weight: Any, batch_shape: tuple[int, ...],
                 device: torch.device) -> torch.Tensor | None:
        """`weight` broadcast to `batch_shape` (None for one number: used as it is)."""
        if is_scalar(weight):
            return None
        weights = torch.as_tensor(np.asarray(weight, dtype=np.float64) if not isinstance(
            weight, torch.Tensor) else weight.detach(), dtype=torch.float64, device=device)
        if weights.numel() == 0:
            return None
        try:
            return torch.broadcast_to(weights, batch_shape)
        except RuntimeError:
            raise ValueError(f"`weight` of shape {tuple(weights.shape)} does not broadcast "
                             f"against the batch shape {batch_shape} of the values.") from None

    def _update_per_element(self, values: torch.Tensor, weights: torch.Tensor | None,
                            batch_shape: tuple[int, ...], weight: Any) -> None:
        dims = tuple(range(len(batch_shape)))

        def over_batch(x: torch.Tensor) -> torch.Tensor:
            return x.sum(dims) if dims else x  # sum(()) would sum every dimension

        if weights is None:
            scale = float(weight) if is_scalar(weight) else 1.0
            total = over_batch(values) * scale
            square = over_batch(values * values) * scale
            weight_sum = torch.tensor(scale * math.prod(batch_shape), dtype=torch.float64)
        else:
            expanded = weights.reshape(batch_shape + (1,) * len(self.shape))
            total = over_batch(values * expanded)
            square = over_batch(values * values * expanded)
            weight_sum = weights.sum()
        if self._per_element is None:
            self._per_element = [total, square, weight_sum]
        else:
            sums = self._per_element
            sums[0] = sums[0] + total
            sums[1] = sums[1] + square
            sums[2] = sums[2] + weight_sum.to(sums[2].device)

    def _per_element_stats(self) -> tuple[np.ndarray, np.ndarray, float]:
        if self._per_element is None:
            nan = np.full(self.shape, np.nan)
            return nan, nan.copy(), 0.0
        total, square, weight = (t.cpu() for t in self._per_element)
        return (total / weight).numpy(), (square / weight).numpy(), float(weight)

    @property
    def has_value(self) -> bool:
        """Whether any value was collected (an empty array is none)."""
        return self.counter > 0

    @property
    def weight_sum(self) -> float:
        """The total weight collected (values times their weights)."""
        if self.shape:
            return self._per_element_stats()[2]
        return self.weight()

    @property
    def mean(self) -> Any:
        """The weighted mean: a float, or an array of `shape` (NaN before anything was
        collected)."""
        if self.shape:
            return self._per_element_stats()[0]
        return float(self.result())

    @property
    def square(self) -> Any:
        """The weighted mean of the squares."""
        if self.shape:
            return self._per_element_stats()[1]
        _, square, count = self._sums()
        return float(square / count)

    @property
    def var(self) -> Any:
        """The population variance (never negative)."""
        if self.shape:
            mean, square, _ = self._per_element_stats()
            return np.maximum(square - mean * mean, 0.0)
        return float(self.variance())

    @property
    def stddev(self) -> Any:
        """The population standard deviation."""
        if self.shape:
            return np.sqrt(self.var)
        return float(super().stddev())
