"""`DataFlow`: mini-batches of arrays, batched by slicing, with a position that checkpoints save.

tfsnippet's (and tensorpack's) data flows for PyTorch. ``DataFlow.arrays`` batches numpy arrays
or tensors that already sit in memory by indexing them -- no per-example collation as a
``DataLoader`` does -- and shuffles with its own ``torch.Generator``. Each iteration is one pass,
and a flow is not reentrant (a second pass inside a running one is an error). Every flow has
``state_dict``/``load_state_dict``: the order of the current pass, how many batches were taken,
and the generator, so a run resumed mid-epoch continues with the next batch and later passes
shuffle exactly as in an uninterrupted run.

What a tfsnippet user reaches for: the factories ``DataFlow.arrays``, ``seq``, ``gather``,
``iterator_factory``; the transforms ``map``, ``select``, ``threaded``; reading with
``next_batch`` / ``current_batch``, ``get_arrays`` and ``to_arrays_flow``; and
`cadence.data.flows.SlidingWindow`. The flows the factories and transforms build live here with
`DataFlow` (the thread machinery of `ThreadingFlow` in `cadence.data.threading_flow`), so the
imports between the flow modules point one way.

>>> import numpy as np
>>> flow = DataFlow.arrays([np.arange(5), np.arange(5) * 10], batch_size=2)
>>> [tuple(b.tolist() for b in batch) for batch in flow]
[([0, 1], [0, 10]), ([2, 3], [20, 30]), ([4], [40])]
>>> doubled = flow.map(lambda x, y: (x * 2, y))
>>> next(iter(doubled))[0].tolist()
[0, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from cadence.core.intervals import is_int
from cadence.data.threading_flow import Batch, ThreadedPasses


class DataFlow:
    """Base class: an iterable of mini-batches (tuples of arrays), one pass per ``iter``.

    A flow is not reentrant, as in tfsnippet and tensorpack: iterating it while one of its
    passes is running raises `RuntimeError` instead of corrupting that pass (a pass ends when
    its iterator is exhausted or dropped). Subclasses implement `_iterate` (one pass).
    """

    _iterating = False
    _implicit: Iterator[Batch] | None = None
    _current: Batch | None = None

    def _iterate(self) -> Iterator[Batch]:
        """One pass over the mini-batches (what subclasses implement)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Batch]:
        if self._iterating:
            raise RuntimeError(
                f"This {type(self).__name__} is already being iterated: a DataFlow is not "
                "reentrant, and a second pass inside the running one would corrupt it. Finish "
                "(or drop) the running pass first, or iterate two flows.")
        self._iterating = True
        try:
            yield from self._iterate()
        finally:
            self._iterating = False

    def __len__(self) -> int:
        """Batches per pass."""
        raise TypeError(f"{type(self).__name__} does not know its length.")

    def state_dict(self) -> dict[str, Any]:
        """The position in the current pass (see the module docstring)."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from `state` on the next ``iter``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ reading

    def next_batch(self) -> Batch:
        """The next mini-batch of an implicit iterator (tfsnippet's ``next_batch``).

        Raises:
            StopIteration: once at the end of each pass; the next call starts a new pass.
        """
        if self._implicit is None:
            self._implicit = iter(self)
        try:
            self._current = next(self._implicit)
        except StopIteration:
            self._implicit = self._current = None
            raise
        return self._current

    @property
    def current_batch(self) -> Batch | None:
        """The last batch `next_batch` returned in the running pass (None between passes)."""
        return self._current

    def get_arrays(self) -> tuple[Any, ...]:
        """One pass of the flow, concatenated: a tuple of whole arrays (numpy arrays, or
        tensors when the batches hold tensors).

        Raises:
            ValueError: if the flow yields no batch.
        """
        columns: list[list[Any]] | None = None
        for batch in self:
            if columns is None:
                columns = [[array] for array in batch]
            else:
                for column, array in zip(columns, batch):
                    column.append(array)
        if columns is None:
            raise ValueError(f"{type(self).__name__} yielded no batch: there are no arrays to get.")
        return tuple(torch.cat(column) if isinstance(column[0], torch.Tensor)
                     else np.concatenate(column) for column in columns)

    def to_arrays_flow(self, batch_size: int, shuffle: bool = False,
                       skip_incomplete: bool = False,
                       random_state: int | torch.Generator | None = None) -> ArrayFlow:
        """An `ArrayFlow` over `get_arrays` (one pass of this flow, held in memory)."""
        return ArrayFlow(self.get_arrays(), batch_size, shuffle, skip_incomplete, random_state)

    # ------------------------------------------------------------------ transforming

    def map(self, mapper: Callable[..., Any],
            array_indices: int | Sequence[int] | None = None) -> DataFlow:
        """A flow of ``mapper(*batch)``, which must return a tuple or a list of arrays; with
        `array_indices` (an index or several), only those arrays are passed and replaced by
        what `mapper` returns (as many as it was given)."""
        return MapFlow(self, mapper, array_indices)

    def select(self, indices: Sequence[int]) -> DataFlow:
        """A flow of the arrays at `indices` of each batch, in that order
        (``flow.select([0, 2, 0])`` gives ``(x, z, x)`` from ``(x, y, z)``)."""
        chosen = tuple(_check_index(i, "indices") for i in indices)
        return MapFlow(self, lambda *arrays: tuple(arrays[i] for i in chosen))

    def threaded(self, prefetch: int = 2,
                 device: torch.device | str | None = None) -> DataFlow:
        """A flow that prepares up to `prefetch` batches ahead in a background thread -- also
        across the end of a pass -- and, with a `device`, also moves them there (on CUDA: from
        pinned memory, on a side stream). See `ThreadingFlow`."""
        return ThreadingFlow(self, prefetch, device)

    # ------------------------------------------------------------------ factories

    @staticmethod
    def arrays(arrays: Sequence[Any], batch_size: int, shuffle: bool = False,
               skip_incomplete: bool = False,
               random_state: int | torch.Generator | None = None) -> ArrayFlow:
        """Mini-batches of `arrays` (numpy arrays or tensors, at least 1-d, with the same first
        dimension)."""
        return ArrayFlow(arrays, batch_size, shuffle, skip_incomplete, random_state)

    @staticmethod
    def seq(start: int, stop: int, step: int = 1, batch_size: int | None = None,
            shuffle: bool = False, skip_incomplete: bool = False, dtype: Any = np.int32,
            random_state: int | torch.Generator | None = None) -> SeqFlow:
        """Mini-batches of the numbers ``start, start + step, ...`` before `stop` (tfsnippet's
        ``SeqFlow``, whose `start`, `stop` and `step` it keeps): indices to fetch data by,
        with `map`.

        Raises:
            ValueError: without a `batch_size`, or with a `step` of 0.
        """
        return SeqFlow(start, stop, step, batch_size, shuffle, skip_incomplete, dtype,
                       random_state)

    @staticmethod
    def gather(flows: Iterable[DataFlow]) -> DataFlow:
        """A flow whose batches join the arrays of the batches of `flows`, taken together
        (stops with the shortest). See `GatherFlow`."""
        return GatherFlow(flows)

    @staticmethod
    def iterator_factory(factory: Callable[[], Iterable[Batch]]) -> DataFlow:
        """A flow whose passes are ``factory()``'s iterables. See `IteratorFactoryFlow`."""
        return IteratorFactoryFlow(factory)


def _check_index(index: Any, name: str) -> int:
    if not is_int(index):
        raise TypeError(f"`{name}` must hold integer array indices (got {index!r}).")
    return int(index)


def _check_array(array: Any, index: int) -> Any:
    if not hasattr(array, "shape") or not hasattr(array, "__getitem__"):
        raise ValueError(f"`arrays[{index}]` (got {type(array).__name__}) must be a numpy array "
                         "or a tensor; convert it with np.asarray(...).")
    if len(array.shape) < 1:
        raise ValueError(f"`arrays[{index}]` is 0-d; arrays must be at least 1-d, with the "
                         "examples along the first dimension.")
    return array


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
        if hasattr(arrays, "shape"):
            raise TypeError("`arrays` must be a list of arrays, e.g. [x, y] (got a single "
                            f"{type(arrays).__name__}; for one array pass [x]).")
        arrays = [_check_array(array, i) for i, array in enumerate(arrays)]
        if not arrays:
            raise ValueError("`arrays` must hold at least one array.")
        lengths = {len(a) for a in arrays}
        if len(lengths) != 1:
            raise ValueError(f"The arrays have different lengths {sorted(lengths)}; they must "
                             "have the same first dimension.")
        if not is_int(batch_size) or batch_size < 1:
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
        self.rank, self.world_size = 0, 1

    def shard(self, rank: int | None = None, world_size: int | None = None) -> ArrayFlow:
        """Makes each pass this process's share of the examples (by default its data shard and
        their number: the runtime's ``dp_rank`` and ``dp_size``, `cadence.core.rank` -- under
        tensor parallelism several processes read one shard), as ``DistributedSampler`` does:
        the pass's order (shuffled or not) is padded with its first examples to a multiple of
        `world_size`, and rank `r` takes every `world_size`-th example from the `r`-th. Every
        rank has the same number of batches, so the ranks' epochs end at the same step.

        The ranks must order a pass alike: give a shuffled flow the same `random_state` on
        every rank (a flow seeded from torch's global generator is alike where every rank
        called ``torch.manual_seed`` with the same seed). The position saved in a checkpoint
        is this rank's own, restored at the same world size. Returns the flow itself.

        Raises:
            ValueError: for a rank outside ``[0, world_size)``, or during a pass.
        """
        if rank is None or world_size is None:  # the data coordinate (not the global rank)
            from cadence.core.rank import data_rank, data_size

            rank = data_rank() if rank is None else rank
            world_size = data_size() if world_size is None else world_size
        for name, value in (("rank", rank), ("world_size", world_size)):
            if not is_int(value) or value < 0:
                raise ValueError(f"`{name}` (got {value!r}) must be a non-negative int.")
        if not 0 <= rank < world_size:
            raise ValueError(f"`rank` {rank} is not in [0, world_size={world_size}).")
        if self._iterating:
            raise ValueError("shard() during a pass: shard the flow before iterating it.")
        self.rank, self.world_size = rank, world_size
        return self

    @property
    def _share(self) -> int:
        """How many examples a pass of this rank holds."""
        return -(-self.data_length // self.world_size)  # padded to a multiple of the ranks

    def __len__(self) -> int:
        full, rest = divmod(self._share, self.batch_size)
        return full + (1 if rest and not self.skip_incomplete else 0)

    @property
    def array_count(self) -> int:
        """How many arrays each batch holds."""
        return len(self.source_arrays)

    @property
    def data_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape of one example of each array (without the batch dimension)."""
        return tuple(tuple(a.shape[1:]) for a in self.source_arrays)

    @property
    def is_shuffled(self) -> bool:
        """Whether each pass has a new random order."""
        return self.shuffle

    def _take(self, array: Any, index: torch.Tensor | slice) -> Any:
        if isinstance(index, slice) or isinstance(array, torch.Tensor):
            return array[index]
        return array[index.numpy()]

    def _new_order(self) -> torch.Tensor | None:
        """The indices of this rank's examples for a new pass (None: all of them, in order)."""
        order = (torch.randperm(self.data_length, generator=self.generator)
                 if self.shuffle else None)
        if self.world_size == 1:
            return order
        if order is None:
            order = torch.arange(self.data_length)
        padding = self._share * self.world_size - self.data_length
        if padding:
            order = torch.cat([order, order.repeat(-(-padding // len(order)))[:padding]])
        return order[self.rank::self.world_size].clone()

    def _iterate(self) -> Iterator[Batch]:
        if not (self._resume and self._in_pass and self._position < len(self)):
            self._order = self._new_order()
            self._position = 0
        self._resume = False
        self._in_pass = True
        for batch in range(self._position, len(self)):
            start = batch * self.batch_size
            stop = min(start + self.batch_size, self._share)
            index: torch.Tensor | slice = (self._order[start:stop] if self._order is not None
                                           else slice(start, stop))
            self._position = batch + 1
            yield tuple(self._take(array, index) for array in self.source_arrays)
        self._in_pass = False

    def state_dict(self) -> dict[str, Any]:
        in_pass = self._in_pass and self._position < len(self)  # a finished pass is not open
        return {"order": self._order, "position": self._position, "in_pass": in_pass,
                "generator": self.generator.get_state(), "rank": self.rank,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = (int(state.get("rank", 0)), int(state.get("world_size", 1)))
        if saved != (self.rank, self.world_size) and bool(state["in_pass"]):
            raise ValueError(
                f"This position was saved by rank {saved[0]} of {saved[1]} in the middle of a "
                f"pass; this flow is rank {self.rank} of {self.world_size}. Resume with the same "
                "number of processes (or from a checkpoint at the end of an epoch).")
        self._order = state["order"]
        self._position = int(state["position"])
        self._in_pass = bool(state["in_pass"])
        self.generator.set_state(state["generator"])
        self._resume = True


class SeqFlow(ArrayFlow):
    """The batches of the numbers ``start, start + step, ...`` before `stop` (``numpy.arange``'s
    rule): tfsnippet's ``SeqFlow``, made by `DataFlow.seq`.

    Raises:
        ValueError: without a `batch_size`, or with a `step` of 0.
    """

    def __init__(self, start: int, stop: int, step: int = 1, batch_size: int | None = None,
                 shuffle: bool = False, skip_incomplete: bool = False, dtype: Any = np.int32,
                 random_state: int | torch.Generator | None = None) -> None:
        if batch_size is None:
            raise ValueError("`batch_size` is required, e.g. DataFlow.seq(0, 100, batch_size=32).")
        if step == 0:
            raise ValueError("`step` (got 0) must not be 0, e.g. DataFlow.seq(0, 100, step=2, "
                             "batch_size=32).")
        super().__init__([np.arange(start, stop, step, dtype=dtype)], batch_size, shuffle,
                         skip_incomplete, random_state)
        self._range = (start, stop, step)

    @property
    def start(self) -> int:
        """The first number."""
        return self._range[0]

    @property
    def stop(self) -> int:
        """The bound the numbers stop before."""
        return self._range[1]

    @property
    def step(self) -> int:
        """The difference between consecutive numbers."""
        return self._range[2]


class MapFlow(DataFlow):
    """Applies a function to each batch of another flow; its position is the source's.

    Raises:
        TypeError: for `array_indices` that are not integers, and -- from iteration -- when the
            mapper returns anything but a tuple or a list (a bare array is an error, as in
            tfsnippet: return ``(array,)``).
        ValueError: from iteration, when with `array_indices` the mapper returns another number
            of arrays than it was given.
    """

    def __init__(self, source: DataFlow, mapper: Callable[..., Any],
                 array_indices: int | Sequence[int] | None = None) -> None:
        self.source = source
        self.mapper = mapper
        if array_indices is None:
            self.array_indices: list[int] | None = None
        elif isinstance(array_indices, (int, np.integer)):
            self.array_indices = [_check_index(array_indices, "array_indices")]
        else:
            self.array_indices = [_check_index(i, "array_indices") for i in array_indices]

    def __len__(self) -> int:
        return len(self.source)

    def _outputs(self, out: Any) -> Batch:
        if not isinstance(out, (tuple, list)):
            raise TypeError(
                f"The mapper must return a tuple or a list of arrays, got a "
                f"{type(out).__name__}: return (array,) for a single one.")
        return tuple(out)

    def _apply(self, batch: Batch) -> Batch:
        if self.array_indices is None:
            return self._outputs(self.mapper(*batch))
        out = self._outputs(self.mapper(*(batch[i] for i in self.array_indices)))
        if len(out) != len(self.array_indices):
            raise ValueError(f"The mapper returned {len(out)} arrays for array_indices "
                             f"{self.array_indices}; it must return one per index.")
        result = list(batch)
        for i, value in zip(self.array_indices, out):
            result[i] = value
        return tuple(result)

    def _iterate(self) -> Iterator[Batch]:
        for batch in self.source:
            yield self._apply(batch)

    def state_dict(self) -> dict[str, Any]:
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state)


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


class ThreadingFlow(ThreadedPasses, DataFlow):
    """Prepares the next batches of `source` in a background thread (``DataFlow.threaded``),
    so that loading overlaps the training step; with a `device`, also moves them there. The
    machinery, and what the arguments mean, is `cadence.data.threading_flow.ThreadedPasses`.

    Raises:
        ValueError: if `prefetch` is less than 1.
    """
