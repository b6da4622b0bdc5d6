"""The degrees of a job's dimensions, the coordinates of its ranks, and the layouts that work.

A job's processes split the work along up to five dimensions (torchtitan's ``ParallelDims``),
outermost first: ``pp`` (pipeline stages), ``dp_replicate`` (data-parallel replicas),
``dp_shard`` (data-parallel shards: FSDP2), ``cp`` (context parallelism), ``tp`` (tensor
parallelism). `ParallelDims` holds their degrees -- their product is the world size;
``dp_shard=-1`` takes what the others leave -- and the arithmetic of a rank's coordinates: rank
r's coordinate along each dimension is r written in the mixed radix of the degrees, ``tp``
varying fastest, so that a tensor-parallel group is made of neighbouring ranks (one machine's
GPUs, its fast links). A rank's *data coordinate* (``dp_rank`` of ``dp_size``) is its place
among the data-parallel ranks: its tensor-, context- and pipeline-parallel peers share it.

Pure arithmetic, no process and no torch: `cadence.engine.runtime.Runtime` holds one for the
process, and a checkpoint records the one it was written at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cadence.core.errors import ConfigError

DIMENSIONS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The mesh's dimensions, outermost first: a rank's coordinates are its number in the mixed
radix of the degrees, ``tp`` varying fastest."""


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of a job's dimensions (see the module docstring); their product is
    `world_size`. Build it with `resolve`, which infers ``dp_shard=-1`` and checks the rest.

    >>> dims = ParallelDims.resolve(8, dp_shard=-1, tp=2)
    >>> dims.dp_shard, dims.dp_size, dims.describe()
    (4, 4, 'dp_shard=4 x tp=2')
    >>> dims.coordinates(5), dims.dp_rank(5)
    ({'pp': 0, 'dp_replicate': 0, 'dp_shard': 2, 'cp': 0, 'tp': 1}, 2)
    """

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1

    @classmethod
    def resolve(cls, world_size: int, *, dp_replicate: int = 1, dp_shard: int = -1,
                cp: int = 1, tp: int = 1, pp: int = 1,
                setting: str = "runtime.parallelism") -> ParallelDims:
        """The degrees of a job of `world_size` processes: ``dp_shard=-1`` takes what the
        others leave.

        Raises:
            ConfigError: naming the degrees and the world size, for a degree that is not a
                positive int (-1 allowed for dp_shard), or degrees whose product is not the
                world size.
        """
        given = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp,
                 "tp": tp}
        for name, degree in given.items():
            if type(degree) is not int or (degree < 1 and not (name == "dp_shard"
                                                               and degree == -1)):
                raise ConfigError(f"{setting}.{name} (got {degree!r}) must be a positive int"
                                  + (" or -1 (what the other degrees leave)"
                                     if name == "dp_shard" else "") + ".")
        others = math.prod(degree for name, degree in given.items() if name != "dp_shard")
        if dp_shard == -1:
            if world_size % others:
                raise ConfigError(
                    f"{setting}: {_product(given)} leaves no whole dp_shard for "
                    f"{world_size} process{'es' if world_size != 1 else ''}: "
                    f"{_degrees(given, 'dp_shard')} = {others} must divide the world size. "
                    "Start a multiple of it (torchrun --nproc_per_node=...), or change the "
                    "degrees.")
            given["dp_shard"] = world_size // others
        if math.prod(given.values()) != world_size:
            raise ConfigError(
                f"{setting}: {_product(given)} = {math.prod(given.values())} processes, and "
                f"this job has {world_size}: the degrees' product must be the world size. "
                "Set one of them to what the others leave (dp_shard=-1), or start as many "
                "processes as they make.")
        return cls(**given)

    @property
    def degrees(self) -> dict[str, int]:
        """Each dimension's degree, outermost first."""
        return {name: getattr(self, name) for name in DIMENSIONS}

    @property
    def world_size(self) -> int:
        """The degrees' product: how many processes the layout has."""
        return math.prod(self.degrees.values())

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: how many data shards the job reads (``dp_replicate *
        dp_shard``)."""
        return self.dp_replicate * self.dp_shard

    def coordinates(self, rank: int) -> dict[str, int]:
        """Rank `rank`'s index along each dimension (``tp`` varies fastest)."""
        coordinates: dict[str, int] = {}
        for name in reversed(DIMENSIONS):
            degree = getattr(self, name)
            coordinates[name] = rank % degree
            rank //= degree
        return {name: coordinates[name] for name in DIMENSIONS}

    def dp_rank(self, rank: int) -> int:
        """Rank `rank`'s data shard: its place among the data-parallel ranks."""
        coordinates = self.coordinates(rank)
        return coordinates["dp_replicate"] * self.dp_shard + coordinates["dp_shard"]

    def ranks_of_data_shard(self, dp_rank: int) -> list[int]:
        """The ranks that read data shard `dp_rank` (its tensor-, context- and
        pipeline-parallel peers), lowest first."""
        return [rank for rank in range(self.world_size) if self.dp_rank(rank) == dp_rank]

    def describe(self) -> str:
        """The layout in words: the degrees above 1 (``dp_shard=2 x tp=2``; ``one process``)."""
        parts = [f"{name}={degree}" for name, degree in self.degrees.items() if degree > 1]
        return " x ".join(parts) or "one process"


