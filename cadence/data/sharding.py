"""Sharding the input across processes (seed 002's ``InputContext``) and `build_dataloader`, the
DataLoader of one process's share of a dataset as a `DataConfig` describes it; and how the order
of a pass that such a sampler drew is drawn again (`order_recipe`, `draw_order`), so that a
checkpoint holds a recipe of a fixed size rather than an index per example."""

from __future__ import annotations

import array
import hashlib
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler
from torch.utils.data.distributed import DistributedSampler

from cadence.core.errors import ConfigError


@dataclass(frozen=True)
class InputContext:
    """Which share of the input this process reads (``tf.distribute.InputContext``).

    Attributes:
        num_input_pipelines: how many processes read input (the world size).
        input_pipeline_id: this process's index among them (its rank).
        num_replicas_in_sync: how many model replicas train together (the world size).
    """

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """The batch size of one replica.

        Raises:
            ValueError: if `global_batch_size` is not divisible by the number of replicas.
        """
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(
                f"The global batch size {global_batch_size} is not divisible by the "
                f"{self.num_replicas_in_sync} replicas; set global_batch_size to a multiple of "
                f"{self.num_replicas_in_sync}."
            )
        return global_batch_size // self.num_replicas_in_sync


class ShardSampler(Sampler[int]):
    """Every `num_replicas`-th example from `rank` on, in order, without padding: the shards of
    all processes together hold each example exactly once (``DistributedSampler`` pads shards
    to equal length by repeating examples, which would count some twice in an evaluation)."""

    def __init__(self, length: int, num_replicas: int, rank: int) -> None:
        self.length, self.num_replicas, self.rank = length, num_replicas, rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.num_replicas))


def data_key(params: Any) -> str:
    """The config key of a `DataConfig`, for messages: ``task.train_data`` or
    ``task.validation_data``."""
    return "task.train_data" if params.is_training else "task.validation_data"


def per_replica_batch_size(params: Any, context: InputContext) -> int:
    """This process's share of ``params.global_batch_size``.

    Raises:
        ConfigError: if the global batch size is not divisible by the processes of the job
            (said in the config's keys, with a value that divides).
    """
    try:
        return context.get_per_replica_batch_size(params.global_batch_size)
    except ValueError:
        world, key = context.num_replicas_in_sync, data_key(params)
        raise ConfigError(
            f"{key}.global_batch_size (got {params.global_batch_size}) is not divisible by the "
            f"{world} processes of this job: set it to a multiple of {world}, e.g. "
            f"{key}.global_batch_size={max(world, params.global_batch_size // world * world)}."
        ) from None


def build_dataloader(dataset: Dataset[Any], params: Any,
                     input_context: InputContext | None = None,
                     seed: int = 0) -> DataLoader[Any]:
    """A DataLoader over this process's share of `dataset`, as a `DataConfig` describes it.

    Training data (``params.is_training``) is shuffled unless ``params.shuffle`` says otherwise,
    by a ``DistributedSampler`` seeded by ``params.seed`` (else `seed`) and the pass number, in
    one process too: every world size draws the same order of examples, and with the same
    global batch, step k of any number of ranks trains on the same examples -- one process, DDP
    and FSDP2 give the same loss curve. With several processes each reads its shard:
    training data every ``world_size``-th example of that order, evaluation data through a
    `ShardSampler`, so that an evaluation over
    all processes sees every example exactly once (shards may differ by one batch; metrics are
    summed across processes at the end). Where CUDA is available, batches come in pinned memory,
    so that copying them to the GPU does not block the host.

    With ``params.stateful_loader`` the loader is torchdata's ``StatefulDataLoader``, with the
    same arguments: its ``state_dict`` (the sampler's position, each worker's dataset state) is
    what checkpoints hold (see ``docs/data.md``).

    Raises:
        ConfigError: if the global batch size is not divisible by the processes of the job, or
            if ``params.drop_remainder`` is set and this process's share of the data
            is smaller than one batch (no batch would ever be made), or for
            ``params.stateful_loader`` without torchdata installed.
    """
    context = input_context or InputContext()
    training = bool(params.is_training)
    shuffle = training if params.shuffle is None else bool(params.shuffle)
    seed = params.seed if params.seed is not None else seed
    sampler: Sampler[int] | None = None
    if training:  # in one process too: the order is the same at every world size
        sampler = DistributedSampler(dataset, context.num_input_pipelines,
                                     context.input_pipeline_id, shuffle=shuffle, seed=seed)
    elif context.num_input_pipelines > 1:
        sampler = ShardSampler(len(dataset),  # type: ignore[arg-type]
                               context.num_input_pipelines, context.input_pipeline_id)
    key = data_key(params)
    batch_size = per_replica_batch_size(params, context)
    length = len(sampler) if sampler is not None else len(dataset)  # type: ignore[arg-type]
    if params.drop_remainder and length < batch_size:
        if len(dataset) == 0:  # type: ignore[arg-type]
            # No batch size, no drop_remainder makes a batch of nothing: no fix of them is told.
            raise ConfigError(
                f"{key}: the dataset built for it holds no example, so not one batch can be "
                "made at any batch size. Check what builds it (the task's build_inputs and the "
                "config it reads).")
        # A share of 0 examples (fewer examples than processes): no batch size helps either.
        smaller = (f"{key}.global_batch_size to at most {length * context.num_replicas_in_sync}"
                   ", or " if length else "")
        raise ConfigError(
            f"{key}.global_batch_size (got {params.global_batch_size}) is larger than the data "
            f"({length} examples{' per process' if context.num_replicas_in_sync > 1 else ''}) "
            f"and drop_remainder is true, so not one batch would be made. Set {smaller}"
            f"{key}.drop_remainder=false."
        )
    arguments: dict[str, Any] = dict(
        batch_size=batch_size,
        shuffle=shuffle if sampler is None else None,
        sampler=sampler,
        drop_last=params.drop_remainder,
        num_workers=params.num_workers,
        pin_memory=torch.accelerator.is_available(),
        generator=torch.Generator().manual_seed(seed) if sampler is None else None,
    )
    if getattr(params, "stateful_loader", False):
        loader_class = _stateful_loader_class(training)
        with warnings.catch_warnings():  # torchdata calls a deprecated torch function
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            return loader_class(dataset, **arguments)
    return DataLoader(dataset, **arguments)


