"""Resharding a data position when a job resumes with another number of processes.

Each rank of a distributed job reads its own shard of every pass (a ``DistributedSampler``),
and its checkpoint holds the order of its shard and how many batches it took. Resumed by a
different number of processes, the examples the old ranks had not reached yet -- the rest of
the pass -- are dealt to the new ranks by the rule a ``DistributedSampler`` deals a whole pass:

1. the rest is padded to a multiple of the new world size with its own first examples (at most
   ``world_size - 1`` examples are seen twice, as in any pass a ``DistributedSampler`` pads);
2. it is dealt round-robin, so every new rank holds the same number of examples;
3. each rank batches its share as its loader batches a pass: with ``drop_last`` a last partial
   batch is dropped (fewer than ``batch_size`` examples a rank, as in any pass), else it is kept.

So every new rank takes the same number of steps in the rest of the pass (`steps_in_rest`, the
count the loader then yields), and the ranks reach the pass's end together; the passes after it
are sharded as usual.

>>> rest_of_pass([[0, 2, 4, 6], [1, 3, 5, 7]], consumed=2)   # two old ranks, 2 examples each
[4, 5, 6, 7]
>>> deal([4, 5, 6, 7], world_size=3)   # padded with 4 and 5, then dealt
[[4, 7], [5, 4], [6, 5]]
>>> steps_in_rest(4, world_size=3, batch_size=2, drop_last=True)
1
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


def padding(count: int, world_size: int) -> int:
    """How many examples are repeated to deal `count` evenly over `world_size` ranks."""
    return -count % world_size if count else 0


def deal(rest: Sequence[int], world_size: int) -> list[list[int]]:
    """`rest` padded with its first examples to a multiple of `world_size`, dealt round-robin:
    one share per new rank, all of one length."""
    padded = list(rest) + list(rest[:padding(len(rest), world_size)])
    while len(padded) % world_size:  # fewer examples than the padding needs: cycle them
        padded += list(rest[:world_size - len(padded) % world_size])
    return [padded[rank::world_size] for rank in range(world_size)]


def steps_in_rest(count: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """The batches every new rank takes from the rest of a pass of `count` examples."""
    share = math.ceil(count / world_size)
    return share // batch_size if drop_last else math.ceil(share / batch_size)
