"""StreamLoader: a streamed dataset -- a Hugging Face ``datasets.IterableDataset`` built here
from a dict, or any iterable with a state -- resumed exactly per data shard (through the state
file a checkpoint writes), and a resume at another number of data shards said in one line."""

import io

import numpy as np
import pytest
import torch

from cadence.core.errors import CheckpointIncompatibleError
from cadence.data.iterator import DataIterator
from cadence.data.streaming import StreamLoader
from cadence.engine.state_file import read_state, write_state

datasets = pytest.importorskip("datasets")


def stream(examples=60, files=4):
    """Examples of 1 to 9 tokens, each token its example's number, in `files` files."""
    ids = [[n] * (1 + n % 9) for n in range(examples)]
    return datasets.Dataset.from_dict({"input_ids": ids}).to_iterable_dataset(num_shards=files)


def through_a_checkpoint(state):
    """`state` written to a state file and read back, as a checkpoint does."""
    buffer = io.BytesIO()
    write_state(state, buffer)
    buffer.seek(0)
    return read_state(buffer)


def flat(batch):
    features, labels = batch
    tensors = [*features.values(), labels] if isinstance(features, dict) else [features, labels]
    return torch.cat([t.flatten() for t in tensors]).tolist()


def loader(shard=0, shards=2, dataset=None, **options):
    return StreamLoader(dataset if dataset is not None else stream(), sequence_length=8,
                        batch_size=2, shard_index=shard, num_shards=shards, packing=True,
                        **options)


@pytest.mark.parametrize("stop", [1, 3, 6])
def test_a_datasets_stream_resumes_exactly_on_each_data_shard(stop):
    """Each of two data shards stops after `stop` batches (mid-pass, or where a pass ended) and
    a new loader on a new dataset object goes on from the state: the same batches, bit for bit,
    into the next pass."""
    for shard in (0, 1):
        whole = DataIterator(loader(shard))
        expected = [flat(whole.next_in_pass()) for _ in range(stop)]
        state = through_a_checkpoint(whole.state_dict())
        expected += [flat(b) for b in _take(whole, 8)]
        resumed = DataIterator(loader(shard))
        resumed.load_state_dict(state)
        assert expected[stop:] == [flat(b) for b in _take(resumed, 8)], shard


def _take(iterator, count):
    """`count` batches across pass ends."""
    batches = []
    while len(batches) < count:
        try:
            batches.append(iterator.next_in_pass())
        except StopIteration:
            continue
    return batches


def test_the_shards_split_the_stream_and_packing_keeps_its_examples_apart():
    seen = []
    for shard in (0, 1):
        for features, labels in loader(shard):
            ids, positions = features["input_ids"], features["position_ids"]
            seen += ids[:, 0].tolist()
            starts = positions == 0
            assert torch.all((labels == -100) | (torch.roll(ids, -1, 1) == labels) |
                             (torch.arange(8) == 7))
            # a position restarts exactly where the example (its token value) changes
            changed = torch.cat([torch.ones(len(ids), 1, dtype=torch.bool),
                                 ids[:, 1:] != ids[:, :-1]], 1)
            assert torch.equal(starts, changed)
    assert len(set(seen)) > 10


class Counter:
    """An iterable with its own state: the numbers 0..n-1, each an example of one token."""

    def __init__(self, n):
        self.n, self.at, self.start = n, 0, 0

    def __iter__(self):
        self.at = self.start
        while self.at < self.n:
            self.at += 1
            yield [self.at - 1] * 3

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        self.start = self.at = state["at"]


def test_any_iterable_with_a_state_resumes_each_shard_taking_every_nth_example():
    whole = loader(1, 3, Counter(90), column=None)
    batches = iter(whole)
    first = [flat(next(batches)) for _ in range(2)]
    state = whole.state_dict()
    expected = [flat(next(batches)) for _ in range(3)]
    resumed = loader(1, 3, Counter(90), column=None)
    resumed.load_state_dict(state)
    assert [flat(b) for b in list(iter(resumed))[:3]] == expected
    assert first[0][0] == 1 and all(value % 3 == 1 for value in first[0][:8])


def test_another_number_of_data_shards_is_refused_in_one_line_or_restarts_saying_so():
    states = [loader(shard).state_dict() for shard in (0, 1)]
    with pytest.raises(CheckpointIncompatibleError, match=(
            "saved by 2 data shards and this job has 3: .*cannot be dealt to another number of "
            "shards.*Resume with 2 data shards, or build the StreamLoader with "
            "reshard='restart'")) as raised:
        loader(0, 3).load_resharded(states, 0, 3)
    assert "\n" not in str(raised.value)
    restarted = loader(0, 3, reshard="restart")
    said = restarted.load_resharded(states, 0, 3)
    assert "starts pass 1 again from its beginning at 3 data shards (saved by 2)" in said
    assert flat(next(iter(restarted))) == flat(next(iter(loader(0, 3))))


def test_an_iterable_without_a_state_is_refused():
    with pytest.raises(TypeError, match="has no state_dict"):
        StreamLoader([[1, 2, 3]], 4, 1)
    with pytest.raises(ValueError, match="reshard"):
        loader(reshard="later")


def test_buffered_tokens_are_saved_as_arrays():
    whole = loader(0)
    next(iter(whole))
    state = whole.state_dict()
    assert isinstance(state["tokens"], np.ndarray) and state["tokens"].size >= 1
