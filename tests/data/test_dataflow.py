"""DataFlow: batches by slicing, shuffles with its own generator, resumes mid-pass."""

import numpy as np
import pytest
import torch

from cadence.data.dataflow import DataFlow


def values(flow):
    return [batch[0].tolist() for batch in flow]


def test_arrays_are_batched_in_order_keeping_or_dropping_the_incomplete_batch():
    x = np.arange(7)
    assert values(DataFlow.arrays([x], 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert values(DataFlow.arrays([x], 3, skip_incomplete=True)) == [[0, 1, 2], [3, 4, 5]]
    assert len(DataFlow.arrays([x], 3)) == 3
    assert len(DataFlow.arrays([x], 3, skip_incomplete=True)) == 2
    tensors = DataFlow.arrays([torch.arange(4), torch.arange(4) * 2], 2)
    assert [b[1].tolist() for b in tensors] == [[0, 2], [4, 6]]


def test_shuffling_is_a_new_order_each_pass_and_reproducible_from_the_seed():
    flow = DataFlow.arrays([np.arange(10)], 10, shuffle=True, random_state=3)
    first, second = values(flow), values(flow)
    assert sorted(first[0]) == list(range(10)) and first != second
    assert values(DataFlow.arrays([np.arange(10)], 10, shuffle=True, random_state=3)) == first
    torch.manual_seed(5)
    a = values(DataFlow.arrays([np.arange(10)], 10, shuffle=True))
    torch.manual_seed(5)
    assert values(DataFlow.arrays([np.arange(10)], 10, shuffle=True)) == a


def test_bad_arrays_are_refused():
    with pytest.raises(ValueError, match="different lengths"):
        DataFlow.arrays([np.arange(3), np.arange(4)], 2)
    with pytest.raises(ValueError, match="batch_size"):
        DataFlow.arrays([np.arange(3)], 0)
    with pytest.raises(ValueError, match="at least one array"):
        DataFlow.arrays([], 2)


@pytest.mark.parametrize("threaded", [False, True])
def test_a_saved_position_continues_with_the_next_batch_and_the_same_later_passes(threaded):
    def make():
        flow = DataFlow.arrays([np.arange(12)], 3, shuffle=True, random_state=7)
        return flow.threaded(2) if threaded else flow

    reference = make()
    expected = values(reference) + values(reference)  # two passes, uninterrupted

    flow = make()
    iterator = iter(flow)
    seen = [next(iterator)[0].tolist(), next(iterator)[0].tolist()]
    state = flow.state_dict()  # taken after two batches (a threaded flow has read ahead)
    resumed = make()
    resumed.load_state_dict(state)
    seen += values(resumed) + values(resumed)
    assert seen == expected


def test_map_replaces_all_or_selected_arrays():
    flow = DataFlow.arrays([np.arange(4), np.ones(4)], 2)
    assert [b[0].tolist() for b in flow.map(lambda x, y: (x + y, y))] == [[1, 2], [3, 4]]
    only_second = flow.map(lambda y: y * 5, array_indices=[1])
    assert [b[1].tolist() for b in only_second] == [[5, 5], [5, 5]]
    with pytest.raises(ValueError, match="one per index"):
        next(iter(flow.map(lambda y: (y, y), array_indices=[1])))


def test_a_threaded_flow_raises_the_workers_error_in_the_consumer():
    def broken(x):
        if x[0] == 2:
            raise OSError("bad record")
        return (x,)

    flow = DataFlow.arrays([np.arange(4)], 2).map(broken).threaded(1)
    iterator = iter(flow)
    assert next(iterator)[0].tolist() == [0, 1]
    with pytest.raises(OSError, match="bad record"):
        next(iterator)


def test_a_position_saved_right_after_the_last_batch_starts_a_new_pass():
    flow = DataFlow.arrays([np.arange(4)], 2, shuffle=True, random_state=0)
    iterator = iter(flow)
    next(iterator), next(iterator)  # the pass is used up, the generator not yet resumed
    state = flow.state_dict()
    expected = values(flow)
    resumed = DataFlow.arrays([np.arange(4)], 2, shuffle=True, random_state=0)
    resumed.load_state_dict(state)
    assert values(resumed) == expected


def test_a_threaded_flow_with_a_device_yields_tensors_there():
    flow = DataFlow.arrays([np.arange(6, dtype=np.float32)], 4).threaded(2, device="cpu")
    batches = list(flow)
    assert [b[0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5]]
    assert all(isinstance(b[0], torch.Tensor) for b in batches)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_threaded_flow_copies_to_cuda_on_a_side_stream():
    x = np.random.RandomState(0).randn(64, 8).astype(np.float32)
    flow = DataFlow.arrays([x], 16).threaded(2, device="cuda")
    out = torch.cat([b[0] for b in flow]).cpu().numpy()
    assert out.tobytes() == x.tobytes()
