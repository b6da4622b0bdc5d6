"""DataIterator: a resumed run continues with the next batch, and later passes shuffle as in an
uninterrupted run."""

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from cadence import DataIterator


class Counting(Dataset):
    """Items are their own index; counts loads."""

    def __init__(self, n=40):
        self.n = n
        self.loads = 0

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        self.loads += 1
        return index


def take(iterator, count):
    out = []
    while len(out) < count:
        try:
            batch = next(iterator)
            out.append(batch.tolist() if isinstance(batch, torch.Tensor) else batch)
        except StopIteration:
            iterator.end_pass()
    return out


LOADERS = {
    "shuffled": lambda ds, g: DataLoader(ds, batch_size=8, shuffle=True),
    "shuffled_with_generator": lambda ds, g: DataLoader(ds, batch_size=8, shuffle=True,
                                                        generator=g),
    "sequential": lambda ds, g: DataLoader(ds, batch_size=8),
    "drop_last": lambda ds, g: DataLoader(ds, batch_size=6, shuffle=True, drop_last=True),
    "workers": lambda ds, g: DataLoader(ds, batch_size=8, shuffle=True, num_workers=2),
}


@pytest.mark.parametrize("kind", list(LOADERS))
@pytest.mark.parametrize("stop_after", [3, 5, 7])
def test_resume_mid_epoch_matches_an_uninterrupted_run(kind, stop_after):
    torch.manual_seed(0)
    uninterrupted = take(DataIterator(LOADERS[kind](Counting(), torch.Generator().manual_seed(1))),
                         14)

    torch.manual_seed(0)
    first = DataIterator(LOADERS[kind](Counting(), torch.Generator().manual_seed(1)))
    before = take(first, stop_after)
    saved, rng = first.state_dict(), torch.get_rng_state()

    torch.manual_seed(12345)  # a new process: different RNG until the checkpoint is restored
    dataset = Counting()
    second = DataIterator(LOADERS[kind](dataset, torch.Generator().manual_seed(1)))
    torch.set_rng_state(rng)
    second.load_state_dict(saved)
    after = take(second, 14 - stop_after)
    assert before + after == uninterrupted
    assert second.epoch == first.epoch + (len(uninterrupted) - stop_after + first.batches) // (
        len(LOADERS[kind](Counting(), None)))


def test_resume_skips_at_the_index_level_without_loading_consumed_batches():
    loader = DataLoader(Counting(), batch_size=8, shuffle=True)
    first = DataIterator(loader)
    take(first, 3)
    dataset = Counting()
    second = DataIterator(DataLoader(dataset, batch_size=8, shuffle=True))
    second.load_state_dict(first.state_dict())
    take(second, 1)
    assert dataset.loads == 8  # one batch, not four


def test_lists_resume_by_index():
    batches = [[i] for i in range(5)]
    first = DataIterator(batches)
    assert take(first, 3) == [[0], [1], [2]]
    second = DataIterator(batches)
    second.load_state_dict(first.state_dict())
    assert take(second, 4) == [[3], [4], [0], [1]]


class Stateful:
    def __init__(self):
        self.start = 0

    def __iter__(self):
        for i in range(self.start, 5):
            self.start = i + 1
            yield i
        self.start = 0

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, state):
        self.start = state["start"]


def test_sources_with_state_dict_use_their_own_state():
    first = DataIterator(Stateful())
    assert take(first, 2) == [0, 1]
    second = DataIterator(Stateful())
    second.load_state_dict(first.state_dict())
    assert take(second, 2) == [2, 3]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(10))


def test_a_source_without_position_warns_what_a_resume_will_do():
    iterator = DataIterator(DataLoader(Stream(), batch_size=2))
    take(iterator, 1)
    with pytest.warns(UserWarning, match="starts that data from its beginning"):
        iterator.state_dict()


def test_a_position_from_another_kind_of_source_is_rejected():
    saved = DataIterator([[1], [2]]).state_dict()
    with pytest.raises(ValueError, match="same kind of data source"):
        DataIterator(DataLoader(Counting(), batch_size=2)).load_state_dict(saved)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's own import
def test_torchdata_stateful_dataloader_uses_its_native_state():
    stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
    torch.manual_seed(0)
    uninterrupted = take(DataIterator(stateful_dataloader.StatefulDataLoader(
        Counting(), batch_size=8, shuffle=True)), 9)
    torch.manual_seed(0)
    first = DataIterator(stateful_dataloader.StatefulDataLoader(Counting(), batch_size=8,
                                                                shuffle=True))
    before = take(first, 3)
    saved, rng = first.state_dict(), torch.get_rng_state()
    assert saved["kind"] == "stateful"
    torch.manual_seed(99)
    second = DataIterator(stateful_dataloader.StatefulDataLoader(Counting(), batch_size=8,
                                                                 shuffle=True))
    torch.set_rng_state(rng)
    second.load_state_dict(saved)
    assert before + take(second, 6) == uninterrupted


