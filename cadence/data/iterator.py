"""`DataIterator`: iterates a data source pass after pass and knows where it is.

The position is part of every checkpoint, so a resumed run continues with the next batch:

- a map-style ``torch.utils.data.DataLoader`` (shuffled or not, with or without a generator):
  the index order of the current pass is recorded when the pass starts, and on resume the
  loader is fed the rest of that order, skipping at the index level -- no batch is loaded twice.
  The checkpoint holds how to draw that order again where the sampler allows it (a
  ``RandomSampler``'s generator state as the pass started, a ``DistributedSampler``'s seed and
  epoch; `cadence.data.sharding.order_recipe`) and a digest to check it by, so that it does not
  grow with the data set; for other samplers, the order itself. The generators of the loader
  and its sampler are saved too, so later passes shuffle as in an uninterrupted run;
- a source with ``state_dict``/``load_state_dict`` (torchdata's ``StatefulDataLoader``):
  its own state -- which covers what the loader's workers hold (an iterable dataset's
  position, the dataset's own random generators), where cadence's recorded order covers only
  the indices. At another world size it is refused, unless the source has its own
  ``load_resharded`` (``docs/data.md``);
- a list or tuple of batches: the index of the next batch;
- anything else (a generator, an ``IterableDataset`` loader): no position is saved, and the
  first checkpoint warns that a resumed run starts that source from its beginning.

The per-batch cost is one Python call and one integer increment.

With ``prefetch_to=device`` each batch is moved to the device one batch ahead: while a step
computes on batch *i*, the copy of batch *i + 1* is already under way (on CUDA, from pinned
memory on a side stream; the step's stream waits for that copy only when the batch is used).
The position stays that of the batches *delivered*: a batch fetched ahead is fetched again
after a resume.
"""

from __future__ import annotations

import array
import itertools
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler, SequentialSampler

from cadence.core.errors import CheckpointError, CheckpointIncompatibleError
from cadence.core.protocols import is_stateful
from cadence.core.rank import data_size
from cadence.data.device import DeviceCopier
from cadence.data.resharding import deal, padding, rest_of_pass, steps_in_rest
from cadence.data.sharding import draw_order, order_digest, order_recipe, shard_recipes


class _RecordingSampler(Sampler[int]):
    """Wraps a loader's sampler: records each pass's index order and, where the sampler allows
    it, how to draw that order again (`order_recipe`, taken as the pass starts); replays the
    rest of an order once after a resume."""

    def __init__(self, inner: Sampler[int]) -> None:
        self.inner = inner
        self.order: list[int] | None = None
        self.recipe: dict[str, Any] | None = None
        """How the current pass's order is drawn again; None where it is saved itself."""
        self._saved: tuple[list[int], dict[str, Any]] | None = None
        self.resume: tuple[list[int] | None, int, dict[str, Any] | None] | None = None

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        if self.resume is not None:
            order, skip, self.recipe = self.resume
            self.resume = None
            self.order = order
            if order is None:
                return iter(range(skip, len(self.inner)))  # type: ignore[arg-type]
            return iter(order[skip:])
        if isinstance(self.inner, SequentialSampler):
            self.order = self.recipe = None
            return iter(self.inner)
        self.recipe = order_recipe(self.inner)  # before the sampler draws: its generator's state
        self.order = list(self.inner)  # draws from the sampler's generator exactly as usual
        return iter(self.order)

    def saved_order(self) -> dict[str, Any]:
        """The current pass's order as a checkpoint holds it, made once per pass: its recipe
        and digest (``pass_order``, a fixed size) where it can be drawn again, else the order
        itself as an int64 tensor (``order``, through an ``array``: ~4x faster than
        ``torch.tensor`` on a list, which matters inside a save)."""
        order = self.order
        if order is None:
            return {"order": None}
        if self._saved is None or self._saved[0] is not order:
            if self.recipe is not None:
                saved: dict[str, Any] = {"pass_order": {
                    **self.recipe, "order_length": len(order), "sha256": order_digest(order)}}
            else:
                saved = {"order": torch.frombuffer(array.array("q", order), dtype=torch.int64)
                         if order else torch.empty(0, dtype=torch.int64)}
            self._saved = (order, saved)
        return self._saved[1]


