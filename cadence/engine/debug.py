"""`count_host_syncs`: a debug switch that counts host-device synchronizations.

cadence's hot loops are meant to read no tensor value on the host between log points. Wrap a
stretch of training to check it::

    with cadence.debug.count_host_syncs() as syncs:
        trainer.train(100)
    assert syncs.count == 0, syncs.calls

On CPU it counts the tensor methods that read a value on the host (``item``, ``tolist``,
``__float__``, ``__int__``, ``__bool__``, ``numpy``) -- each of them would wait for the device
on a GPU. With CUDA initialized it also turns on ``torch.cuda.set_sync_debug_mode("warn")`` and
counts the synchronizations CUDA itself reports (copies to the host, ``nonzero``, stream and
event waits on the host, ...), where they happened; a read through one of the methods above is
counted once, as that method. Other warnings raised inside the block are passed on.
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from cadence.engine.runtime import accelerator_started

SYNC_METHODS = ("item", "tolist", "__float__", "__int__", "__bool__", "numpy")

DEVICE_REPORT = "device"
"""The name under which a synchronization the accelerator itself reported (CUDA's sync debug
mode) is counted, beside the tensor methods' names."""
CUDA_SYNC_MESSAGE = "called a synchronizing CUDA operation"
"""What CUDA's sync debug mode warns for each synchronization (its notice that the mode is a
prototype is not one)."""


@dataclass
class SyncCounter:
    """What `count_host_syncs` saw.

    Attributes:
        calls: one entry per synchronization: the method (or ``"device"``,
            `DEVICE_REPORT`) and where it was called.
    """

    calls: list[tuple[str, str]] = field(default_factory=list)

    @property
    def count(self) -> int:
        """How many synchronizations there were."""
        return len(self.calls)

    @property
    def by_name(self) -> Counter[str]:
        """Counts per method."""
        return Counter(name for name, _ in self.calls)


@contextlib.contextmanager
def count_host_syncs(with_stack: bool = True) -> Iterator[SyncCounter]:
    """Counts host reads of tensor values (and CUDA's own synchronizations) inside the block.

    Args:
        with_stack: record where each read happened (the caller's file and line).
    """
    counter = SyncCounter()
    originals = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}
    # The accelerator's own report of its synchronizations (CUDA's sync debug mode), where the
    # process has started one that has it
    accelerator = accelerator_started()
    debug_mode = accelerator if hasattr(accelerator, "set_sync_debug_mode") else None
    previous_mode = debug_mode.get_sync_debug_mode() if debug_mode else 0
    reports: list[warnings.WarningMessage] = []  # what the block warned, CUDA's reports too
    counted_reports: set[int] = set()  # CUDA's reports of reads already counted as a method

    def wrap(name: str, original: Any) -> Any:
        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            where = ""
            if with_stack:
                frame = traceback.extract_stack(limit=2)[0]  # the caller of the read
                where = f"{frame.filename}:{frame.lineno}"
            counter.calls.append((name, where))
            before = len(reports)
            try:
                return original(self, *args, **kwargs)
            finally:
                counted_reports.update(range(before, len(reports)))

        return counted

    with warnings.catch_warnings(record=True) as caught:
        # CUDA's reports are recorded every time; other warnings keep the caller's filters
        # (an error stays an error) and are issued again after the block.
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        warnings.filterwarnings("always", message=CUDA_SYNC_MESSAGE)
        reports = caught
        try:
            for name, original in originals.items():
                setattr(torch.Tensor, name, wrap(name, original))
            if debug_mode:
                debug_mode.set_sync_debug_mode("warn")
            yield counter
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)
            if debug_mode:
                debug_mode.set_sync_debug_mode(previous_mode)
    counter.calls += [(DEVICE_REPORT, f"{report.filename}:{report.lineno}")
                      for index, report in enumerate(reports)
                      if CUDA_SYNC_MESSAGE in str(report.message) and index not in counted_reports]
    for report in reports:
        if CUDA_SYNC_MESSAGE not in str(report.message):
            warnings.warn_explicit(report.message, report.category, report.filename,
                                   report.lineno, source=report.source)
