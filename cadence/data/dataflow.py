"""`DataFlow`: mini-batches of arrays, batched by slicing, with a position that checkpoints save.

tfsnippet's (and tensorpack's) data flows for PyTorch. ``DataFlow.arrays`` batches numpy arrays
or tensors that already sit in memory by indexing them -- no per-example collation as a
``DataLoader`` does -- and shuffles with its own ``torch.Generator``. Each iteration is one pass.
Every flow has ``state_dict``/``load_state_dict``: the order of the current pass, how many batches
were taken, and the generator, so a run resumed mid-epoch continues with the next batch and
later passes shuffle exactly as in an uninterrupted run.

>>> import numpy as np
>>> flow = DataFlow.arrays([np.arange(5), np.arange(5) * 10], batch_size=2)
>>> [tuple(b.tolist() for b in batch) for batch in flow]
[([0, 1], [0, 10]), ([2, 3], [20, 30]), ([4], [40])]
>>> doubled = flow.map(lambda x, y: (x * 2, y))
>>> next(iter(doubled))[0].tolist()
[0, 2]
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from cadence.data.device import DeviceCopier

Batch = tuple[Any, ...]


class DataFlow:
    """Base class: an iterable of mini-batches (tuples of arrays), one pass per ``iter``."""

    def __iter__(self) -> Iterator[Batch]:
        raise NotImplementedError

    def __len__(self) -> int:
        """Batches per pass."""
        raise TypeError(f"{type(self).__name__} does not know its length.")

    def state_dict(self) -> dict[str, Any]:
        """The position in the current pass (see the module docstring)."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from `state` on the next ``iter``."""
        raise NotImplementedError

    def map(self, mapper: Callable[..., Any],
            array_indices: Sequence[int] | None = None) -> DataFlow:
        """A flow of ``mapper(*batch)``; with `array_indices`, only those arrays are passed and
        replaced by what `mapper` returns."""
        return MapFlow(self, mapper, array_indices)

    def threaded(self, prefetch: int = 2,
                 device: torch.device | str | None = None) -> DataFlow:
        """A flow that prepares up to `prefetch` batches ahead in a background thread and, with
        a `device`, also moves them there (on CUDA: from pinned memory, on a side stream)."""
        return ThreadingFlow(self, prefetch, device)

    @staticmethod
    def arrays(arrays: Sequence[Any], batch_size: int, shuffle: bool = False,
               skip_incomplete: bool = False,
               random_state: int | torch.Generator | None = None) -> ArrayFlow:
        """Mini-batches of `arrays` (numpy arrays or tensors with the same first dimension)."""
        return ArrayFlow(arrays, batch_size, shuffle, skip_incomplete, random_state)


