"""`RunRecord`: what a training process records of its run as it goes -- its timeline, and on
rank 0 the goodput so far.

Every front-end that trains in a run directory keeps one and hands it to the engine: the Task
front-end (``run_experiment``, the ``cadence`` command, under the lock it takes first), the
tensorpack trainers (their ``logdir``), `TrainLoop` (its ``checkpoint_dir``), and a bare
`cadence.Controller` whose user makes one::

    with RunRecord("runs/mine") as record:     # the run's lock, and the attempt's start
        controller = cadence.Controller(..., record=record)
        controller.train(1000)
                                                # the attempt's end: finished, preempted, error

The Controller records the loops, evaluations, restores, saves and signals it drives
(`cadence.records.timeline` lists the events); the checkpoint manager records its commits. On
rank 0 the record also keeps a live `cadence.records.goodput.GoodputCalculator`, seeded with the
earlier attempts' timeline, so that the Controller can write a ``goodput`` scalar with every
loop's logs: the same figure ``cadence goodput RUN`` prints afterwards. Other ranks write only
their own waits. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cadence.core.errors import Preempted
from cadence.core.rank import process_rank, world_size
from cadence.core.run_dir import RunDirectory
from cadence.records.goodput import GoodputCalculator
from cadence.records.timeline import Timeline, read_timeline


class RunRecord:
    """A training process's record of its run (see the module docstring).

    Used as a context manager, it is the attempt: entering takes the run's lock (rank 0:
    ``train.lock``, a second trainer in the directory is refused) and records the start;
    leaving records how the block ended -- finished, preempted (`cadence.Preempted`) or an
    error -- and releases the lock. A front-end that takes the lock itself calls `begin` and
    `finish` instead.

    Args:
        run_dir: the run's directory.
        rank: this process's rank (0 writes the run's record and keeps the goodput); None: the
            job's (`cadence.core.rank.process_rank`).
        replica: its replica group in the fault-tolerant mode, else None.
        clock: the wall clock (tests pass their own).
        waits: returns the training thread's cumulative waits that each loop's record holds
            besides its input and checkpoint waits (a replica group's ``stall_s`` and
            ``discarded_s``: `cadence.engine.fault_tolerance.ReplicaGroups.waits`); each
            ``loop_end`` gets what they grew by in the loop.

    Attributes:
        timeline: the `Timeline` every event goes to.
        run_dir: the run's directory.

    Raises:
        RunLockedError: on entering, if another process trains in the run.
        StorageError: on entering, if the lock cannot be written (a full disk).
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, rank: int | None = None,
                 replica: int | None = None, clock: Callable[[], float] = time.time,
                 waits: Callable[[], Mapping[str, float]] | None = None) -> None:
        rank = process_rank() if rank is None else rank
        self.run_dir = Path(run_dir)
        self._clock = clock
        self._attempt = contextlib.ExitStack()
        self.begun = False
        self._goodput: GoodputCalculator | None = None
        if rank == 0:
            self._goodput = GoodputCalculator()
            # The earlier attempts, read once as untrusted input (a bad line is skipped).
            earlier = read_timeline(run_dir)
            self._goodput.add_all(earlier.run if replica is None
                                  else earlier.replicas.get(replica, ()))
        self.timeline = Timeline(run_dir, rank=rank, replica=replica, clock=clock,
                                 listener=self._goodput.add if self._goodput else None,
                                 waits=waits)
        self.rank = rank

    def begin(self, world_size: int, replicas: int | None = None) -> None:
        """The attempt begins (`Timeline.start`): the process built its parts and checked
        them; from here on its end is recorded too (`finish`)."""
        self.timeline.start(world_size, replicas=replicas)
        self.begun = True

    def finish(self, error: BaseException | None) -> None:
        """Records how the attempt ends -- finished (`error` None), preempted or an error --
        if it began, and closes the timeline."""
        if self.begun:
            self.timeline.end(*outcome_of(error))
        self.close()

    def goodput(self) -> float | None:
        """The run's goodput so far -- productive time over wall time, across its attempts, up
        to now -- on rank 0; None on the other ranks, or before any time passed."""
        if self._goodput is None:
            return None
        report = self._goodput.report(self._clock(), live="attempt", ideal=False)
        return report.goodput

    def loop_logs(self) -> dict[str, Any]:
        """What the Controller adds to a loop's logs: ``{"goodput": ...}`` on rank 0 (once a
        figure exists), else nothing."""
        value = self.goodput()
        return {} if value is None else {"goodput": value}

    def close(self) -> None:
        """Closes the timeline's file."""
        self.timeline.close()

    def __enter__(self) -> RunRecord:
        if self.rank == 0:
            self._attempt.enter_context(RunDirectory(self.run_dir).training_lock())
        try:
            self.begin(world_size())
        except BaseException:
            self._attempt.close()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self.finish(exc)
        finally:
            self._attempt.close()


def outcome_of(error: BaseException | None) -> tuple[str, int | None, str | None]:
    """How a process that ends on `error` (None: it finished) ends, as its timeline's ``end``
    says it: ``(outcome, step, error text)``."""
    if error is None:
        return "finished", None, None
    if isinstance(error, Preempted):
        return "preempted", None, None
    if isinstance(error, KeyboardInterrupt):  # a second Ctrl-C: no checkpoint was saved
        return "error", None, "KeyboardInterrupt"
    return "error", None, f"{type(error).__name__}: {error}"
