"""The host-sync counter: the debug switch that the no-sync tests of every front-end use."""

import torch

import cadence


def test_it_counts_each_host_read_and_where_it_happened():
    x = torch.ones(3)
    with cadence.debug.count_host_syncs() as syncs:
        x.sum().item()
        float(x[0])
        bool(x[1])
        x.tolist()
        y = x * 2  # device work alone is not a sync
    assert syncs.count == 4
    assert syncs.by_name == {"item": 1, "__float__": 1, "__bool__": 1, "tolist": 1}
    assert all(where.endswith(".py:" + where.rsplit(":", 1)[1]) and "test_debug.py" in where
               for _, where in syncs.calls)
    assert float(y[0]) == 2.0  # the methods are restored afterwards
    assert syncs.count == 4