def _product(degrees: dict[str, int]) -> str:
    return " x ".join(f"{name}={degree}" for name, degree in degrees.items())


def _degrees(degrees: dict[str, int], leaving_out: str) -> str:
    return " x ".join(f"{name}={degree}" for name, degree in degrees.items()
                      if name != leaving_out)


def data_parallel_dims(world_size: int, strategy: str) -> ParallelDims:
    """The one-dimensional layout of ``runtime.strategy``: every process a data shard -- a
    replica for ``ddp`` (and ``none``), a shard for ``fsdp2``."""
    if strategy == "fsdp2":
        return ParallelDims(dp_shard=world_size)
    return ParallelDims(dp_replicate=world_size)



def resolve_layout_strategy(strategy: str, dims: ParallelDims) -> str:
    """The strategy `strategy` stands for on a layout of several dimensions: ``auto`` is FSDP2
    where there are data shards (HSDP with replicas too), and over replicas beside tensor or
    pipeline parallelism (HSDP with shards of one); DDP over replicas alone; else none."""
    if strategy != "auto":
        return strategy
    model_parallel = dims.tp > 1 or dims.pp > 1 or dims.cp > 1
    if dims.dp_shard > 1 or (dims.dp_replicate > 1 and model_parallel):
        return "fsdp2"  # FSDP2 composes with the model-parallel dimensions, DDP does not
    return "ddp" if dims.dp_replicate > 1 else "none"


def check_layout(dims: ParallelDims, strategy: str, setting: str = "runtime.parallelism"
                 ) -> None:
    """Refuses a layout that cannot work, in one line, before anything is built.

    Raises:
        ConfigError: tensor or pipeline parallelism with ``strategy=ddp`` (DDP holds whole
            replicas: FSDP2 composes with them), DDP or none over data shards, context
            parallelism (not supported yet).
    """
    if strategy == "ddp" and (dims.tp > 1 or dims.pp > 1 or dims.cp > 1):
        raise ConfigError(
            f"{setting}: {dims.describe()} with runtime.strategy=ddp: DDP holds a whole "
            "replica on each rank, so it does not compose with tensor or pipeline "
            "parallelism. Set runtime.strategy=fsdp2 (or auto): FSDP2 shards over dp_shard, "
            "and with dp_replicate > 1 it is HSDP.")
    if strategy in ("ddp", "none") and dims.dp_shard > 1 and (
            dims.tp > 1 or dims.pp > 1 or dims.cp > 1 or dims.dp_replicate > 1):
        raise ConfigError(
            f"{setting}: dp_shard={dims.dp_shard} shards the model, which runtime.strategy="
            f"{strategy} does not: set runtime.strategy=fsdp2 (or auto), or give the data "
            "ranks to dp_replicate.")
    if dims.cp > 1:
        raise ConfigError(
            f"{setting}.cp={dims.cp}: context parallelism is not supported yet (on the CPU "
            "torch 2.13 has no sharded attention kernel to train it). Set cp=1.")


def resolve_layout(world_size: int, strategy: str = "auto", *, dp_replicate: int = 1,
                   dp_shard: int = -1, tp: int = 1, pp: int = 1, cp: int = 1,
                   setting: str = "runtime.parallelism") -> tuple[ParallelDims, str]:
    """The layout of a job of `world_size` processes and the strategy its data-parallel
    dimensions hold the model with: with no degree given, ``runtime.strategy``'s
    one-dimensional layout (DDP's replicas, FSDP2's shards); else the degrees
    (`ParallelDims.resolve`) and ``auto`` resolved on them (`resolve_layout_strategy`).

    Raises:
        ConfigError: for degrees that do not make the world size, or a layout that cannot work
            (`check_layout`).
    """
    if strategy in ("auto", "ddp", "none") and (dp_shard == -1 and dp_replicate == 1
                                                  and tp == pp == cp == 1):
        resolved = "ddp" if strategy == "ddp" or (strategy == "auto" and world_size > 1) else "none"
        dims = data_parallel_dims(world_size, "ddp" if resolved == "ddp" else "none")
    else:
        dims = ParallelDims.resolve(world_size, dp_replicate=dp_replicate, dp_shard=dp_shard,
                                    cp=cp, tp=tp, pp=pp, setting=setting)
        resolved = resolve_layout_strategy(strategy, dims)
    check_layout(dims, resolved, setting)
    return dims, resolved
