"""DataFlow: batches by slicing, shuffles with its own generator, resumes mid-pass."""

import time

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
    only_second = flow.map(lambda y: (y * 5,), array_indices=[1])
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
    iterator.close()  # a flow is not reentrant: the pass ends before the next one starts
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


# ---------------------------------------------------------------------------- tfsnippet's API


def test_tfsnippet_iterating_a_flow_inside_its_own_pass_is_an_error():
    flow = DataFlow.arrays([np.arange(6)], 2)
    running = iter(flow)
    assert next(running)[0].tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="not reentrant"):
        next(iter(flow))
    assert [b[0].tolist() for b in running] == [[2, 3], [4, 5]]  # the running pass is intact
    assert values(flow) == [[0, 1], [2, 3], [4, 5]]  # once it ended, a new pass may start
    mapped = flow.map(lambda x: (x,))
    inner = iter(mapped)
    next(inner)
    with pytest.raises(RuntimeError, match="not reentrant"):
        next(iter(flow))  # the source of a running mapped pass is running too
    del inner


def test_tfsnippet_a_threaded_flow_keeps_loading_ahead_across_pass_boundaries():
    loaded = []

    def load(x):
        loaded.append(int(x[0]))
        return (x,)

    flow = DataFlow.arrays([np.arange(4)], 1).map(load).threaded(2)
    first = values(flow)
    deadline = time.monotonic() + 5
    while len(loaded) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    # While nobody reads, the worker has loaded the next pass's first batches (two queued, at
    # most one more in hand).
    assert loaded[:6] == [0, 1, 2, 3, 0, 1] and len(loaded) <= 7
    assert values(flow) == first == [[0], [1], [2], [3]]
    flow.close()  # stops the worker; as a context manager, the flow closes itself:
    with DataFlow.arrays([np.arange(2)], 1).threaded(1) as flow:
        assert values(flow) == [[0], [1]]
    assert flow._worker is None


def test_tfsnippet_dataflow_factories_seq_gather_iterator_factory_and_sliding_window():
    from cadence.data.flows import SlidingWindow

    assert values(DataFlow.seq(0, 10, 3, batch_size=2)) == [[0, 3], [6, 9]]
    with pytest.raises(ValueError, match="`batch_size` is required"):
        DataFlow.seq(0, 10)
    x, y = DataFlow.arrays([np.arange(5)], 2), DataFlow.arrays([np.arange(4) * 10], 2)
    gathered = DataFlow.gather([x, y])
    assert [[a.tolist() for a in b] for b in gathered] == [[[0, 1], [0, 10]], [[2, 3], [20, 30]]]
    assert values(x) == [[0, 1], [2, 3], [4]]  # the shortest ended the pass of every flow
    with pytest.raises(ValueError, match="at least one flow"):
        DataFlow.gather([])
    with pytest.raises(TypeError, match="takes DataFlows"):
        DataFlow.gather([np.arange(3)])
    passes = iter([[(np.arange(2),)], [(np.arange(3),)]])
    factory = DataFlow.iterator_factory(lambda: next(passes))
    assert values(factory) == [[0, 1]] and values(factory) == [[0, 1, 2]]
    windows = SlidingWindow(np.arange(6) * 10, window_size=2)
    assert values(windows.as_flow(batch_size=3)) == [[[0, 10], [10, 20], [20, 30]],
                                                      [[30, 40], [40, 50]]]
    assert values(DataFlow.seq(0, 2, batch_size=2).map(windows)) == [[[0, 10], [10, 20]]]


def test_tfsnippet_dataflow_select_get_arrays_and_next_batch():
    flow = DataFlow.arrays([np.arange(5), np.arange(5) * 10, np.arange(5) * 100], 2)
    assert [[a.tolist() for a in b] for b in flow.select([2, 0])] == [
        [[0, 100], [0, 1]], [[200, 300], [2, 3]], [[400], [4]]]
    arrays = flow.get_arrays()
    assert [a.tolist() for a in arrays] == [list(range(5)), list(range(0, 50, 10)),
                                            list(range(0, 500, 100))]
    assert DataFlow.arrays([torch.arange(3)], 2).get_arrays()[0].tolist() == [0, 1, 2]
    assert values(flow.to_arrays_flow(batch_size=5)) == [list(range(5))]
    with pytest.raises(ValueError, match="yielded no batch"):
        DataFlow.arrays([np.arange(1)], 2, skip_incomplete=True).get_arrays()
    assert flow.current_batch is None
    seen = [flow.next_batch()[0].tolist() for _ in range(3)]
    assert seen == [[0, 1], [2, 3], [4]] and flow.current_batch[0].tolist() == [4]
    with pytest.raises(StopIteration):  # once, at the end of the pass...
        flow.next_batch()
    assert flow.current_batch is None
    assert flow.next_batch()[0].tolist() == [0, 1]  # ...and the next call starts a new one


