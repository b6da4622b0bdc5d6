"""Resharding a data position when a job resumes with another number of processes.

Each rank of a distributed job reads its own shard of every pass (a ``DistributedSampler``),
and its checkpoint holds the order of its shard and how many batches it took. Resumed by a
different number of processes, the examples the old ranks had not reached yet -- the rest of
the pass -- are dealt round-robin to the new ranks, each example once; the passes after it are
sharded as usual.

>>> rest_of_pass([[0, 2, 4, 6], [1, 3, 5, 7]], consumed=2)   # two old ranks, 2 examples each
[4, 5, 6, 7]
>>> share([4, 5, 6, 7], rank=0, world_size=3), share([4, 5, 6, 7], rank=2, world_size=3)
([4, 7], [6])
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def rest_of_pass(orders: Sequence[Sequence[int]], consumed: int) -> list[int]:
    """The examples of a pass that no old rank reached, in the order of the global sampling:
    the old shards interleaved (rank 0's i-th, rank 1's i-th, ...) after the first `consumed`
    of each, each example once (a sampler that padded its shards repeats some)."""
    seen = {index for order in orders for index in order[:consumed]}
    rest: list[int] = []
    for position in range(consumed, max((len(order) for order in orders), default=0)):
        for order in orders:
            if position < len(order) and order[position] not in seen:
                seen.add(order[position])
                rest.append(order[position])
    return rest


def share(rest: Sequence[int], rank: int, world_size: int) -> list[int]:
    """The part of `rest` that new rank `rank` of `world_size` reads."""
    return list(rest[rank::world_size])


def batches_per_rank(count: int, world_size: int, batch_size: int) -> list[int]:
    """How many batches each new rank would take from the rest of a pass of `count` examples."""
    return [math.ceil(len(range(rank, count, world_size)) / batch_size)
            for rank in range(world_size)]
