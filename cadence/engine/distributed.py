"""Collectives of a distributed job, each bounded in time and said in words when it fails.

- `collective_errors` turns a collective's timeout into `CollectiveTimeout`: another rank is
  dead or stuck, and the job ends in bounded time instead of hanging.
- `any_rank` agrees on a flag; `broadcast_object`, `gather_objects` and `gather_on_rank_zero`
  move host-side values between ranks, on the CPU control group (their results never wait
  for a device).
- `broadcast_module` makes replicas start equal; `average_gradients` averages gradients over
  the data-parallel ranks (for a step that is not a DDP module's).

Where a process sits in the job -- its rank, its device, the mesh, the groups -- is the
runtime's (`cadence.engine.runtime`); the stop agreement that carries a run clock's stops
across ranks is `cadence.engine.stop_agreement`; how a model is spread over the ranks is
`cadence.engine.parallelize`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cadence.core.errors import JobFailure
from cadence.core.rank import process_rank, world_size
from cadence.engine.runtime import control_group, current_runtime, is_distributed


class CollectiveTimeout(JobFailure):
    """A collective operation did not complete in time: another rank is dead or stuck."""


@contextlib.contextmanager
def collective_errors(what: str) -> Iterator[None]:
    """Turns a collective's timeout into `CollectiveTimeout` with a message that says what
    probably happened and what to do."""
    try:
        yield
    except RuntimeError as error:
        text = str(error).lower()
        if "timed out" in text or "timeout" in text or "connection closed" in text:
            raise CollectiveTimeout(
                f"{what}: a collective did not complete on rank {process_rank()} of "
                f"{world_size()} ({error}). Another rank is probably dead or stuck; the job "
                "ends. Check the other ranks' logs; raise the process group's timeout "
                "(init_distributed(timeout=...)) if a rank legitimately needs longer (e.g. a slow "
                "first compilation)."
            ) from error
        raise


def any_rank(flag: bool, what: str = "agreeing on a stop") -> bool:
    """Whether `flag` is true on any rank (an all-reduce on the control group; blocking)."""
    if not is_distributed():
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int32)
    with collective_errors(what):
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=control_group())
    return bool(value.item())  # a CPU tensor: no device sync


def broadcast_object(value: Any) -> Any:
    """Rank 0's `value`, on every rank (`value` itself in a single process)."""
    if not is_distributed():
        return value
    box = [value]
    with collective_errors("receiving rank 0's choice"):
        dist.broadcast_object_list(box, src=0, group=control_group())
    return box[0]


def gather_objects(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order (``[value]`` in a single process)."""
    if not is_distributed():
        return [value]
    gathered: list[Any] = [None] * world_size()
    with collective_errors("gathering host-side values"):
        dist.all_gather_object(gathered, value, group=control_group())
    return gathered


def gather_on_rank_zero(value: Any, what: str = "gathering host-side values") -> list[Any]:
    """Every rank's `value`, in rank order, on rank 0 (others get ``[]``): what rank 0 alone
    needs costs the other ranks one send each, not N receives."""
    if not is_distributed():
        return [value]
    rank = process_rank()
    gathered: list[Any] | None = [None] * world_size() if rank == 0 else None
    with collective_errors(what):
        dist.gather_object(value, gathered, dst=0, group=control_group())
    return gathered or []


def broadcast_module(module: nn.Module) -> None:
    """Makes every rank's parameters and buffers rank 0's (replicas start equal, as DDP's do)."""
    if not is_distributed():
        return
    with collective_errors("broadcasting the model"), torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)


def average_gradients(parameters: Any) -> None:
    """Averages the gradients of `parameters` over the data-parallel ranks, in one all-reduce
    of their concatenation (for a step that is not a DDP module's: tensorpack's
    SimpleTrainer)."""
    if not is_distributed():
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    runtime = current_runtime()
    flat = torch.cat([g.reshape(-1) for g in grads])
    with collective_errors("averaging gradients"):
        dist.all_reduce(flat, group=runtime.data_group)
    flat /= runtime.dp_size
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()
