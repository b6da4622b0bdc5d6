"""`StopAgreement`: the stop flags of a run clock, carried across the ranks of a job.

The run clock (`cadence.core.clock.RunClock`, torch-free) decides what an agreement means --
every rank stops at the same step; this carries its flags on the CPU control group, so that
agreeing never waits for a device, and no rank waits for another per step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from cadence.core.intervals import check_int
from cadence.engine.distributed import any_rank, collective_errors
from cadence.engine.runtime import control_group


class StopAgreement:
    """Agrees across ranks on a stop requested on any of them, at the same step on every rank.

    Every `every` steps each rank starts an all-reduce (MAX) of its stop flag on the CPU
    control group, and reads the result of the previous one -- started `every` steps earlier,
    so it is done by now: no rank waits for another, no GPU is synchronized. A stop requested on
    any rank is taken by all within at most ``2 * every`` steps.

    Args:
        every: steps between two agreements.
    """

    def __init__(self, every: int = 10) -> None:
        self.every = check_int("StopAgreement", "every", every, "Pass e.g. every=10.")
        self._steps = 0
        self._pending: tuple[Any, torch.Tensor] | None = None

    def reset(self) -> None:
        """Forgets a pending agreement (at the end of a loop, where ranks agree at once)."""
        if self._pending is not None:
            with collective_errors("agreeing on a stop"):
                self._pending[0].wait()
        self._pending = None
        self._steps = 0

    def poll(self, local: bool) -> bool:
        """Called after every step with this rank's stop flag; True when the ranks agreed to
        stop (then on every rank at this same step)."""
        self._steps += 1
        if self._steps % self.every:
            return False
        agreed = False
        if self._pending is not None:
            work, value = self._pending
            with collective_errors("agreeing on a stop"):
                work.wait()
            agreed = bool(value.item())  # a CPU tensor: no device sync
        value = torch.tensor([int(local)], dtype=torch.int32)
        work = dist.all_reduce(value, op=dist.ReduceOp.MAX, group=control_group(),
                               async_op=True)
        self._pending = (work, value)
        return agreed

    def agree(self, local: bool) -> bool:
        """Whether any rank says `local`, at once (a loop's end: see `any_rank`)."""
        return any_rank(local)


