"""The data position in its compact form: for a sampler cadence can draw again, a checkpoint
holds how the pass's order was drawn (the generator's state as the pass started, or the seed and
epoch) and a digest of it, not the order -- rank files do not grow with the data set -- and a
resume draws the order again, checks it, and continues exactly. Positions saved with the order
itself (other samplers, earlier versions) still restore."""

from __future__ import annotations

import io
import os
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler, Sampler, SubsetRandomSampler

from cadence.core.errors import CheckpointIncompatibleError
from cadence.data.iterator import DataIterator
from cadence.data.sharding import ShardSampler
from cadence.engine.rank_state import rank_file, rank_payload, write_rank_state
from cadence.engine.rng import capture_rng_state
from cadence.engine.state_file import read_state, write_state

LOADERS = {
    "random, own generator": lambda data: DataLoader(
        data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1)),
    "random, global generator": lambda data: DataLoader(data, batch_size=8, shuffle=True),
    "distributed": lambda data: DataLoader(data, batch_size=8, sampler=DistributedSampler(
        data, num_replicas=1, rank=0, seed=3)),
    "shards": lambda data: DataLoader(data, batch_size=8,
                                      sampler=ShardSampler(len(data), num_replicas=1, rank=0)),
}


def take(iterator: DataIterator, count: int) -> list[list[int]]:
    """`count` batches, passes ended as they run out."""
    out: list[list[int]] = []
    while len(out) < count:
        try:
            out.append(next(iterator).tolist())
        except StopIteration:
            iterator.end_pass()
    return out


def through_a_file(state):
    """`state` written to a state file and read back, as a checkpoint holds it."""
    buffer = io.BytesIO()
    write_state(state, buffer)
    buffer.seek(0)
    return read_state(buffer)


@pytest.mark.parametrize("kind", list(LOADERS))
def test_a_rank_file_does_not_grow_with_the_data_set(tmp_path, kind):
    sizes, rng = {}, capture_rng_state()  # one random state for both: Python's varies in size
    for examples in (1_000, 100_000):
        data = DataIterator(LOADERS[kind](list(range(examples))))
        take(data, 3)  # in mid-pass: the order of the pass is needed to resume
        state = data.state_dict()
        assert "order" not in state and state["pass_order"]["order_length"] == examples
        folder = tmp_path / str(examples)
        folder.mkdir()
        write_rank_state(rank_payload({"train_data": data}, rng), folder, 0)
        sizes[examples] = rank_file(folder, 0).stat().st_size
    assert abs(sizes[100_000] - sizes[1_000]) <= 128  # digits, 64-byte alignment; was +800 KB
    assert sizes[100_000] < 40_000  # random states: a few generators' worth


@pytest.mark.parametrize("kind", list(LOADERS))
@pytest.mark.parametrize("stop_after", [1, 4, 6])  # 5 batches a pass: mid-pass, and the next
def test_a_resume_mid_pass_from_the_compact_form_is_exact(kind, stop_after):
    torch.manual_seed(0)
    uninterrupted = take(DataIterator(LOADERS[kind](list(range(40)))), 13)

    torch.manual_seed(0)
    first = DataIterator(LOADERS[kind](list(range(40))))
    before = take(first, stop_after)
    saved, rng = through_a_file(first.state_dict()), torch.get_rng_state()
    assert "order" not in saved

    torch.manual_seed(12345)  # a new process: another global RNG until the restore
    second = DataIterator(LOADERS[kind](list(range(40))))
    torch.set_rng_state(rng)
    second.load_state_dict(saved)
    resumed = take(second, 1)  # (the last batch of a pass at most: still in the same one)
    again = second.state_dict()  # saved again in the resumed pass: still compact, same recipe
    assert "order" not in again and again["pass_order"]["sha256"] == saved["pass_order"]["sha256"]
    assert before + resumed + take(second, 13 - stop_after - 1) == uninterrupted


def test_a_position_saved_with_the_whole_order_still_restores():
    """The form of earlier versions (and of samplers cadence cannot draw again): the order
    itself, an int64 tensor."""
    order = torch.randperm(40, generator=torch.Generator().manual_seed(5))
    old = {"kind": "loader", "epoch": 2, "batches": 2, "batch_size": 8, "order": order,
           "generators": {}}
    data = DataIterator(DataLoader(list(range(40)), batch_size=8, shuffle=True))
    data.load_state_dict(through_a_file(old))
    assert take(data, 3) == [order[16:24].tolist(), order[24:32].tolist(),
                             order[32:40].tolist()]
    assert data.epoch == 2 and data.batches == 5  # counted from the pass start