def _stateful_loader_class(training: bool) -> Any:
    """torchdata's ``StatefulDataLoader`` (imported on first use: torchdata is optional)."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        key = "task.train_data" if training else "task.validation_data"
        raise ConfigError(
            f"{key}.stateful_loader is true but torchdata is not installed: pip install "
            f"torchdata, or set {key}.stateful_loader=false (cadence then records the index "
            "order of each pass itself)."
        ) from None
    return StatefulDataLoader


# A pass's order, kept compactly: what draws it again instead of the order itself. A checkpoint
# taken in mid-pass needs the order of the running pass; for the samplers below it holds how to
# draw that order again (the sampler's settings and, where the sampler draws from a generator,
# that generator's state as the pass started: a fixed size, whatever the data set's) and a
# digest of the order, checked when it is drawn again. Only these exact types: a subclass, or
# any other sampler, may draw from anything (Python's `random`, NumPy), and its order is saved.

def order_recipe(sampler: Sampler[int]) -> dict[str, Any] | None:
    """How to draw the pass `sampler` is about to draw again, taken just before it draws; None
    where the order must be saved itself."""
    if type(sampler) is DistributedSampler:
        return {"sampler": "DistributedSampler", "num_replicas": sampler.num_replicas,
                "rank": sampler.rank, "seed": sampler.seed, "epoch": sampler.epoch,
                "shuffle": sampler.shuffle, "drop_last": sampler.drop_last}
    if type(sampler) is ShardSampler:
        return {"sampler": "ShardSampler", "num_replicas": sampler.num_replicas,
                "rank": sampler.rank, "length": sampler.length}
    if type(sampler) is RandomSampler:
        generator = sampler.generator
        if generator is None:  # it seeds itself from the global generator
            state = torch.get_rng_state()
        elif isinstance(generator, torch.Generator) and generator.device.type == "cpu":
            state = generator.get_state()
        else:
            return None
        return {"sampler": "RandomSampler", "replacement": sampler.replacement,
                "num_samples": sampler.num_samples, "global_generator": generator is None,
                "generator": state}
    return None


def draw_order(recipe: dict[str, Any], dataset: Any) -> list[int]:
    """The order `recipe` (from `order_recipe`) describes, over `dataset`, drawn again without
    touching any generator in use: a new sampler, with a new generator set to the saved state
    (the global generator, where the sampler drew from it, is set back after)."""
    name = recipe["sampler"]
    if name == "DistributedSampler":
        distributed: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=int(recipe["num_replicas"]), rank=int(recipe["rank"]),
            shuffle=bool(recipe["shuffle"]), seed=int(recipe["seed"]),
            drop_last=bool(recipe["drop_last"]))
        distributed.set_epoch(int(recipe["epoch"]))
        return list(distributed)
    if name == "ShardSampler":
        return list(ShardSampler(int(recipe["length"]), int(recipe["num_replicas"]),
                                 int(recipe["rank"])))
    if name == "RandomSampler":
        with torch.random.fork_rng(devices=[]):
            generator = None
            if recipe["global_generator"]:
                torch.set_rng_state(recipe["generator"])
            else:
                generator = torch.Generator()
                generator.set_state(recipe["generator"])
            return list(RandomSampler(dataset, replacement=bool(recipe["replacement"]),
                                      num_samples=int(recipe["num_samples"]),
                                      generator=generator))
    raise ValueError(f"the sampler {name!r} of a saved pass order is not one cadence draws again")


def shard_recipes(recipe: dict[str, Any]) -> list[dict[str, Any]] | None:
    """For one shard of a global order (a `DistributedSampler`'s or a `ShardSampler`'s), the
    recipes of every shard of that order, in rank order; None for other samplers."""
    if recipe["sampler"] not in ("DistributedSampler", "ShardSampler"):
        return None
    common = {key: value for key, value in recipe.items()
              if key not in ("order_length", "sha256")}  # the check is of one shard's order
    return [{**common, "rank": rank} for rank in range(int(recipe["num_replicas"]))]


def order_digest(order: list[int]) -> str:
    """The SHA-256 of an order's indices as little-endian int64s (once per pass, not per step)."""
    buffer = array.array("q", order)
    if sys.byteorder == "big":
        buffer.byteswap()
    return hashlib.sha256(buffer.tobytes()).hexdigest()
