"""Run statistics: `EstimatedTimeLeft`, `ThroughputTracker`, `PeakMemoryTracker`.

Each measures per epoch (``on_epoch_begin`` / ``on_epoch_end``) and adds nothing per step.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import torch

from cadence.core.callbacks import Callback, RunState
from cadence.core.eta import ETA
from cadence.core.intervals import check_int
from cadence.core.logs import humanize_duration
from cadence.engine.runtime import accelerator_started

logger = logging.getLogger("cadence")


class EstimatedTimeLeft(Callback):
    """Estimates the time left from the median time per step of the last `last_k_epochs`
    epochs (robust to one slow epoch) -- or their mean, with ``median=False`` -- times the
    steps left to ``state.target_step`` (a `cadence.core.eta.ETA` over epochs).

    Records ``eta_seconds`` in ``state.metrics`` and logs it.

    Args:
        last_k_epochs: how many of the last epochs to estimate from.
        median: the median of their times per step (tensorpack's default); False: the mean.

    Raises:
        ValueError: if `last_k_epochs` is not a positive int.
    """

    provides = ("eta_seconds",)

    def __init__(self, last_k_epochs: int = 5, median: bool = True) -> None:
        self.median = median
        self.eta = ETA(window=last_k_epochs, median=median)

    def on_epoch_begin(self, state: RunState) -> None:
        self.eta.start(state.global_step, time.perf_counter())

    def on_epoch_end(self, state: RunState) -> None:
        now = time.perf_counter()
        self.eta.record(state.global_step, now)
        if state.target_step is None:
            return
        eta = self.eta.estimate(state.global_step, state.target_step, now)
        if eta is None:
            return
        state.metrics["eta_seconds"] = eta
        logger.info("Estimated time left: %s", humanize_duration(eta))


class ThroughputTracker(Callback):
    """Steps and examples per second over each epoch, as ``throughput/steps_per_second`` and
    ``throughput/samples_per_second``.

    Args:
        samples_per_step: examples per step; default the trainer's ``examples_per_step``.

    Raises:
        ValueError: if `samples_per_step` is not a positive int or None (0 would silently
            fall back to the default).
    """

    provides = ("throughput/steps_per_second", "throughput/samples_per_second")

    def __init__(self, samples_per_step: int | None = None) -> None:
        self.samples_per_step = check_int(
            "ThroughputTracker", "samples_per_step", samples_per_step,
            "Pass the number of examples in one step, e.g. samples_per_step=32, or None for "
            "the trainer's examples_per_step.", none_ok=True)
        self._start = (0.0, 0)

    def on_epoch_begin(self, state: RunState) -> None:
        self._start = (time.perf_counter(), state.global_step)

    def on_epoch_end(self, state: RunState) -> None:
        started, step = self._start
        elapsed = time.perf_counter() - started
        if elapsed <= 0:
            return
        steps_per_second = (state.global_step - step) / elapsed
        state.metrics["throughput/steps_per_second"] = steps_per_second
        trainer = state.trainer
        samples = self.samples_per_step or (
            trainer.examples_per_step if trainer is not None else None)
        if samples:
            state.metrics["throughput/samples_per_second"] = steps_per_second * samples


class PeakMemoryTracker(Callback):
    """Peak memory of each epoch, in MiB: every accelerator device's allocator peak (reset each
    epoch) as ``peak_memory_mb/<type>:<i>`` (``cuda:0``), and the process's peak resident memory
    as ``peak_memory_mb/host`` (a peak over the whole process lifetime)."""

    def on_epoch_begin(self, state: RunState) -> None:
        for module, _, index in _accelerator_devices():
            module.reset_peak_memory_stats(index)

    def on_epoch_end(self, state: RunState) -> None:
        for module, kind, index in _accelerator_devices():
            peak = module.max_memory_allocated(index) / 2**20
            state.metrics[f"peak_memory_mb/{kind}:{index}"] = peak
        try:
            import resource
        except ImportError:  # not on this platform
            return
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scale = 1 / 2**20 if sys.platform == "darwin" else 1 / 2**10  # bytes on macOS
        state.metrics["peak_memory_mb/host"] = peak_kb * scale


def _accelerator_devices() -> list[tuple[Any, str, int]]:
    """``(module, device type, index)`` of each device of the machine's accelerator, once the
    process has started it and where its module keeps memory statistics; none otherwise."""
    module = accelerator_started()
    if module is None or not hasattr(module, "max_memory_allocated"):
        return []
    kind = torch.accelerator.current_accelerator().type  # type: ignore[union-attr]
    return [(module, kind, index) for index in range(module.device_count())]
