"""`Profiler`: a ``torch.profiler`` trace of a range of steps."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from cadence.callbacks.logdir import run_directory
from cadence.core.callbacks import Callback, RunState
from cadence.core.intervals import check_int

logger = logging.getLogger("cadence")


class Profiler(Callback):
    """Profiles the steps ``start_step < global_step <= end_step`` (CPU, and CUDA when the run
    uses it) and writes a Chrome trace (open it in Perfetto or ``chrome://tracing``) to
    ``<directory>/trace-<start>-<end>.json``. Name scopes of `cadence.Module` appear as ranges.

    Args:
        start_step: the trace starts after this global step.
        end_step: and ends after this one.
        directory: where; default ``profile/`` in the run's directory (else the working
            directory).

    Raises:
        ValueError: unless ``0 <= start_step < end_step`` are ints (a step such as 2.5 is
            never reached, so nothing would be profiled).
    """

    def __init__(self, start_step: int, end_step: int, directory: str | Path | None = None) -> None:
        start_step = check_int("Profiler", "start_step", start_step,
                               "Pass the global step after which to start, e.g. start_step=10.",
                               minimum=0)
        end_step = check_int("Profiler", "end_step", end_step,
                             "Pass the global step after which to stop, e.g. end_step=20.")
        if not start_step < end_step:
            raise ValueError(f"Profiler: `end_step` (got {end_step}) must be after `start_step` "
                             f"(got {start_step}), or no step is profiled. Pass e.g. "
                             f"Profiler(start_step={start_step}, end_step={start_step + 10}).")
        self.start_step = start_step
        self.end_step = end_step
        self.directory = directory
        self.trace_path: Path | None = None
        self._profile: Any = None

    def on_step_begin(self, state: RunState) -> None:
        if state.global_step == self.start_step and self._profile is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            # CUDA kernels only when the run has started CUDA: tracing them in a process that
            # has not would start CUDA inside the trace (the profiler synchronizes the device
            # when it stops), which Kineto does not survive.
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profile = torch.profiler.profile(activities=activities, record_shapes=True)
            self._profile.start()

    def on_step_end(self, state: RunState) -> None:
        if self._profile is not None and state.global_step >= self.end_step:
            self._finish(state)

    def on_train_end(self, state: RunState) -> None:
        if self._profile is not None:
            self._finish(state)

    def _finish(self, state: RunState) -> None:
        profile, self._profile = self._profile, None
        profile.stop()
        run = run_directory(state)
        directory = (Path(self.directory) if self.directory is not None
                     else run.subdir("profile") if run is not None else Path("profile"))
        directory.mkdir(parents=True, exist_ok=True)
        self.trace_path = directory / f"trace-{self.start_step}-{state.global_step}.json"
        profile.export_chrome_trace(str(self.trace_path))
        logger.info("Wrote the profile of steps %d-%d to %s.", self.start_step + 1,
                    state.global_step, self.trace_path)
