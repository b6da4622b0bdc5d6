"""`StreamLoader`: training batches from a streamed dataset, resumed exactly per data shard.

A streamed dataset -- a Hugging Face ``datasets.IterableDataset`` (``load_dataset(...,
streaming=True)``, ``Dataset.to_iterable_dataset()``), or any iterable with ``state_dict()`` /
``load_state_dict()`` -- yields examples of token ids (a column such as ``input_ids``, or the
ids themselves). The loader packs them end to end into windows of ``sequence_length + 1``
tokens, as token shards are cut (`cadence.data.token_shards`), each example a document, and
batches the windows.

Its data shard is what it is given (``shard_index`` of ``num_shards``: the ``InputContext`` of
``Task.build_inputs``): a ``datasets.IterableDataset`` is split by
``datasets.distributed.split_dataset_by_node`` (whole files to each shard where their number
divides, else every ``num_shards``-th example); any other iterable is read whole by every shard,
each keeping every ``num_shards``-th example.

Its position is the dataset's own ``state_dict()`` (which file, which example in it) and the
tokens read but not yet batched, so a resume at the same number of data shards goes on with
the next token (tested bitwise). At another number of data shards the position cannot be kept:
each shard's state is a cursor in its own share of the files, and the shares change. The resume
is refused in one line that says so -- or, with ``reshard="restart"``, the stream starts again
from its beginning, and one line says how many examples are read again. Neither is silent.
(A ``datasets`` shuffle buffer is not part of its state: the examples in it when the
checkpoint was taken are not seen again. Shuffle the files, not a buffer, for exact resume.)
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from cadence.core.errors import CheckpointIncompatibleError
from cadence.data.packing import make_batch

logger = logging.getLogger("cadence")

_RESHARD = ("refuse", "restart")


class StreamLoader:
    """This data shard's batches of packed windows from a streamed dataset (see the module
    docstring).

    Args:
        dataset: a ``datasets.IterableDataset``, or an iterable with ``state_dict`` and
            ``load_state_dict`` whose ``iter()`` goes on from a loaded state.
        sequence_length: tokens of context per sample.
        batch_size: windows per batch of this data shard.
        shard_index: this data shard's index (``InputContext.input_pipeline_id``).
        num_shards: how many data shards read (``InputContext.num_input_pipelines``).
        column: the field of an example that holds its token ids; None where examples are the
            ids themselves.
        packing: keep each example apart in its windows (position ids restart, no target
            across examples); else the windows are plain ``(inputs, labels)``.
        reshard: what a resume at another number of data shards does: ``"refuse"`` (one line)
            or ``"restart"`` (the stream from its beginning, said in one line).
        pin_memory: batches in pinned memory (for a copy to a GPU that does not block).

    Raises:
        TypeError: for a dataset without ``state_dict``/``load_state_dict``.
        ValueError: for sizes below 1, a `shard_index` out of range, or an unknown `reshard`.
    """

    def __init__(self, dataset: Any, sequence_length: int, batch_size: int, *,
                 shard_index: int = 0, num_shards: int = 1, column: str | None = "input_ids",
                 packing: bool = False, reshard: str = "refuse",
                 pin_memory: bool = False) -> None:
        if not (callable(getattr(dataset, "state_dict", None))
                and callable(getattr(dataset, "load_state_dict", None))):
            raise TypeError(f"{type(dataset).__name__} has no state_dict()/load_state_dict(), so "
                            "its position cannot be saved: stream a datasets.IterableDataset "
                            "(datasets>=2.18), or give the iterable those two methods.")
        if sequence_length < 1 or batch_size < 1 or not 0 <= shard_index < num_shards:
            raise ValueError(f"sequence_length ({sequence_length}) and batch_size ({batch_size}) "
                             f"must be >= 1 and shard_index ({shard_index}) in [0, "
                             f"{num_shards}).")
        if reshard not in _RESHARD:
            raise ValueError(f"reshard (got {reshard!r}) must be one of {_RESHARD}.")
        self.sequence_length, self.batch_size = sequence_length, batch_size
        self.shard_index, self.num_shards = shard_index, num_shards
        self.column, self.packing, self.reshard = column, packing, reshard
        self.pin_memory = pin_memory
        self.dataset, self._every = _shard(dataset, shard_index, num_shards)
        self._fresh = copy.deepcopy(self.dataset.state_dict())
        """The dataset's state before it is read: where every new pass starts."""
        self.epoch = 0
        """Passes over the stream completed."""
        self.examples = 0
        """Examples of this shard read in the current pass."""
        self._tokens = np.empty(0, dtype=np.int64)
        self._starts = np.empty(0, dtype=np.int64)
        """Where each buffered token's example starts, in the buffer (may be negative)."""
        self._iterator: Iterator[Any] | None = None
        self._read = 0
        """Examples of the whole stream read in the current pass (this shard's and others')."""

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current pass, batch by batch; after a pass ended, the next one."""
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            yield batch

    def _next_batch(self) -> Any:
        width = self.sequence_length + 1
        needed = self.sequence_length * self.batch_size + 1
        while self._tokens.size < needed:
            if not self._pull():
                self._end_pass()
                return None
        rows = self.sequence_length * np.arange(self.batch_size)[:, None] + np.arange(width)
        tokens = self._tokens[rows]
        starts = (np.maximum(self._starts[rows] - rows[:, :1], 0) if self.packing else None)
        used = self.sequence_length * self.batch_size  # the last token begins the next window
        self._tokens, self._starts = self._tokens[used:], self._starts[used:] - used
        return make_batch(tokens, starts, self.pin_memory)

    def _pull(self) -> bool:
        """Reads this shard's next example into the buffer; False at the end of the stream."""
        if self._iterator is None:
            self._iterator = iter(self.dataset)
        while True:
            example = next(self._iterator, None)
            if example is None:
                return False
            self._read += 1
            if (self._read - 1) % self._every == self.shard_index % self._every:
                break
        ids = np.asarray(example[self.column] if self.column is not None else example,
                         dtype=np.int64).reshape(-1)
        self.examples += 1
        if ids.size:
            begin = self._tokens.size
            self._tokens = np.concatenate([self._tokens, ids])
            self._starts = np.concatenate([self._starts, np.full(ids.size, begin)])
        return True

    def _end_pass(self) -> None:
        """The stream ran out: what is buffered is dropped (less than a batch), and the next
        ``iter()`` starts the next pass (a ``datasets`` dataset reshuffles by its epoch)."""
        self.epoch += 1
        self.examples = self._read = 0
        self._tokens, self._starts = self._tokens[:0], self._starts[:0]
        self._iterator = None
        self.dataset.load_state_dict(copy.deepcopy(self._fresh))
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)

    def state_dict(self) -> dict[str, Any]:
        """The dataset's own state, the tokens read but not yet batched, and the counts."""
        return {"source": self.dataset.state_dict(), "tokens": self._tokens.copy(),
                "starts": self._starts.copy(), "epoch": self.epoch, "examples": self.examples,
                "read": self._read, "shard": [self.shard_index, self.num_shards]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Goes on from a saved position of this data shard with its next token."""
        self.epoch, self.examples = int(state["epoch"]), int(state["examples"])
        self._read = int(state["read"])
        self._tokens = np.asarray(state["tokens"], dtype=np.int64)
        self._starts = np.asarray(state["starts"], dtype=np.int64)
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        self.dataset.load_state_dict(state["source"])
        self._iterator = None

    def load_resharded(self, states: list[dict[str, Any]], rank: int, world_size: int) -> str:
        """At another number of data shards: refused in one line, or (``reshard="restart"``)
        the stream from its beginning. Returns what happened, in words.

        Raises:
            CheckpointIncompatibleError: with ``reshard="refuse"``.
        """
        old = int(states[0]["shard"][1])
        read = sum(int(state["examples"]) for state in states)
        if self.reshard == "refuse":
            raise CheckpointIncompatibleError(
                f"The streamed dataset's position was saved by {old} data shards and this job "
                f"has {self.num_shards}: each shard's position is a cursor in its own share of "
                "the stream, which cannot be dealt to another number of shards (the model, "
                "optimizer and counters could be). Resume with "
                f"{old} data shards, or build the StreamLoader with reshard='restart' to read "
                "the stream again from its beginning.")
        epoch = int(states[0]["epoch"])
        self.epoch = epoch
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        return (f"the streamed dataset starts pass {epoch + 1} again from its beginning at "
                f"{self.num_shards} data shards (saved by {old}): the {read} examples read in "
                "it before are read again.")


def _shard(dataset: Any, index: int, count: int) -> tuple[Any, int]:
    """This shard's share of `dataset`, and every how-many-th example of it to keep: a
    ``datasets.IterableDataset`` split by ``split_dataset_by_node`` (keep all), anything else
    whole (keep every `count`-th)."""
    if "datasets" not in sys.modules:  # not imported: the dataset cannot be one of its
        return dataset, count
    from datasets import IterableDataset
    from datasets.distributed import split_dataset_by_node

    if isinstance(dataset, IterableDataset):
        return (split_dataset_by_node(dataset, rank=index, world_size=count) if count > 1
                else dataset), 1
    return dataset, count
