"""The host-sync counter: the debug switch that the no-sync tests of every front-end use."""

import pytest
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


def test_cuda_reports_are_counted_where_they_happen_and_nothing_else_is():
    import warnings

    with pytest.warns(UserWarning, match="an unrelated warning"):  # passed on, not swallowed
        with cadence.debug.count_host_syncs() as syncs:
            # what torch.cuda.set_sync_debug_mode says once, and one synchronization report
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet "
                          "detect all synchronizing operations", UserWarning, stacklevel=1)
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
            warnings.warn("an unrelated warning about synchronization", UserWarning,
                          stacklevel=1)
    assert syncs.by_name == {"device": 1}
    assert syncs.calls[0][1].startswith(__file__)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_each_synchronization_counts_once():
    x = torch.arange(4.0, device="cuda")
    torch.cuda.synchronize()
    with cadence.debug.count_host_syncs() as syncs:
        x.sum().item()  # a method: counted as "item", not again as CUDA's report of it
        x.nonzero()  # CUDA's own report
        y = x * 2  # device work alone is not a sync
    assert syncs.by_name == {"item": 1, "cuda": 1}, syncs.calls
    assert float(y[1]) == 2.0