@pytest.mark.parametrize("changed", ["another length", "another digest"])
def test_an_order_that_is_drawn_differently_is_refused(changed):
    first = DataIterator(LOADERS["random, own generator"](list(range(40))))
    take(first, 2)
    saved = first.state_dict()
    examples = 41 if changed == "another length" else 40
    if changed == "another digest":
        saved["pass_order"] = {**saved["pass_order"], "sha256": "0" * 64}
    second = DataIterator(LOADERS["random, own generator"](list(range(examples))))
    with pytest.raises(CheckpointIncompatibleError, match="the data set or the sampler changed"):
        second.load_state_dict(saved)


class EveryOther(Sampler[int]):
    """A sampler cadence does not know: it may draw from anything."""

    def __iter__(self):
        return iter(range(0, 40, 2))

    def __len__(self):
        return 20


@pytest.mark.parametrize("sampler", [EveryOther(), SubsetRandomSampler(list(range(30)))],
                         ids=["own sampler", "SubsetRandomSampler"])
def test_a_sampler_cadence_cannot_draw_again_saves_its_order(sampler):
    first = DataIterator(DataLoader(list(range(40)), batch_size=4, sampler=sampler))
    before = take(first, 2)
    saved = through_a_file(first.state_dict())
    assert "pass_order" not in saved and saved["order"].shape == (len(sampler),)
    second = DataIterator(DataLoader(list(range(40)), batch_size=4, sampler=sampler))
    second.load_state_dict(saved)
    seen = [i for batch in before + take(second, 3) for i in batch]
    assert len(set(seen)) == len(seen) == 20 and set(seen) <= set(sampler)  # the pass goes on


@contextmanager
def world(size: int):
    """A job of `size` processes, as `cadence.core.rank` sees it without a process group."""
    saved = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(size)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["WORLD_SIZE"]
        else:
            os.environ["WORLD_SIZE"] = saved


def ranks(examples: int, world_size: int, batch_size: int, drop_last: bool):
    data = list(range(examples))
    return [DataIterator(DataLoader(data, batch_size=batch_size, drop_last=drop_last,
                                    sampler=DistributedSampler(data, num_replicas=world_size,
                                                               rank=rank, seed=3)))
            for rank in range(world_size)]


def rest(iterator: DataIterator) -> list[list[int]]:
    """The batches left in the current pass (none: a new sharding that makes no batch)."""
    batches = []
    while True:
        try:
            batches.append(iterator.next_in_pass().tolist())
        except (StopIteration, ValueError):
            return batches


@settings(max_examples=120, deadline=None)
@given(examples=st.integers(1, 90), old=st.integers(1, 6), new=st.integers(1, 6),
       batch_size=st.integers(1, 6), drop_last=st.booleans(), data=st.data())
def test_one_old_ranks_compact_position_reshards_as_all_of_them_do(
        examples, old, new, batch_size, drop_last, data):
    """What a new rank reads at another world size when every old rank held a shard of one
    global order: the file of the old rank of its number, else rank 0's. From that one state it
    takes the same batches, and says the same, as from every old rank's."""
    before = ranks(examples, old, batch_size, drop_last)
    if len(before[0].source) == 0:
        return
    taken = data.draw(st.integers(0, len(before[0].source)), label="batches the old ranks took")
    for it in before:
        take(it, taken)
    with world(old):
        states = [it.state_dict() for it in before]
    assert all(state["reshards_alone"] == old for state in states)
    assert all("order" not in state for state in states if state["batches"])
    from_all = ranks(examples, new, batch_size, drop_last)
    from_one = ranks(examples, new, batch_size, drop_last)
    lines_all = [it.load_resharded(states, r, new) for r, it in enumerate(from_all)]
    lines_one = [it.load_resharded([states[r if r < old else 0]], r, new)
                 for r, it in enumerate(from_one)]
    assert lines_one == lines_all
    assert [rest(it) for it in from_one] == [rest(it) for it in from_all]
    assert [(it.epoch, it.batches) for it in from_one] == [(it.epoch, it.batches)
                                                          for it in from_all]


def test_a_position_that_needs_every_rank_does_not_say_it_reshards_alone():
    """Each rank's own random order, or a resharded pass (its dealt share is saved as it is):
    the other ranks' orders are not in this rank's file."""
    with world(2):
        own_order = DataIterator(LOADERS["random, own generator"](list(range(40))))
        take(own_order, 1)
        assert "reshards_alone" not in own_order.state_dict()
        old = ranks(40, 3, 4, drop_last=False)
        for it in old:
            take(it, 2)
        states = [it.state_dict() for it in old]
        dealt = ranks(40, 2, 4, drop_last=False)[0]
        dealt.load_resharded(states, 0, 2)
        take(dealt, 1)
        state = dealt.state_dict()
    assert "reshards_alone" not in state and "order" in state and "pass_order" not in state