def test_tfsnippet_arrays_and_map_check_their_arguments():
    with pytest.raises(ValueError, match=r"`arrays\[1\]` \(got list\) must be a numpy array"):
        DataFlow.arrays([np.arange(3), [1, 2, 3]], 2)
    with pytest.raises(ValueError, match=r"`arrays\[0\]` is 0-d"):
        DataFlow.arrays([np.array(1.0)], 2)
    with pytest.raises(TypeError, match="a list of arrays"):
        DataFlow.arrays(np.arange(3), 2)
    flow = DataFlow.arrays([np.arange(4), np.ones(4)], 2)
    assert [b[1].tolist() for b in flow.map(lambda y: (y * 5,), array_indices=1)] == [[5, 5]] * 2
    with pytest.raises(TypeError, match="integer array indices"):
        flow.map(lambda y: (y,), array_indices=[1.5])
    with pytest.raises(TypeError, match=r"must return a tuple or a list of arrays, got a ndarray"):
        next(iter(flow.map(lambda x, y: x + y)))


def test_sharded_flows_give_each_rank_an_equal_share_of_every_pass():
    """As a DistributedSampler: the pass's order padded to a multiple of the ranks, rank r taking
    every world_size-th example from the r-th; each rank has as many batches as the others."""
    shards = [DataFlow.arrays([np.arange(7)], batch_size=2, shuffle=True, random_state=3)
              .shard(rank, 3) for rank in range(3)]
    assert [len(flow) for flow in shards] == [2, 2, 2]  # 7 examples padded to 9: 3 a rank
    for _ in range(2):  # two passes, each a new order shared by the ranks
        taken = [np.concatenate([batch[0] for batch in flow]) for flow in shards]
        assert [len(t) for t in taken] == [3, 3, 3]
        assert set(np.concatenate(taken)) == set(range(7))
    assert len(DataFlow.arrays([np.arange(8)], 2).shard(1, 2)) == 2


def test_a_sharded_position_resumes_only_on_the_same_rank_and_world_size():
    flow = DataFlow.arrays([np.arange(8)], batch_size=2, shuffle=True, random_state=1).shard(0, 2)
    passes = iter(flow)
    next(passes)
    state = flow.state_dict()
    expected = [b[0].tolist() for b in passes]
    resumed = DataFlow.arrays([np.arange(8)], batch_size=2, shuffle=True).shard(0, 2)
    resumed.load_state_dict(state)
    assert [b[0].tolist() for b in resumed] == expected
    with pytest.raises(ValueError, match="saved by rank 0 of 2 in the middle of a pass"):
        DataFlow.arrays([np.arange(8)], batch_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"`rank` 2 is not in \[0, world_size=2\)"):
        flow.shard(2, 2)


def test_tfsnippet_dataflow_seq_keeps_its_start_stop_and_step():
    flow = DataFlow.seq(2, 11, step=3, batch_size=2, dtype=np.int64)
    assert (flow.start, flow.stop, flow.step) == (2, 11, 3)
    assert (flow.batch_size, flow.data_length) == (2, 3)
    batches = [b for (b,) in flow]
    assert [b.tolist() for b in batches] == [[2, 5], [8]]
    assert batches[0].dtype == np.int64
    down = DataFlow.seq(5, 0, -2, batch_size=3)
    assert (down.start, down.stop, down.step) == (5, 0, -2)
    assert values(down) == [[5, 3, 1]]
    with pytest.raises(ValueError, match=r"`step` \(got 0\) must not be 0"):
        DataFlow.seq(0, 10, 0, batch_size=2)
