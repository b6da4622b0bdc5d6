"""Which process this is in a distributed job, for the torch-free engine: the runtime's answers.

The torch layer's `cadence.engine.runtime.Runtime` knows a process's place in the job -- its
rank, the world size and its *data coordinate* (``dp_rank``, ``dp_size``: its place among the
data-parallel ranks; tensor- and pipeline-parallel peers share one) -- and sets it here
(`set_place`), so that the Controller, the summaries and the run directory ask the same
questions without importing torch. Before a runtime exists (or after its process group is
gone), the process group answers, if the program already imported ``torch.distributed``, else
the launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); a process is then its own
data shard.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Place:
    """Where a process sits in its job (what `cadence.engine.runtime.Runtime` sets).

    Attributes:
        rank: its global rank.
        world_size: the job's processes.
        local_rank: its index on its machine.
        dp_rank: its data shard.
        dp_size: the job's data shards.
    """

    rank: int
    world_size: int
    local_rank: int
    dp_rank: int
    dp_size: int


_place: Place | None = None


def set_place(where: Place | None) -> None:
    """Records this process's place (the runtime calls it; None forgets it)."""
    global _place
    _place = where


def _process_group() -> Any:
    """``torch.distributed`` when it is imported and has a process group, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def place() -> Place:
    """This process's place: the runtime's while it matches the process group, else one where
    the process is its own data shard."""
    dist = _process_group()
    if dist is not None:
        rank, world = int(dist.get_rank()), int(dist.get_world_size())
    else:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    where = _place
    if where is not None and (where.rank, where.world_size) == (rank, world):
        return where
    return Place(rank, world, local_rank(), rank, world)


def process_rank() -> int:
    """This process's rank (0 in a single-process job)."""
    return place().rank


def world_size() -> int:
    """How many processes the job has (1 in a single-process job)."""
    return place().world_size


def data_rank() -> int:
    """This process's data shard: its place among the data-parallel ranks (0 in one process)."""
    return place().dp_rank


def data_size() -> int:
    """How many data shards the job reads: its data-parallel ranks (tensor- and
    pipeline-parallel peers read one shard)."""
    return place().dp_size


def local_rank() -> int:
    """This process's index on its machine (``LOCAL_RANK``; 0 when not launched by torchrun)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_chief() -> bool:
    """Whether this process is rank 0: the one that writes summaries, progress and exports."""
    return process_rank() == 0
