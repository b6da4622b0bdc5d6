"""`StatisticsCollector`: tfsnippet's running statistics, on the engine's one accumulator.

It is `cadence.Moments` -- the mean and variance that every front-end's metrics use, kept on
the device for tensors and on the host for numbers -- with tfsnippet's names: `collect`,
`counter`, `has_value`, `weight_sum`, and the statistics as floats (each read is a host read).

>>> collector = StatisticsCollector()
>>> collector.collect([1.0, 2.0]); collector.collect(3.0, weight=2.0)
>>> collector.mean, collector.weight_sum, collector.counter
(2.25, 4.0, 2)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cadence.engine.metrics import Moments


class StatisticsCollector(Moments):
    """Running mean and (population) variance of collected values; each element counts, times
    its weight."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = 0
        """How many times `collect` was called."""

    def reset(self) -> None:
        """Forgets everything collected."""
        super().reset()
        self.counter = 0

    def collect(self, values: Any, weight: float = 1.0) -> None:
        """Adds `values` (a number, an array or a tensor; each element counts) with `weight`."""
        self.counter += 1
        if isinstance(values, torch.Tensor):
            self.update(values.detach(), weight)
        elif isinstance(values, (int, float)):
            self.update(float(values), weight)
        else:
            self.update(torch.from_numpy(np.asarray(values, dtype=np.float64)), weight)

    @property
    def has_value(self) -> bool:
        """Whether anything was collected."""
        return self.counter > 0

    @property
    def weight_sum(self) -> float:
        """The total weight (elements x weights) collected."""
        return self.weight()

    @property
    def mean(self) -> float:
        """The weighted mean (NaN before anything was collected)."""
        return float(self.result())

    @property
    def square(self) -> float:
        """The weighted mean of the squares."""
        _, square, count = self._sums()
        return float(square / count)

    @property
    def var(self) -> float:
        """The population variance."""
        return float(self.variance())

    @property
    def stddev(self) -> float:  # type: ignore[override]
        """The population standard deviation."""
        return float(super().stddev())
