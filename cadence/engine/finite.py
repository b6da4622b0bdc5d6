"""Which of a model's tensors are not finite, asked of every shape that FSDP2 makes.

Under FSDP2 a parameter is a ``DTensor`` whose placement depends on its shape: a first
dimension the ranks do not divide gives uneven shards, one of size 1 (a learned positional
parameter of shape ``(1, T, D)``) gives an *empty* local shard on every rank but the first, and a
reduction over a sharded tensor returns a *partial* result whose placement differs from a
replicated one's. Stacking such results -- ``torch.stack([isfinite(p).all() for p in params])``
-- asks DTensor to convert between placements it cannot convert ("Replicate to Partial(product)
conversion is not supported"), and a reduction per parameter would be a collective per
parameter.

So the checks here look at each rank's **local shard** only (``to_local()``: an empty shard is
finite), reduce the per-tensor answers on the device into one small vector, read it once on the
host, and agree across ranks with one all-reduce on the CPU control group: every rank gets the
same answer, so every rank takes the same decision (stop, restore, save).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist

from cadence.engine.distributed import collective_errors, gather_objects
from cadence.engine.runtime import control_group, current_runtime, is_distributed


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of `tensor`: its local shard for a ``DTensor`` (possibly empty),
    `tensor` itself otherwise."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


class NonFinite(NamedTuple):
    """What `nonfinite` found.

    Attributes:
        here: the indices of this rank's tensors that hold a NaN or an infinity on some rank
            that holds them.
        elsewhere: whether a tensor that other ranks hold and this one does not (another
            pipeline stage's) is not finite.
    """

    here: list[int]
    elsewhere: bool = False

    def __bool__(self) -> bool:
        return bool(self.here) or self.elsewhere


def nonfinite(tensors: Sequence[torch.Tensor]) -> NonFinite:
    """Which of `tensors` hold a NaN or an infinity on any rank, and whether any tensor of
    another pipeline stage does: the same answer -- to stop or not -- on every rank.

    One host-device synchronization (the per-tensor flags, reduced on the device first) and,
    under torchrun, one all-reduce of one integer per tensor on the CPU control group -- a
    collective: every rank must call it, with the same number of tensors where the ranks hold
    the same model. A pipeline's stages hold different tensors: their findings are gathered
    instead (a list of indices from each rank).

    Args:
        tensors: floating-point or complex tensors, plain or ``DTensor`` (any placement).
    """
    flags = [~torch.isfinite(local_shard(tensor)).all() for tensor in tensors]
    bad = (torch.stack([flag.to(flags[0].device) for flag in flags]).to("cpu", torch.int32)
           if flags else torch.zeros(0, dtype=torch.int32))  # host sync
    if not is_distributed():
        return NonFinite([index for index, flag in enumerate(bad.tolist()) if flag])
    runtime = current_runtime()
    if runtime.dims.pp == 1:
        if not tensors:
            return NonFinite([])
        with collective_errors("checking that the weights are finite"):
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=control_group())
        return NonFinite([index for index, flag in enumerate(bad.tolist()) if flag])
    stage = runtime.coordinates["pp"]
    found = gather_objects((stage, [index for index, flag in enumerate(bad.tolist()) if flag]))
    here = sorted({index for where, indices in found if where == stage for index in indices})
    return NonFinite(here, any(indices for where, indices in found if where != stage))
