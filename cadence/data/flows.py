"""More `DataFlow`s, as tfsnippet has them: `GatherFlow` (``DataFlow.gather``),
`IteratorFactoryFlow` (``DataFlow.iterator_factory``) and `SlidingWindow`.

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

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from cadence.data.dataflow import Batch, DataFlow


class GatherFlow(DataFlow):
    """Takes a batch of each of `flows` at a time and joins their arrays into one batch; a pass
    ends with the shortest flow's. Its position is each flow's.

    Raises:
        ValueError: without flows.
        TypeError: if one of `flows` is not a `DataFlow`.
    """

    def __init__(self, flows: Iterable[DataFlow]) -> None:
        flows = tuple(flows)
        if not flows:
            raise ValueError("DataFlow.gather() needs at least one flow.")
        for flow in flows:
            if not isinstance(flow, DataFlow):
                raise TypeError(f"DataFlow.gather() takes DataFlows (got {type(flow).__name__}); "
                                "wrap arrays with DataFlow.arrays(...).")
        self.flows = flows

    def __len__(self) -> int:
        return min(len(flow) for flow in self.flows)

    def _iterate(self) -> Iterator[Batch]:
        iterators = [iter(flow) for flow in self.flows]
        try:
            for batches in zip(*iterators):
                yield tuple(array for batch in batches for array in batch)
        finally:
            for iterator in iterators:  # ends the passes of the longer flows too
                iterator.close()  # type: ignore[attr-defined]

    def state_dict(self) -> dict[str, Any]:
        return {"flows": [flow.state_dict() for flow in self.flows]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for flow, flow_state in zip(self.flows, state["flows"]):
            flow.load_state_dict(flow_state)


class IteratorFactoryFlow(DataFlow):
    """A flow whose every pass iterates what ``factory()`` returns.

    Its position is the number of batches taken from the current pass: a resumed flow calls
    `factory` again and skips that many (exact when `factory` makes the same batches again).
    """

    def __init__(self, factory: Callable[[], Iterable[Batch]]) -> None:
        if not callable(factory):
            raise TypeError(f"`factory` (got {type(factory).__name__}) must be a function that "
                            "returns an iterable of batches for one pass.")
        self.factory = factory
        self._position = 0
        self._in_pass = False
        self._skip = 0

    def _iterate(self) -> Iterator[Batch]:
        skip, self._skip = self._skip, 0
        self._position, self._in_pass = 0, True
        for batch in self.factory():
            self._position += 1
            if self._position > skip:
                yield batch
        self._in_pass = False

    def state_dict(self) -> dict[str, Any]:
        return {"position": self._position if self._in_pass else 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._skip = int(state["position"])
        self._position, self._in_pass = self._skip, self._skip > 0


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
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
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
