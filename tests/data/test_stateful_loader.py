"""torchdata's StatefulDataLoader as a training source: the loader's own state -- its workers'
included -- resumes a pass exactly where cadence's recorded index order cannot reach (an
iterable dataset, random augmentation in the workers); at another world size it is refused
unless the loader can reshard itself (docs/data.md)."""

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import cadence
from cadence import DataIterator
from cadence.core.errors import CheckpointError, ConfigError

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's

stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = stateful_dataloader.StatefulDataLoader


class AugmentedStream(IterableDataset):
    """A stream of 48 examples split between the workers, each example noised by the dataset's
    own generator (seeded per worker): its position and its generator are its state, which the
    StatefulDataLoader saves for each worker."""

    def __init__(self, n=48):
        self.n = n
        self.position = 0
        self.generator = None
        self._restored = None

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if self._restored is not None:  # resume the pass where the checkpoint was taken
            self.position, state = self._restored
            self.generator = torch.Generator()
            self.generator.set_state(state)
            self._restored = None
        else:
            self.position = 0
            if self.generator is None:
                self.generator = torch.Generator().manual_seed(1000 + worker)
        while self.position * workers + worker < self.n:
            index = self.position * workers + worker
            self.position += 1
            yield torch.tensor([float(index)]) + torch.rand(1, generator=self.generator)

    def state_dict(self):
        return {"position": self.position,
                "generator": self.generator.get_state() if self.generator is not None else None}

    def load_state_dict(self, state):
        if state["generator"] is not None:
            self._restored = (state["position"], state["generator"])


class Noised(Dataset):
    """A map-style dataset whose items are noised in the workers with the global torch RNG."""

    def __len__(self):
        return 40

    def __getitem__(self, index):
        return torch.tensor([float(index)]) + torch.rand(1)


def take(iterator, count):
    out = []
    while len(out) < count:
        try:
            out.append(next(iterator))
        except StopIteration:
            iterator.end_pass()
    return out


def same(left, right):
    return len(left) == len(right) and all(torch.equal(a, b) for a, b in zip(left, right))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop_after", [3, 7, 16])
def test_an_iterable_dataset_with_augmentation_in_workers_resumes_mid_pass_bitwise(
        workers, stop_after):
    def loader():
        return StatefulDataLoader(AugmentedStream(), batch_size=4, num_workers=workers)

    uninterrupted = take(DataIterator(loader()), 30)  # 12 batches a pass: 2.5 passes
    first = DataIterator(loader())
    before = take(first, stop_after)
    saved = first.state_dict()
    assert saved["kind"] == "stateful"
    second = DataIterator(loader())  # a new process: a new loader, new workers
    second.load_state_dict(saved)
    assert same(before + take(second, 30 - stop_after), uninterrupted)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop_after", [3, 10, 13])  # 10 batches a pass: 10 ends the first
def test_a_shuffled_stateful_loader_resumes_with_the_order_of_every_later_pass(workers,
                                                                              stop_after):
    def loader():
        return StatefulDataLoader(Noised(), batch_size=4, shuffle=True, num_workers=workers,
                                  generator=torch.Generator().manual_seed(3))

    def indices(batches):  # the order; the global-RNG noise is not the loader's state
        return [batch.floor().flatten().tolist() for batch in batches]

    uninterrupted = take(DataIterator(loader()), 34)
    first = DataIterator(loader())
    before = take(first, stop_after)
    second = DataIterator(loader())
    second.load_state_dict(first.state_dict())
    assert indices(before + take(second, 34 - stop_after)) == indices(uninterrupted)


def test_a_stateful_loader_at_another_world_size_is_refused_naming_both():
    saved = []
    for _ in range(2):
        data = DataIterator(StatefulDataLoader(AugmentedStream(), batch_size=4))
        take(data, 2)
        saved.append(data.state_dict())
    resumed = DataIterator(StatefulDataLoader(AugmentedStream(), batch_size=4))
    with pytest.raises(CheckpointError, match=r"saved by 2 processes and this job has 1.*"
                                              r"Resume with 2 processes"):
        resumed.load_resharded(saved, rank=0, world_size=1)


def test_a_loader_that_reshards_itself_is_given_every_old_ranks_state():
    class Resharding:
        def __init__(self):
            self.start = 0

        def __iter__(self):
            return iter(range(self.start, 10))

        def state_dict(self):
            return {"start": self.start}

        def load_state_dict(self, state):
            self.start = state["start"]

        def load_resharded(self, states, rank, world_size):
            self.start = max(state["start"] for state in states) + rank
            return "resharded by the loader"

    old = [{"kind": "stateful", "epoch": 1, "batches": 3, "source": {"start": s}}
           for s in (3, 4)]
    data = DataIterator(Resharding())
    assert data.load_resharded(old, rank=1, world_size=3) == "resharded by the loader"
    assert data.epoch == 1 and next(data) == 5


def test_build_dataloader_returns_a_stateful_loader_when_the_config_says(monkeypatch):
    params = cadence.DataConfig(global_batch_size=4, is_training=True, stateful_loader=True)
    loader = cadence.build_dataloader(Noised(), params)
    assert isinstance(loader, StatefulDataLoader)
    assert DataIterator(loader).kind == "stateful"
    monkeypatch.setitem(__import__("sys").modules, "torchdata.stateful_dataloader", None)
    with pytest.raises(ConfigError, match="task.train_data.stateful_loader is true but "
                                          "torchdata is not installed"):
        cadence.build_dataloader(Noised(), params)
