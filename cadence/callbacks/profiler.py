"""`Profiler`: ``torch.profiler`` traces of training steps, on a ``torch.profiler.schedule``.

Two ways to say which steps: a range of global steps (``Profiler(10, 20)``: one Chrome trace,
``trace-10-20.json``), or torch's cycle of wait, warmup and active steps
(``Profiler(wait=1, warmup=1, active=3, repeat=2)``: a trace per cycle, written by
``torch.profiler.tensorboard_trace_handler`` as ``*.pt.trace.json``, what TensorBoard's PyTorch
profiler plugin reads). Either way one ``torch.profiler.profile`` runs from the start of
training and is stepped after every step; outside its recorded steps it records nothing.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerAction

from cadence.callbacks.logdir import run_directory
from cadence.core.callbacks import Callback, RunState
from cadence.core.intervals import check_int
from cadence.core.rank import process_rank
from cadence.engine.runtime import accelerator_started

logger = logging.getLogger("cadence")


class Profiler(Callback):
    """Profiles training steps (CPU, and CUDA when the run uses it); name scopes of
    `cadence.Module` appear as ranges. Open a trace in Perfetto, ``chrome://tracing`` or
    TensorBoard.

    A range: the steps ``start_step < global_step <= end_step`` (the step before them warms
    the profiler up), one trace ``<directory>/trace-<start>-<end>.json``. A schedule (`active`
    given, and no range): ``torch.profiler.schedule(wait, warmup, active, repeat)``, counted
    from the first step this process trains, a trace per cycle written by
    ``torch.profiler.tensorboard_trace_handler`` as ``<directory>/<worker>.<time>.pt.trace.json``.
    Training that ends inside the recorded steps writes what was recorded.

    Args:
        start_step: the range starts after this global step.
        end_step: and ends after this one.
        directory: where; default ``profile/`` in the run's directory (else the working
            directory).
        wait: a schedule's steps left alone at the start of each cycle.
        warmup: a schedule's steps profiled but not recorded.
        active: a schedule's recorded steps per cycle.
        repeat: a schedule's cycles; 0 repeats them until training ends.

    Attributes:
        trace_path: the newest trace written (None before the first).
        trace_paths: every trace written, oldest first.

    Raises:
        ValueError: unless ``0 <= start_step < end_step`` are ints (a step such as 2.5 is
            never reached, so nothing would be profiled); for a schedule, unless `wait`,
            `warmup`, `repeat` are ints >= 0 and `active` a positive int; for both a range and
            a schedule, or neither.
    """

    def __init__(self, start_step: int | None = None, end_step: int | None = None,
                 directory: str | Path | None = None, *, wait: int = 1, warmup: int = 1,
                 active: int | None = None, repeat: int = 1) -> None:
        self.schedule: tuple[int, int, int, int] | None = None
        if active is not None:
            if start_step is not None or end_step is not None:
                raise ValueError("Profiler: pass a range of steps (start_step, end_step) or a "
                                 f"schedule (active={active!r}, wait, warmup, repeat), not both.")
            fix = "Pass e.g. Profiler(wait=1, warmup=1, active=3, repeat=1)."
            self.schedule = (check_int("Profiler", "wait", wait, fix, minimum=0),
                             check_int("Profiler", "warmup", warmup, fix, minimum=0),
                             check_int("Profiler", "active", active, fix),
                             check_int("Profiler", "repeat", repeat, fix, minimum=0))
        elif start_step is None or end_step is None:
            raise ValueError("Profiler: pass the range of steps to profile, e.g. "
                             "Profiler(start_step=10, end_step=20), or a schedule, e.g. "
                             "Profiler(wait=1, warmup=1, active=3).")
        else:
            start_step = check_int("Profiler", "start_step", start_step,
                                   "Pass the global step after which to start, e.g. "
                                   "start_step=10.", minimum=0)
            end_step = check_int("Profiler", "end_step", end_step,
                                 "Pass the global step after which to stop, e.g. end_step=20.")
            if not start_step < end_step:
                raise ValueError(f"Profiler: `end_step` (got {end_step}) must be after "
                                 f"`start_step` (got {start_step}), or no step is profiled. "
                                 f"Pass e.g. Profiler(start_step={start_step}, "
                                 f"end_step={start_step + 10}).")
        self.start_step = start_step
        self.end_step = end_step
        self.directory = directory
        self.trace_path: Path | None = None
        self.trace_paths: list[Path] = []
        self._profile: Any = None
        self._first_step = 0
        self._dir = Path("profile")

    def _range_schedule(self, first_step: int) -> Callable[[int], ProfilerAction]:
        """The range as a ``torch.profiler`` schedule: profiler step ``i`` is the training step
        that completes global step ``first_step + i + 1``."""
        start, end = self.start_step, self.end_step
        assert start is not None and end is not None

        def schedule(i: int) -> ProfilerAction:
            step = first_step + i + 1
            if step <= start:
                return ProfilerAction.WARMUP if step == start else ProfilerAction.NONE
            if step < end:
                return ProfilerAction.RECORD
            return ProfilerAction.RECORD_AND_SAVE if step == end else ProfilerAction.NONE

        return schedule

    def on_train_begin(self, state: RunState) -> None:
        run = run_directory(state)
        self._dir = (Path(self.directory) if self.directory is not None
                     else run.subdir("profile") if run is not None else Path("profile"))
        self._first_step = state.global_step
        activities = [torch.profiler.ProfilerActivity.CPU]
        # The accelerator's kernels only when the run has started it: tracing them in a
        # process that has not would start it inside the trace (the profiler synchronizes the
        # device when it stops), which Kineto does not survive.
        if accelerator_started() is not None:
            kind = torch.accelerator.current_accelerator().type.upper()  # type: ignore[union-attr]
            activity = getattr(torch.profiler.ProfilerActivity, kind, None)
            if activity is not None:
                activities.append(activity)
        if self.schedule is not None:
            wait, warmup, active, repeat = self.schedule
            schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active,
                                               repeat=repeat)
            handler = torch.profiler.tensorboard_trace_handler(
                str(self._dir), worker_name=f"rank{process_rank()}")
        else:
            schedule = self._range_schedule(state.global_step)
            handler = None
        self._profile = torch.profiler.profile(
            activities=activities, schedule=schedule, record_shapes=True,
            on_trace_ready=lambda profile: self._write(profile, handler))
        self._profile.start()

    def on_step_end(self, state: RunState) -> None:
        if self._profile is not None:
            with _each_cycle_its_own_trace():
                self._profile.step()

    def on_train_end(self, state: RunState) -> None:
        profile, self._profile = self._profile, None
        if profile is not None:
            with _each_cycle_its_own_trace():
                profile.stop()  # writes what a cycle cut short recorded

    def _write(self, profile: Any, handler: Callable[[Any], None] | None) -> None:
        """The profiler's ``on_trace_ready``: writes the trace of the steps just recorded."""
        last = self._first_step + profile.step_num  # the global step of the last one
        if handler is None:
            self._dir.mkdir(parents=True, exist_ok=True)
            path = self._dir / f"trace-{self.start_step}-{last}.json"
            profile.export_chrome_trace(str(path))
        else:
            before = set(self._dir.glob("*.pt.trace.json"))
            handler(profile)
            written = sorted(set(self._dir.glob("*.pt.trace.json")) - before)
            if not written:
                return
            path = written[-1]
        self.trace_path = path
        self.trace_paths.append(path)
        logger.info("Wrote the profile of the steps up to %d to %s.", last, path)


@contextlib.contextmanager
def _each_cycle_its_own_trace() -> Iterator[None]:
    """Quiets the warning torch gives at each cycle after the first that a cycle's trace holds
    only that cycle's events: that is what a trace per cycle means here (``acc_events=False``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        yield