class ArrayFlow(DataFlow):
    """Batches of in-memory arrays, sliced (sequential) or gathered (shuffled).

    Args:
        arrays: numpy arrays or tensors with the same length.
        batch_size: examples per batch.
        shuffle: a new random order each pass.
        skip_incomplete: drop the last batch of a pass if it is smaller.
        random_state: a seed or a ``torch.Generator`` for the shuffling; None seeds one from
            torch's global generator (so ``torch.manual_seed`` makes the flow reproducible).

    Raises:
        ValueError: for no arrays, arrays of different lengths, or a bad batch size.
    """

    def __init__(self, arrays: Sequence[Any], batch_size: int, shuffle: bool = False,
                 skip_incomplete: bool = False,
                 random_state: int | torch.Generator | None = None) -> None:
        arrays = list(arrays)
        if not arrays:
            raise ValueError("`arrays` must hold at least one array.")
        lengths = {len(a) for a in arrays}
        if len(lengths) != 1:
            raise ValueError(f"The arrays have different lengths {sorted(lengths)}; they must "
                             "have the same first dimension.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"`batch_size` (got {batch_size!r}) must be a positive int.")
        self.source_arrays = arrays
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.skip_incomplete = skip_incomplete
        self.data_length = lengths.pop()
        if isinstance(random_state, torch.Generator):
            self.generator = random_state
        else:
            seed = (int(random_state) if random_state is not None
                    else int(torch.randint(0, 2**62, (), dtype=torch.int64)))
            self.generator = torch.Generator().manual_seed(seed)
        self._order: torch.Tensor | None = None
        self._position = 0
        self._in_pass = False
        self._resume = False

    def __len__(self) -> int:
        full, rest = divmod(self.data_length, self.batch_size)
        return full + (1 if rest and not self.skip_incomplete else 0)

    @property
    def array_count(self) -> int:
        """How many arrays each batch holds."""
        return len(self.source_arrays)

    def _take(self, array: Any, index: torch.Tensor | slice) -> Any:
        if isinstance(index, slice) or isinstance(array, torch.Tensor):
            return array[index]
        return array[index.numpy()]

    def __iter__(self) -> Iterator[Batch]:
        if not (self._resume and self._in_pass and self._position < len(self)):
            self._order = (torch.randperm(self.data_length, generator=self.generator)
                           if self.shuffle else None)
            self._position = 0
        self._resume = False
        self._in_pass = True
        for batch in range(self._position, len(self)):
            start = batch * self.batch_size
            stop = min(start + self.batch_size, self.data_length)
            index: torch.Tensor | slice = (self._order[start:stop] if self._order is not None
                                           else slice(start, stop))
            self._position = batch + 1
            yield tuple(self._take(array, index) for array in self.source_arrays)
        self._in_pass = False

    def state_dict(self) -> dict[str, Any]:
        in_pass = self._in_pass and self._position < len(self)  # a finished pass is not open
        return {"order": self._order, "position": self._position, "in_pass": in_pass,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._order = state["order"]
        self._position = int(state["position"])
        self._in_pass = bool(state["in_pass"])
        self.generator.set_state(state["generator"])
        self._resume = True


class MapFlow(DataFlow):
    """Applies a function to each batch of another flow; its position is the source's."""

    def __init__(self, source: DataFlow, mapper: Callable[..., Any],
                 array_indices: Sequence[int] | None = None) -> None:
        self.source = source
        self.mapper = mapper
        self.array_indices = list(array_indices) if array_indices is not None else None

    def __len__(self) -> int:
        return len(self.source)

    def _apply(self, batch: Batch) -> Batch:
        if self.array_indices is None:
            out = self.mapper(*batch)
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)
        out = self.mapper(*(batch[i] for i in self.array_indices))
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(self.array_indices):
            raise ValueError(f"The mapper returned {len(out)} arrays for array_indices "
                             f"{self.array_indices}; it must return one per index.")
        result = list(batch)
        for i, value in zip(self.array_indices, out):
            result[i] = value
        return tuple(result)

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.source:
            yield self._apply(batch)

    def state_dict(self) -> dict[str, Any]:
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state)


_END = object()


class ThreadingFlow(DataFlow):
    """Prepares the next batches of `source` in a background thread, so that loading overlaps
    the training step. An error in the thread is raised in the consumer, with its traceback.

    With a `device`, arrays become tensors on that device. On CUDA the thread copies each batch
    from pinned memory on its own stream, and the consumer's stream waits for that copy only
    when the batch is used: host-to-device copies overlap compute (tensorpack's
    ``StagingInput``).

    Its position is that of the last batch *consumed*: batches prepared ahead but not used are
    prepared again after a resume.
    """

    def __init__(self, source: DataFlow, prefetch: int = 2,
                 device: torch.device | str | None = None) -> None:
        if prefetch < 1:
            raise ValueError(f"`prefetch` (got {prefetch}) must be at least 1.")
        self.source = source
        self.prefetch = prefetch
        self.device = torch.device(device) if device is not None else None
        self._copier = DeviceCopier(self.device, pin=True) if self.device is not None else None
        self._consumed_state: dict[str, Any] | None = None
        self._stop: threading.Event | None = None

    def __len__(self) -> int:
        return len(self.source)

    def _work(self, items: queue.Queue[Any], stop: threading.Event) -> None:
        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    items.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for batch in self.source:
                batch, ready = self._to_device(batch)
                if not put((batch, ready, self.source.state_dict())):
                    return
        except BaseException as error:  # handed to the consumer, raised there
            put(error)
            return
        put(_END)

    def __iter__(self) -> Iterator[Batch]:
        self.close()
        self._consumed_state = self.source.state_dict()
        items: queue.Queue[Any] = queue.Queue(self.prefetch)
        stop = self._stop = threading.Event()
        worker = threading.Thread(target=self._work, args=(items, stop), daemon=True,
                                  name="cadence-dataflow")
        worker.start()
        try:
            while True:
                item = items.get()
                if item is _END:
                    self._consumed_state = None
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, ready, state = item
                if self._copier is not None:  # CUDA: wait for the side-stream copy
                    batch = self._copier.use(batch, ready)
                self._consumed_state = state
                yield batch
        finally:
            stop.set()

    def _to_device(self, batch: Batch) -> tuple[Batch, Any]:
        if self._copier is None:
            return batch, None
        moved, ready = self._copier.start(tuple(torch.as_tensor(a) for a in batch))
        return tuple(moved), ready

    def close(self) -> None:
        """Stops the background thread of an unfinished pass."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def state_dict(self) -> dict[str, Any]:
        if self._consumed_state is not None:
            return self._consumed_state
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self._consumed_state = None
        self.source.load_state_dict(state)

