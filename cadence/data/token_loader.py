"""`TokenLoader`: training batches from token shards, an endless stream whose position is a few
integers, exact at resume and at any number of data shards.

The job reads one **global sequence of samples**, the same at every number of data shards:

- each source's samples (windows of a `TokenShards`) are taken in an order that is a function
  of (seed, source, epoch, data size) -- a NumPy permutation drawn from those, a new one every
  time the source is read through (its epoch) -- and a source's position is how many samples it
  gave so far (``taken``);
- with several sources (a **mixture**), which source gives global sample ``j`` is drawn from
  the weights by a generator keyed by (seed, ``j // 4096``): the same run, the same sequence of
  sources, each source's share within sampling tolerance of its weight;
- global batch ``k`` is samples ``[k G, (k + 1) G)`` (``G`` the global batch size) and data
  shard ``r`` of ``N`` takes the ``r``-th ``G / N`` of them.

So the position is the number of global samples taken and each source's ``taken`` -- the same
integers on every data shard. Resumed at another number of data shards (`load_resharded`), the
new shards take their parts of the next global batch: the global sequence goes on as an
uninterrupted run's, nothing repeated or skipped. Changed weights on resume are a config change:
each source goes on from its own position, the choice of sources from the new weights, and one
line says so. Changed data (another size, other files) is refused: its order is not the one the
checkpoint's position counts in.

The loader takes its data shard from what it is given (``shard_index`` and ``num_shards``: the
``InputContext`` of ``Task.build_inputs``), never from the process's rank. Batches are made
whole with NumPy (one memory-mapped read per sample) in the training thread; see
``docs/benchmarks.md`` for what that costs.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from cadence.core.errors import CheckpointIncompatibleError, ConfigError
from cadence.data.packing import make_batch
from cadence.data.sharding import (
    InputContext,
    build_dataloader,
    data_key,
    per_replica_batch_size,
)
from cadence.data.token_format import split_paths
from cadence.data.token_shards import TokenShards

logger = logging.getLogger("cadence")

_BLOCK = 4096
"""Global samples whose sources are drawn together (a mixture's unit of random access)."""
_MIXTURE = 0x6D6978
"""Keys the mixture's generator apart from the sources' orders."""


class TokenLoader:
    """This data shard's training batches from one or more token sources (see the module
    docstring): ``(inputs, labels)``, packed as `TokenShards` says.

    Args:
        sources: the sources; several make a mixture.
        global_batch_size: samples per step summed over all data shards.
        weights: one per source, each source's share of the samples (normalized); None for one
            source.
        shard_index: this data shard's index (``InputContext.input_pipeline_id``).
        num_shards: how many data shards read (``InputContext.num_input_pipelines``).
        seed: keys every order and the mixture's draws.
        shuffle: take each source's samples in a new random order every epoch; else in order.
        pin_memory: batches in pinned memory (for a copy to a GPU that does not block).
        vocab_size: refuse a token at or above it (the model's vocabulary): checked once per
            batch for a source whose files do not say their tokenizer's vocabulary, and once
            here for those that do.

    Raises:
        ValueError: for a `global_batch_size` that is not a multiple of `num_shards`, weights
            that do not match the sources or are not positive, sources that do not agree on
            packing, or a `vocab_size` smaller than a source's tokenizer's.
    """

    def __init__(self, sources: Sequence[TokenShards], global_batch_size: int, *,
                 weights: Sequence[float] | None = None, shard_index: int = 0,
                 num_shards: int = 1, seed: int = 0, shuffle: bool = True,
                 pin_memory: bool = False, vocab_size: int | None = None) -> None:
        sources = list(sources)
        if not sources:
            raise ValueError("TokenLoader needs at least one source.")
        if global_batch_size < 1 or global_batch_size % num_shards:
            raise ValueError(f"global_batch_size (got {global_batch_size}) must be a positive "
                             f"multiple of num_shards ({num_shards}).")
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index (got {shard_index}) must be in [0, {num_shards}).")
        if weights is None:
            weights = [1.0] * len(sources)
        weights = [float(weight) for weight in weights]
        if len(weights) != len(sources) or not all(weight > 0 for weight in weights):
            raise ValueError(f"weights (got {weights}) must be one positive number per source "
                             f"({len(sources)}).")
        if len({source.packing for source in sources}) > 1:
            raise ValueError("The sources of one TokenLoader must all be packed or none.")
        for source in sources:
            source.check_vocabulary(vocab_size)
        self.sources = sources
        self.weights = weights
        self.global_batch_size = global_batch_size
        self.shard_index, self.num_shards = shard_index, num_shards
        self.seed, self.shuffle, self.pin_memory = seed, shuffle, pin_memory
        self.vocab_size = vocab_size
        self._check_tokens = [vocab_size is not None and source.vocab_size is None
                              for source in sources]
        total = sum(weights)
        self._cumulative = np.cumsum([weight / total for weight in weights])
        self._cumulative[-1] = 1.0  # draws are in [0, 1): the last source takes the rest
        self.samples = 0
        """Global samples taken so far (by all data shards together)."""
        self.taken = [0] * len(sources)
        """Samples each source gave so far, over all its epochs."""
        self._orders: dict[tuple[int, int], np.ndarray] = {}
        self._block: tuple[int, np.ndarray] | None = None

    @property
    def batch_size(self) -> int:
        """Samples per batch of this data shard."""
        return self.global_batch_size // self.num_shards

    def epochs(self) -> list[float]:
        """How many times each source was read through, as a fraction."""
        return [taken / len(source) for taken, source in zip(self.taken, self.sources)]

    def __iter__(self) -> Iterator[Any]:
        """Batches from the current position on, without end."""
        while True:
            yield self.next_batch()

    def next_batch(self) -> Any:
        """This data shard's part of the next global batch; the position moves past all of it."""
        chosen, indices = self._global_batch()
        mine = slice(self.shard_index * self.batch_size, (self.shard_index + 1) * self.batch_size)
        chosen, indices = chosen[mine], indices[mine]
        packing = self.sources[0].packing
        width = self.sources[0].sequence_length + 1
        tokens = np.empty((self.batch_size, width), dtype=np.int64)
        starts = np.empty_like(tokens) if packing else None
        for number in np.unique(chosen).tolist():
            rows = np.flatnonzero(chosen == number) if len(self.sources) > 1 else slice(None)
            read, begins = self.sources[number].read(indices[rows], packing)
            if self._check_tokens[number]:
                self.sources[number].check_tokens(read, self.vocab_size)
            tokens[rows] = read
            if starts is not None:
                starts[rows] = begins
        return make_batch(tokens, starts, self.pin_memory)

    def _global_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """For each sample of the next global batch, its source and its index in that source;
        moves the position past the batch."""
        size = self.global_batch_size
        chosen = self._sources_of(self.samples, size)
        indices = np.empty(size, dtype=np.int64)
        for number in range(len(self.sources)):
            rows = np.flatnonzero(chosen == number)
            if rows.size:
                indices[rows] = self._sample_ids(number, self.taken[number], rows.size)
                self.taken[number] += rows.size
        self.samples += size
        return chosen, indices

    def _sources_of(self, first: int, count: int) -> np.ndarray:
        """Which source gives each of global samples ``[first, first + count)``."""
        if len(self.sources) == 1:
            return np.zeros(count, dtype=np.int64)
        parts = []
        position, end = first, first + count
        while position < end:
            block = position // _BLOCK
            draws = self._block_draws(block)
            stop = min(end, (block + 1) * _BLOCK)
            parts.append(draws[position - block * _BLOCK: stop - block * _BLOCK])
            position = stop
        return np.concatenate(parts)

    def _block_draws(self, block: int) -> np.ndarray:
        if self._block is None or self._block[0] != block:
            generator = np.random.default_rng([self.seed, _MIXTURE, block])
            draws = np.searchsorted(self._cumulative, generator.random(_BLOCK), side="right")
            self._block = (block, draws)
        return self._block[1]

    def _sample_ids(self, number: int, first: int, count: int) -> np.ndarray:
        """Source `number`'s samples ``[first, first + count)`` of its endless sequence: its
        epochs one after the other, each in its own order."""
        size = len(self.sources[number])
        ids = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            epoch, within = divmod(first + done, size)
            take = min(count - done, size - within)
            ids[done: done + take] = self._order(number, epoch)[within: within + take]
            done += take
        return ids

    def _order(self, number: int, epoch: int) -> np.ndarray:
        """The order of source `number` in `epoch` (a permutation keyed by seed, source and
        epoch, drawn once per epoch; the two latest kept)."""
        key = (number, epoch)
        order = self._orders.get(key)
        if order is None:
            size = len(self.sources[number])
            dtype = np.uint32 if size < 2 ** 32 else np.uint64
            order = np.arange(size, dtype=dtype)
            if self.shuffle:
                np.random.default_rng([self.seed, number, epoch]).shuffle(order)
            for old in [k for k in self._orders if k[0] == number and k[1] < epoch - 1]:
                del self._orders[old]
            self._orders[key] = order
        return order

    def _order_digest(self, number: int, epoch: int) -> str:
        """The SHA-256 of the first samples of an order: checks, on resume, that this NumPy
        draws the order the checkpoint counted in."""
        return hashlib.sha256(self._order(number, epoch)[:_BLOCK].astype("<u8").tobytes()
                              ).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """The position: global samples taken, each source's ``taken``, and what checks that
        a resume reads the same data in the same orders (a few integers and strings)."""
        return {
            "samples": self.samples, "taken": list(self.taken),
            "weights": list(self.weights), "seed": self.seed, "shuffle": self.shuffle,
            "global_batch_size": self.global_batch_size,
            "sources": [{"name": source.name, "samples": len(source), "files": source.digest,
                         "order": self._order_digest(number, taken // len(source))}
                        for number, (source, taken) in enumerate(zip(self.sources, self.taken))],
            "shard": [self.shard_index, self.num_shards],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a saved position with the next global batch.

        Raises:
            CheckpointIncompatibleError: if the data is not the data the position was saved
                with (another number of sources, another size, other files, another seed),
                or this NumPy draws other orders.
        """
        saved = state["sources"]
        if len(saved) != len(self.sources):
            raise self._changed(f"it was saved with {len(saved)} source(s) and this run has "
                                f"{len(self.sources)}")
        for number, (source, old) in enumerate(zip(self.sources, saved)):
            if old["samples"] != len(source) or list(old["files"]) != source.digest:
                raise self._changed(
                    f"source {number + 1} ({source.name!r}) holds {len(source)} samples in "
                    f"{len(source.files)} file(s), where the checkpoint's had "
                    f"{old['samples']} in {len(old['files'])}")
        if state["seed"] != self.seed or bool(state["shuffle"]) != self.shuffle:
            raise self._changed(f"its seed was {state['seed']} (shuffle {state['shuffle']}), "
                                f"this run's is {self.seed} (shuffle {self.shuffle})")
        self.samples = int(state["samples"])
        self.taken = [int(taken) for taken in state["taken"]]
        self._block = None
        for number, (source, old) in enumerate(zip(self.sources, saved)):
            if self._order_digest(number, self.taken[number] // len(source)) != old["order"]:
                raise self._changed(
                    f"the order of source {number + 1} drawn again is not the saved one (this "
                    f"NumPy, {np.__version__}, draws other permutations than the one that saved "
                    "it)")
        changes = []
        if [float(weight) for weight in state["weights"]] != self.weights:
            changes.append(f"the mixture's weights changed from {list(state['weights'])} to "
                           f"{self.weights}: each source goes on from its own position, and "
                           "the sources are chosen by the new weights from here on")
        if int(state["global_batch_size"]) != self.global_batch_size:
            changes.append(f"the global batch size changed from {state['global_batch_size']} "
                           f"to {self.global_batch_size}: the same sequence of samples is "
                           "cut into other batches")
        for change in changes:
            logger.warning("Token data resumed at global sample %d: %s.", self.samples, change)

    def _changed(self, what: str) -> CheckpointIncompatibleError:
        return CheckpointIncompatibleError(
            f"The checkpoint's position in the token data does not fit this data: {what}. "
            "Resume with the data and seed the checkpoint was written with, or start a new run.")

    def load_resharded(self, states: list[dict[str, Any]], rank: int, world_size: int) -> str:
        """Continues from the positions saved by a job with another number of data shards:
        every shard saved the same global position, and this shard takes its part of each
        global batch from there. Returns what happened, in words. (`rank` and `world_size` are
        the job's processes; the data shard is the loader's own.)

        Raises:
            CheckpointIncompatibleError: if the old shards' positions disagree, or as
                `load_state_dict`.
        """
        first = states[0]
        for state in states[1:]:
            if (state["samples"], state["taken"]) != (first["samples"], first["taken"]):
                raise CheckpointIncompatibleError(
                    "The checkpoint's data shards saved different positions in the token data "
                    f"({state['samples']} and {first['samples']} global samples): the "
                    "checkpoint is damaged. Restore an older one.")
        self.load_state_dict(first)
        old_shards = int(first["shard"][1])
        dealt = (f"{self.num_shards} data shards instead of {old_shards}"
                 if old_shards != self.num_shards  # else only the other dimensions changed
                 else f"the same {self.num_shards} data shard(s)")
        return (f"the token data goes on at global sample {self.samples}, dealt to {dealt} "
                f"({self.batch_size} samples each a step): the global sequence of samples is "
                "the uninterrupted run's.")


def build_token_inputs(params: Any, input_context: InputContext | None = None, *,
                       sequence_length: int, vocab_size: int | None = None,
                       seed: int = 0) -> Any:
    """This data shard's input from token files as a `TokenDataConfig` describes it
    (``params.input_path``, ``input_weights``, ``packing``): for training a `TokenLoader`, an
    endless stream whose position checkpoints hold; for evaluation a ``DataLoader`` over the
    files in order, each sample read by one data shard once (`build_dataloader`).

    Args:
        params: the data config.
        input_context: this process's data shard (``input_pipeline_id`` of
            ``num_input_pipelines``).
        sequence_length: tokens of context per sample.
        vocab_size: the model's vocabulary: a token at or above it is refused.
        seed: the order's seed where ``params.seed`` is None.

    Raises:
        ConfigError: for an input that cannot be read as token files, weights that do not fit
            the paths, a global batch size that is not divisible by the data shards, or a
            vocabulary larger than the model's; each names the config key.
    """
    context = input_context or InputContext()
    key = data_key(params)
    paths = split_paths(params.input_path)
    weights = [float(weight) for weight in params.input_weights]
    if not paths:
        raise ConfigError(f"{key}.input_path is empty: name token files (train.bin), a glob, or "
                          "a folder prepared by cadence prepare-data.")
    if weights and (len(weights) != len(paths) or not params.is_training):
        raise ConfigError(
            f"{key}.input_weights (got {weights}) must give one weight per comma-separated "
            f"entry of {key}.input_path ({len(paths)}: {paths})" + (
                "" if params.is_training else "; and only training data is a mixture: "
                f"evaluation reads every entry in order. Set {key}.input_weights=[]") + ".")
    per_replica_batch_size(params, context)  # divisible, or a ConfigError naming the key
    try:
        if not params.is_training:
            dataset = TokenShards.open(params.input_path, sequence_length, params.packing)
            dataset.check_vocabulary(vocab_size)
            return build_dataloader(dataset, params, context, seed)
        sources = ([TokenShards.open(path, sequence_length, params.packing) for path in paths]
                   if weights else
                   [TokenShards.open(params.input_path, sequence_length, params.packing)])
        return TokenLoader(
            sources, params.global_batch_size, weights=weights or None,
            shard_index=context.input_pipeline_id, num_shards=context.num_input_pipelines,
            seed=params.seed if params.seed is not None else seed,
            shuffle=True if params.shuffle is None else bool(params.shuffle),
            pin_memory=torch.accelerator.is_available(), vocab_size=vocab_size)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None
