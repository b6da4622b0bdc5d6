"""A data position resharded to another number of processes, on the data iterator alone: every
new rank takes the same number of steps -- the number the resume line states -- and the rest of
the pass is covered by the rule of `cadence.data.resharding`, nothing else skipped or repeated.

Old and new world sizes 1-8, pass lengths, batch sizes, ``drop_last`` and the point where the
old ranks stopped are drawn by hypothesis; each rank is a `DataIterator` over a `DataLoader`
with a `DistributedSampler` for its rank, as in a torchrun job (no process group is needed).
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from cadence.core.errors import CheckpointError, CheckpointIncompatibleError
from cadence.data.iterator import DataIterator
from cadence.data.resharding import deal, padding, steps_in_rest


def iterators(examples: int, world_size: int, batch_size: int, drop_last: bool):
    """One iterator per rank of a job of `world_size` over a pass of `examples`."""
    data = list(range(examples))
    return [DataIterator(DataLoader(data, batch_size=batch_size, drop_last=drop_last,
                                    sampler=DistributedSampler(data, num_replicas=world_size,
                                                               rank=rank, shuffle=True, seed=3)))
            for rank in range(world_size)]


def rest_of_the_pass(iterator: DataIterator) -> list[list[int]]:
    batches = []
    while True:
        try:
            batches.append(iterator.next_in_pass().tolist())
        except StopIteration:
            return batches


@settings(max_examples=300, deadline=None)
@given(examples=st.integers(1, 120), old=st.integers(1, 8), new=st.integers(1, 8),
       batch_size=st.integers(1, 9), drop_last=st.booleans(), data=st.data())
def test_every_new_rank_takes_the_steps_the_line_states_and_the_rest_is_covered_by_the_rule(
        examples, old, new, batch_size, drop_last, data):
    before = iterators(examples, old, batch_size, drop_last)
    pass_length = len(before[0].source)
    if pass_length == 0:
        return  # not one batch a rank: no job trains on it (the Task refuses it before step 0)
    taken = data.draw(st.integers(1, pass_length), label="batches the old ranks took")
    consumed = [i for it in before for _ in range(taken) for i in next(it).tolist()]
    states = [it.state_dict() for it in before]
    rest = [i for order in _orders(before) for i in order]  # what the old ranks had not reached
    after = iterators(examples, new, batch_size, drop_last)
    lines = [it.load_resharded(states, rank, new) for rank, it in enumerate(after)]
    left = set(rest) - set(consumed)  # (a padded pass repeats some of what was consumed)
    steps = steps_in_rest(len(left), new, batch_size, drop_last)
    if steps == 0:  # not one batch a rank: the pass is over, as its last partial batch
        assert all(it.epoch == 1 and it.at_pass_start for it in after)
        assert "pass 2 starts" in lines[0]
        return
    taken_after = [rest_of_the_pass(it) for it in after]
    assert [len(batches) for batches in taken_after] == [steps] * new  # in step, all of them
    assert all(it.epoch == 1 and it.batches == 0 for it in after)  # and the pass ended together
    stated = re.search(r"(\d+) batch(es)? each", lines[0])
    assert stated and int(stated.group(1)) == steps, lines[0]
    seen = [i for batches in taken_after for batch in batches for i in batch]
    assert not set(seen) & set(consumed)  # nothing the old ranks trained on comes again
    assert set(seen) <= left
    repeated = len(seen) - len(set(seen))
    assert repeated <= padding(len(left), new) < max(new, 1)  # the rule's padding, at most
    share = math.ceil(len(left) / new)
    skipped = len(left - set(seen))
    assert skipped <= (new * (share % batch_size) if drop_last else 0)  # last partial batches


def _orders(iterators_: list[DataIterator]) -> list[list[int]]:
    """The examples each old rank had not reached yet: the order of its sampler's pass (a
    `DistributedSampler` draws it again as it is, the saved position holds only its recipe),
    after the batches its saved position says it took."""
    orders = []
    for it in iterators_:
        state = it.state_dict()
        order = list(it.source.sampler)
        orders.append(order[state["batches"] * state["batch_size"]:])
    return orders


def test_the_rule_pads_with_the_first_examples_and_deals_round_robin():
    assert deal([4, 5, 6, 7], 3) == [[4, 7], [5, 4], [6, 5]]
    assert deal([9], 4) == [[9], [9], [9], [9]]
    assert steps_in_rest(1054, 3, 32, drop_last=True) == 11  # the report's case: 352 a rank
    assert steps_in_rest(1056, 3, 32, drop_last=True) == 11
    assert steps_in_rest(1057, 3, 32, drop_last=False) == 12


def test_the_reported_resume_deals_equal_steps_and_says_what_it_drops():
    """DDP digits, 2 ranks stopped mid-pass with 1054 examples left, resumed by 3 with batches
    of 32 and drop_last: the line said 11 batches each while ranks 1 and 2 took 10 and skipped
    31 examples each; now every rank takes 10 and the line says so."""
    assert [len(share) for share in deal(list(range(1054)), 3)] == [352, 352, 352]
    before = iterators(1438, 2, 32, drop_last=True)
    for it in before:
        for _ in range(6):
            next(it)
    states = [it.state_dict() for it in before]
    after = iterators(1438, 3, 32, drop_last=True)
    lines = [it.load_resharded(states, rank, 3) for rank, it in enumerate(after)]
    counts = [len(rest_of_the_pass(it)) for it in after]
    assert counts == [11, 11, 11]
    assert ("the 1054 examples left in pass 1 are dealt to the 3 ranks, 11 batches each (2 "
            "repeated to deal them evenly; the last 0" not in lines[0])
    assert lines[0] == ("the 1054 examples left in pass 1 are dealt to the 3 ranks, 11 batches "
                        "each (2 repeated to deal them evenly); the next passes are sharded as "
                        "usual.")


def test_a_position_that_cannot_be_dealt_is_an_incompatibility_not_damage():
    before = iterators(40, 2, 4, drop_last=False)
    next(before[0])  # rank 0 one batch ahead of rank 1: their positions disagree
    states = [it.state_dict() for it in before]
    with pytest.raises(CheckpointIncompatibleError, match="taken in the middle of a pass by 2 "
                       "processes and this job has 3: the old ranks' positions disagree"):
        iterators(40, 3, 4, drop_last=False)[0].load_resharded(states, 0, 3)
    assert issubclass(CheckpointIncompatibleError, CheckpointError)
