"""tfsnippet's `SlidingWindow`, and -- where they were first -- `GatherFlow`
(``DataFlow.gather``) and `IteratorFactoryFlow` (``DataFlow.iterator_factory``), which now live
with `DataFlow` in `cadence.data.dataflow`.

>>> import numpy as np
>>> from cadence.data.dataflow import DataFlow
>>> x, y = DataFlow.arrays([np.arange(4)], 2), DataFlow.arrays([np.arange(4) * 10], 2)
>>> [tuple(a.tolist() for a in batch) for batch in DataFlow.gather([x, y])]
[([0, 1], [0, 10]), ([2, 3], [20, 30])]
>>> windows = SlidingWindow(np.arange(5), window_size=3).as_flow(batch_size=2)
>>> [batch[0].tolist() for batch in windows]
[[[0, 1, 2], [1, 2, 3]], [[2, 3, 4]]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cadence.core.intervals import is_int
from cadence.data.dataflow import DataFlow, GatherFlow, IteratorFactoryFlow

__all__ = ["GatherFlow", "IteratorFactoryFlow", "SlidingWindow"]


class SlidingWindow:
    """Windows of `window_size` consecutive elements of `data_array`, taken at batches of start
    indices (tfsnippet's data mapper): use it as the mapper of ``DataFlow.seq(...).map``, or
    get the whole flow with `as_flow`.

    Args:
        data_array: the array (numpy or tensor) windows are cut from, along its first dimension.
        window_size: elements per window.

    Raises:
        ValueError: for a `window_size` that is not positive, or longer than the array.
    """

    def __init__(self, data_array: Any, window_size: int) -> None:
        if not is_int(window_size) or window_size < 1:
            raise ValueError(f"`window_size` (got {window_size!r}) must be a positive int.")
        if window_size > len(data_array):
            raise ValueError(f"`window_size` ({window_size}) is longer than the array "
                             f"({len(data_array)}).")
        self.data_array = data_array
        self.window_size = window_size
        self._offsets = np.arange(window_size)

    def __call__(self, indices: Any) -> tuple[Any]:
        """``(windows,)``: the window starting at each of `indices`."""
        starts = np.asarray(indices).reshape(-1, 1)
        return (self.data_array[starts + self._offsets],)

    def as_flow(self, batch_size: int, shuffle: bool = False,
                skip_incomplete: bool = False) -> DataFlow:
        """A flow of batches of windows, one per start index ``0 .. len - window_size``."""
        starts = len(self.data_array) - self.window_size + 1
        return DataFlow.seq(0, starts, batch_size=batch_size, shuffle=shuffle,
                            skip_incomplete=skip_incomplete, dtype=np.int64).map(self)