_EXHAUSTED = object()
_now = time.perf_counter


def _generator_of(obj: Any) -> torch.Generator | None:
    generator = getattr(obj, "generator", None)
    return generator if isinstance(generator, torch.Generator) else None


class DataIterator:
    """An iterator over `source` that counts passes (`epoch`) and batches, and checkpoints.

    Its state is the rank's own (``rank_local``): in a distributed job every rank saves its
    position in its shard, and a job resumed with another number of processes reshards the rest
    of the pass (`load_resharded`).

    `next()` raises ``StopIteration`` at the end of each pass; call `end_pass` to go on with
    the next one.

    Args:
        source: a DataLoader, a list of batches, a stateful loader, or any iterable; None for a
            runner whose step reads its own input (nothing to iterate, no position).
        prefetch_to: move every batch's tensors to this device, one batch ahead (see the
            module docstring). Not for a stateful loader, whose own state would then be one
            batch ahead of the training.

    Raises:
        ValueError: for `prefetch_to` with a stateful loader.
    """

    rank_local = True
    """Each rank of a distributed job has its own position (see `cadence.engine.rank_state`)."""

    def __init__(self, source: Any, prefetch_to: torch.device | str | None = None) -> None:
        self.source = source
        self.epoch = 0
        """Completed passes over `source`."""
        self.batches = 0
        """Batches taken from the current pass."""
        self.wait_s = 0.0
        """Seconds spent waiting for batches so far: the host clock around each fetch (the run's
        timeline records each loop's share as the training thread's wait for input)."""
        self._iterator: Iterator[Any] | None = None
        self._resuming = False
        self._skip = 0
        self._warned = False
        self._recorder: _RecordingSampler | None = None
        self._saved_generators: dict[str, torch.Tensor] = {}
        """A stateful loader's generator states at the checkpoint, set once it restarts."""
        stateful = is_stateful(source)
        try:
            self.pass_length: int | None = len(source)
        except TypeError:
            self.pass_length = None
        self._full_pass_length = self.pass_length
        """Batches in the current pass, when the source knows (shorter for the rest of a pass
        resharded after a resume); lets a pass end right after its last batch instead of on the
        next, failing ``next()``."""
        if (not stateful and isinstance(source, DataLoader)
                and not isinstance(source.dataset, IterableDataset)):
            batch_sampler = source.batch_sampler
            if type(batch_sampler) is BatchSampler:
                if not isinstance(batch_sampler.sampler, _RecordingSampler):
                    batch_sampler.sampler = _RecordingSampler(batch_sampler.sampler)  # type: ignore[arg-type]
                self._recorder = batch_sampler.sampler
        self.kind = (
            "none" if source is None
            else "loader" if self._recorder is not None
            else "stateful" if stateful
            else "sequence" if isinstance(source, Sequence)
            else "plain"
        )
        self.prefetch_to = torch.device(prefetch_to) if prefetch_to is not None else None
        if self.prefetch_to is not None and self.kind == "stateful":
            raise ValueError(
                f"prefetch_to={prefetch_to!r} cannot be used with a loader that keeps its own "
                f"state ({type(source).__name__}): its state would be one batch ahead of "
                "training. Move batches in the step instead, or use a map-style DataLoader."
            )
        self._ahead: Any = None
        """With `prefetch_to`: the next batch (already moving), _EXHAUSTED at the pass end."""
        self._copier = DeviceCopier(self.prefetch_to) if self.prefetch_to is not None else None

    @property
    def batch_size(self) -> int | None:
        """The source's batch size, when it says."""
        size = getattr(self.source, "batch_size", None)
        return size if isinstance(size, int) else None

    @property
    def batches_left(self) -> int | None:
        """Batches left in the current pass, when the source knows."""
        return None if self.pass_length is None else max(self.pass_length - self.batches, 0)

    @property
    def at_pass_start(self) -> bool:
        """Whether no batch of the current pass was taken yet."""
        return self.batches == 0

    def __iter__(self) -> DataIterator:
        return self

    def __next__(self) -> Any:
        if self.kind == "none":
            raise TypeError("This runner has no training data (train_dataset=None): its step "
                            "must read its own input, or pass the data to the constructor.")
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = self._start()
        if self.prefetch_to is not None:
            return self._next_prefetched(iterator)
        started = _now()
        batch = next(iterator)
        self.wait_s += _now() - started
        self.batches += 1
        return batch

    def _next_prefetched(self, iterator: Iterator[Any]) -> Any:
        ahead = self._ahead
        if ahead is None:  # the first batch of a pass: nothing is in flight yet
            ahead = self._fetch(iterator)
        elif ahead is _EXHAUSTED:
            raise StopIteration
        started = _now()
        try:
            self._ahead = self._fetch(iterator)  # its copy overlaps the step on `ahead`
        except StopIteration:
            self._ahead = _EXHAUSTED
        self.wait_s += _now() - started
        assert self._copier is not None
        batch = self._copier.use(*ahead)
        self.batches += 1
        return batch

    def _fetch(self, iterator: Iterator[Any]) -> tuple[Any, Any]:
        """The next batch of `iterator`, its copy to the device started."""
        assert self._copier is not None
        return self._copier.start(next(iterator))

    def next_in_pass(self) -> Any:
        """The next batch of the current pass. When the pass runs out, counts it as done (the
        next call starts a new one) and raises ``StopIteration``.

        Raises:
            ValueError: if a pass yields no batch at all (a generator iterated a second time).
        """
        try:
            return next(self)
        except StopIteration:
            if self.at_pass_start:
                raise ValueError(
                    f"The data ({type(self.source).__name__}) yields no batches. A generator can "
                    "be iterated only once: pass a DataFlow, a DataLoader or a list."
                ) from None
            self.end_pass()
            raise

    def end_pass_at_last_batch(self) -> bool:
        """Ends the pass if the batch just taken was its last -- a sized source knows, so its
        pass ends right after its last batch (a checkpoint taken then holds a finished pass),
        not at the next, failing ``next()``. Returns whether it ended."""
        if self.batches == self.pass_length:
            self.end_pass()
            return True
        return False

    def end_pass(self) -> None:
        """Counts the pass as done; the next `next()` starts a new one."""
        self.epoch += 1
        self.batches = 0
        self.pass_length = self._full_pass_length
        self._iterator = None
        self._ahead = None

    def _start(self) -> Iterator[Any]:
        sampler = (self._recorder.inner if self._recorder is not None
                   else getattr(self.source, "sampler", None))
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):  # a DistributedSampler shuffles by seed + epoch
            set_epoch(self.epoch)
        if not self._resuming:
            return iter(self.source)
        self._resuming = False
        if self.kind == "sequence":
            return itertools.islice(iter(self.source), self._skip, None)
        if self.kind == "stateful":
            return self._start_stateful()
        if self.kind == "loader":
            # The pass's random draws (worker base seed, sampler seed) happened before the
            # checkpoint; the restored generator states are already past them. Starting the
            # iterator again must not draw a second time.
            generator = _generator_of(self.source)
            saved = generator.get_state() if generator is not None else None
            with torch.random.fork_rng(devices=[]):
                iterator = iter(self.source)
            if generator is not None and saved is not None:
                generator.set_state(saved)
            return iterator
        return iter(self.source)

    def _generators(self) -> dict[str, torch.Generator]:
        """The random generators of the source and of its sampler, by name."""
        sampler = self._recorder.inner if self._recorder is not None else getattr(
            self.source, "sampler", None)
        found = {"loader": _generator_of(self.source), "sampler": _generator_of(sampler)}
        return {name: generator for name, generator in found.items() if generator is not None}

    def _start_stateful(self) -> Iterator[Any]:
        """The iterator of a stateful loader resumed from its own state, with its generators
        where an uninterrupted run has them: a pass's random draws (worker base seed, sampler
        order) happen when its iterator starts, and a loader that replays them while it
        restores a pass (torchdata's, without workers) would leave its generator past the
        uninterrupted one, so that every later pass is shuffled differently. In mid-pass the
        generators are set back after the iterator started; at a pass boundary before."""
        saved = self._saved_generators
        self._saved_generators = {}
        generators = self._generators()

        def set_back() -> None:
            for name, state in saved.items():
                if name in generators:
                    generators[name].set_state(state)

        if not self.batches:
            set_back()
            return iter(self.source)
        with torch.random.fork_rng(devices=[]):  # the pass drew from it before, too
            iterator = iter(self.source)
        set_back()
        return iterator

    def state_dict(self) -> dict[str, Any]:
        """The position: passes done, batches taken, and what the source needs to resume.

        For a map-style loader in mid-pass, the pass's order: where the sampler allows (a
        ``RandomSampler``, a ``DistributedSampler``, a `ShardSampler`), how to draw it again and
        its digest (``pass_order``: a fixed size, whatever the data set's); else the order
        itself (``order``, an int64 per example). Where this rank's position alone says every
        old rank's -- at a pass boundary; in mid-pass when every rank holds a shard of one
        global order (a ``DistributedSampler`` over the job's processes) or reads the same
        batches -- ``reshards_alone`` holds the number of processes: a resume at another world
        size then reads one old rank's file, not all (`cadence.engine.rank_state`). That
        relies on what synchronous data parallelism guarantees: every rank takes one batch a
        step, so all ranks are at one position.
        """
        state: dict[str, Any] = {"kind": self.kind, "epoch": self.epoch, "batches": self.batches}
        if self.kind == "loader":
            assert self._recorder is not None
            state["batch_size"] = int(self.source.batch_size or 1)
            state.update(self._recorder.saved_order() if self.batches else {"order": None})
            state["generators"] = {
                name: gen.get_state()
                for name, gen in (
                    ("loader", _generator_of(self.source)),
                    ("sampler", _generator_of(self._recorder.inner)),
                )
                if gen is not None
            }
        elif self.kind == "stateful":
            state["source"] = self.source.state_dict()
            state["generators"] = {name: generator.get_state()
                                   for name, generator in self._generators().items()}
        elif self.kind == "plain" and not self._warned:
            self._warned = True
            warnings.warn(
                f"The position in the training data ({type(self.source).__name__}) cannot be "
                "saved: a run resumed from this checkpoint starts that data from its beginning "
                "and sees its first batches again. Use a map-style DataLoader, a list of "
                "batches, or a loader with state_dict()/load_state_dict() (torchdata's "
                "StatefulDataLoader) for exact resume.",
                UserWarning,
                stacklevel=2,
            )
        if self._reshards_alone(state):
            state["reshards_alone"] = data_size()
        return state

    def _reshards_alone(self, state: dict[str, Any]) -> bool:
        """Whether `state` alone rebuilds the position of any new rank (see `state_dict`)."""
        if self.kind == "stateful":
            return False  # a loader's own state is one rank's shard
        if self.kind != "loader" or not self.batches:
            return True  # a pass boundary, or the same batches on every rank
        recipe = state.get("pass_order")
        if recipe is None:
            return state.get("order") is None  # a sequential sampler: one order on every rank
        return (shard_recipes(recipe) is not None
                and int(recipe["num_replicas"]) == data_size())

    def load_resharded(self, states: list[dict[str, Any]], rank: int, world_size: int) -> str:
        """Continues from the positions of the ranks of a job with another number of processes
        (`states`, one per old rank; or one old rank's alone, where it holds
        ``reshards_alone``, see `state_dict`): the rest of the pass is dealt to the new ranks,
        each example once (see `cadence.data.resharding`). Returns what happened, in words.

        Raises:
            CheckpointError: when the rest of the pass cannot be covered exactly once by ranks
                that take equal numbers of steps, or the source keeps its own state and has no
                ``load_resharded``; the message names both world sizes.
        """
        first = states[0]
        # One state for all old ranks where it says so (`state_dict`): it names their number.
        saved = len(states) if len(states) > 1 else int(first.get("reshards_alone") or 1)

        def refuse(why: str) -> CheckpointError:
            return CheckpointIncompatibleError(
                f"The checkpoint was taken in the middle of a pass by {saved} processes and "
                f"this job has {world_size}: {why}. Resume with {saved} processes, or from a "
                "checkpoint taken at the end of a pass."
            )

        if "stateful" in (self.kind, first.get("kind")):
            return self._reshard_stateful(states, rank, world_size, saved)
        if any(state.get("kind") != first.get("kind") or state.get("epoch") != first.get("epoch")
               or state.get("batches") != first.get("batches") for state in states):
            raise refuse("the old ranks' positions disagree")
        batches = int(first["batches"])
        epoch = int(first["epoch"])
        if batches == 0:
            self.load_state_dict({**first, "order": None})
            return f"pass {epoch + 1} starts with the new sharding."
        if self.kind == "sequence" and first["kind"] == "sequence":
            self.load_state_dict(first)  # every rank reads the same batches
            return f"every rank continues pass {epoch + 1} at batch {batches + 1}."
        if self.kind != "loader" or first["kind"] != "loader":
            raise refuse(f"a {self.kind!r} data source cannot be resharded")
        assert self._recorder is not None
        saved_batch = int(first.get("batch_size") or self.source.batch_size or 1)
        batch_size = int(self.source.batch_size or 1)
        drop_last = bool(getattr(self.source, "drop_last", False))
        orders = self._old_orders(states)
        rest = rest_of_pass(orders, batches * saved_batch)
        steps = steps_in_rest(len(rest), world_size, batch_size, drop_last)
        left = f"the {len(rest)} example{'s' if len(rest) != 1 else ''} left in pass {epoch + 1}"
        if steps == 0:  # not one batch a rank: the pass is over, as its last partial batch
            self.load_state_dict({**first, "batches": 0, "order": None})
            self.epoch = epoch + 1
            what = (f"{left} make no batch of {batch_size} on each of {world_size} ranks and "
                    "are dropped (drop_last)" if rest else f"pass {epoch + 1} is over")
            return f"{what}; pass {epoch + 2} starts with the new sharding."
        self.load_state_dict({**first, "batches": 0, "order": None})
        self.epoch = epoch
        self._recorder.resume = (deal(rest, world_size)[rank], 0, None)  # saved as it is
        self._resuming = True
        self.pass_length = steps  # this pass is the rest of one
        share = math.ceil(len(rest) / world_size)
        repeated, dropped = padding(len(rest), world_size), (share % batch_size) * world_size
        notes = [f"{repeated} repeated to deal them evenly"] if repeated else []
        if drop_last and dropped:
            notes.append(f"the last {share % batch_size} of each rank's share dropped (drop_last)")
        return (f"{left} are dealt to the {world_size} ranks, {steps} batch"
                f"{'es' if steps != 1 else ''} each{' (' + '; '.join(notes) + ')' if notes else ''}"
                "; the next passes are sharded as usual.")

    def _reshard_stateful(self, states: list[dict[str, Any]], rank: int, world_size: int,
                          saved: int) -> str:
        """A loader that keeps its own state, at another world size: its own
        ``load_resharded(states, rank, world_size)`` when it has one; else a refusal. Its state
        is one rank's (worker RNG streams, an iterable dataset's position in its shard) and
        cadence cannot deal it to other ranks -- not even at a pass boundary, where an iterable
        dataset's position still says what was read."""
        reshard = getattr(self.source, "load_resharded", None)
        kinds = {state.get("kind") for state in states}
        if kinds != {"stateful"} or self.kind != "stateful" or not callable(reshard):
            raise CheckpointIncompatibleError(
                f"The checkpoint's data position was saved by {saved} processes and this "
                f"job has {world_size}; the position is the state of a loader that keeps its "
                f"own ({type(self.source).__name__} here, {sorted(map(str, kinds))} saved), which "
                "belongs to one rank's shard (worker RNG streams, an iterable dataset's "
                "position) and cannot be dealt to other ranks: the loader has no "
                f"load_resharded(). Resume with {saved} processes, or train from a map-style "
                "DataLoader, whose position cadence tracks and reshards.")
        how = reshard([state["source"] for state in states], rank, world_size)
        self.epoch = int(states[0]["epoch"])
        self.batches = 0  # of the resharded rest: the loader says where it is
        self.pass_length = None
        self._iterator = None
        self._ahead = None
        self._resuming = True
        return str(how)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a saved position with the next batch.

        Raises:
            ValueError: if the position was saved from another kind of data source.
            CheckpointIncompatibleError: if the order of the saved pass, drawn again from its
                recipe, is not the order the checkpoint was taken in (the data set or the
                sampler changed).
        """
        if state.get("kind") != self.kind:
            raise ValueError(
                f"The checkpoint's data position is for a {state.get('kind')!r} source, but "
                f"the training data is a {self.kind!r} source ({type(self.source).__name__}). "
                "Resume with the same kind of data source."
            )
        self.epoch = int(state["epoch"])
        self.batches = int(state["batches"])
        self._iterator = None
        self._ahead = None
        self._resuming = self.batches > 0 or self.kind == "stateful"
        self._skip = self.batches
        if self.kind == "loader":
            assert self._recorder is not None
            generators = state.get("generators", {})
            for name, owner in (("loader", self.source), ("sampler", self._recorder.inner)):
                generator = _generator_of(owner)
                if generator is not None and name in generators:
                    generator.set_state(generators[name])
            if self.batches:
                order, recipe = self._pass_order(state)
                skip = self.batches * int(self.source.batch_size or 1)
                self._recorder.resume = (order, skip, recipe)
        elif self.kind == "stateful":
            self.source.load_state_dict(state["source"])
            self._saved_generators = dict(state.get("generators", {}))

    def _pass_order(self, state: dict[str, Any]) -> tuple[list[int] | None, dict[str, Any] | None]:
        """The order of the pass a saved position is in (None: the sampler's sequential order),
        and its recipe: drawn again and checked where the state holds a recipe (``pass_order``),
        else the order the state holds (``order``, also that of earlier versions)."""
        recipe = state.get("pass_order")
        if recipe is None:
            order = state.get("order")
            return (order.tolist() if order is not None else None), None
        return self._draw_checked(recipe, int(state["epoch"])), recipe

    def _draw_checked(self, recipe: dict[str, Any], epoch: int) -> list[int]:
        """The order `recipe` describes, drawn again, if it is the one its digest names."""
        length = int(recipe["order_length"])
        try:
            order = draw_order(recipe, self._sampled())
        except (KeyError, TypeError, ValueError) as error:
            how = f"cannot be drawn ({error})"
        else:
            if len(order) == length and order_digest(order) == recipe["sha256"]:
                return order
            how = (f"has {len(order)} examples" if len(order) != length
                   else "has its examples in another order")
        raise CheckpointIncompatibleError(
            f"The checkpoint's data position is in pass {epoch + 1}, saved as how its "
            f"{recipe.get('sampler')} drew that pass ({length} examples); drawn again over this "
            f"data set ({type(self._sampled()).__name__}), the pass {how}: the data set or the "
            "sampler changed since. Resume with the data the checkpoint was written with, or "
            "from a checkpoint taken at the end of a pass.")

    def _sampled(self) -> Any:
        """The data set the loader's sampler draws over (the loader's, unless it says)."""
        assert self._recorder is not None
        inner = self._recorder.inner
        return getattr(inner, "dataset", getattr(inner, "data_source", self.source.dataset))

    def _old_orders(self, states: list[dict[str, Any]]) -> list[list[int]]:
        """The pass orders of the old ranks, in rank order. From one state alone where it holds
        a shard of one global order (`state_dict`): every shard is drawn from its recipe, and
        the state's own is checked against its digest."""
        assert self._recorder is not None
        first = states[0]
        recipe = first.get("pass_order")
        if recipe is not None and len(states) == 1 and first.get("reshards_alone"):
            shards = shard_recipes(recipe)
            if shards is not None:
                own = int(recipe["rank"])
                return [self._draw_checked(recipe, int(first["epoch"])) if index == own
                        else draw_order(shard, self._sampled())
                        for index, shard in enumerate(shards)]
        default = list(range(len(self._recorder)))  # a sequential sampler's
        return [default if order is None else order
                for order, _ in map(self._pass_order, states)]