def test_a_distributed_sampler_gets_the_epoch_so_each_pass_is_shuffled_anew():
    dataset = TensorDataset(torch.arange(16))
    loader = DataLoader(dataset, batch_size=16,
                        sampler=DistributedSampler(dataset, num_replicas=1, rank=0, seed=3))
    data = DataIterator(loader)
    first = next(data)[0].tolist()
    data.end_pass()
    second = next(data)[0].tolist()
    assert sorted(first) == sorted(second) == list(range(16))
    assert first != second


def test_next_in_pass_ends_the_pass_at_its_end_and_refuses_an_empty_one():
    data = DataIterator([1, 2])
    assert [data.next_in_pass(), data.next_in_pass()] == [1, 2]
    with pytest.raises(StopIteration):
        data.next_in_pass()
    assert data.epoch == 1 and data.next_in_pass() == 1  # the next pass started
    with pytest.raises(ValueError, match=r"The data \(list\) yields no batches"):
        DataIterator([]).next_in_pass()


def test_prefetch_moves_each_batch_one_ahead_and_delivers_them_in_order():
    pulled = []

    class Recording:
        def __iter__(self):
            for i in range(3):
                pulled.append(i)
                yield {"x": torch.tensor([i]), "meta": "kept"}

    data = DataIterator(Recording(), prefetch_to="cpu")
    first = next(data)
    assert pulled == [0, 1]  # batch 1 is already on its way while the step uses batch 0
    assert first["x"].tolist() == [0] and first["meta"] == "kept"
    assert [next(data)["x"].item(), next(data)["x"].item()] == [1, 2]
    with pytest.raises(StopIteration):
        next(data)
    data.end_pass()
    assert next(data)["x"].item() == 0 and data.epoch == 1 and data.batches == 1


@pytest.mark.parametrize("kind", ["shuffled_with_generator", "drop_last", "workers"])
def test_a_prefetching_iterator_saves_the_position_of_the_batches_it_delivered(kind):
    def make():
        return DataIterator(LOADERS[kind](Counting(), torch.Generator().manual_seed(1)),
                            prefetch_to="cpu")

    torch.manual_seed(0)
    uninterrupted = take(make(), 12)
    torch.manual_seed(0)
    first = make()
    before = take(first, 5)  # the sixth batch was fetched ahead: it must not count
    saved, rng = first.state_dict(), torch.get_rng_state()
    second = make()
    torch.set_rng_state(rng)
    second.load_state_dict(saved)
    assert before + take(second, 7) == uninterrupted


def test_prefetch_is_refused_for_a_loader_that_keeps_its_own_state():
    with pytest.raises(ValueError, match="one batch ahead of training"):
        DataIterator(Stateful(), prefetch_to="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefetch_to_cuda_copies_on_a_side_stream_from_pinned_memory():
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, pin_memory=True)
    data = DataIterator(loader, prefetch_to="cuda")
    batches = [next(data)[0] for _ in range(8)]
    assert all(batch.is_cuda for batch in batches)
    assert torch.cat(batches).cpu().tolist() == list(range(64))
    assert data._copier is not None and data._copier.stream is not None


def test_batches_already_on_the_device_are_handed_on_as_they_are():
    # "meta" stands in for a GPU: nothing to copy, so the very same batch objects come out
    batches = [(torch.ones(2, device="meta"), {"y": torch.zeros(2, device="meta")})
               for _ in range(3)]
    data = DataIterator(batches, prefetch_to="meta")
    assert [next(data) for _ in range(3)] == batches
    assert all(a is b for a, b in zip(take(DataIterator(batches, prefetch_to="meta"), 3),
                                      batches))
    from cadence.data.device import DeviceCopier, on_device, to_device

    batch = batches[0]
    assert to_device(batch, torch.device("meta")) is batch
    assert DeviceCopier(torch.device("meta")).start(batch) == (batch, None)
    mixed = (torch.ones(2), batch[0])
    moved = to_device(mixed, torch.device("meta"))
    assert on_device(moved, torch.device("meta")) and not on_device(mixed, torch.device("meta"))
    assert moved[1] is batch[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefetch_to_cuda_never_synchronizes_and_skips_batches_on_the_device():
    from cadence.data.device import DeviceCopier

    on_gpu = [torch.full((8,), float(i), device="cuda") for i in range(6)]
    data = DataIterator(on_gpu, prefetch_to="cuda")
    assert [next(data) for _ in range(6)] == on_gpu  # the same tensors: no copy
    assert data._copier is not None and data._copier.stream is None  # no stream, no event
    assert DeviceCopier(torch.device("cuda:0")).start(on_gpu[0])[1] is None

    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8)  # not pinned
    host = DataIterator(loader, prefetch_to="cuda")
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # any host-device synchronization raises
    try:
        batches = [next(host)[0] for _ in range(8)]
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert torch.cat(batches).cpu().tolist() == list(range(64))
