"""`RunCheckpoints`: a run's checkpoints as the Controller takes them.

It saves at exact multiples of the manager's ``checkpoint_interval`` (`due`), restores, knows
which checkpoint the weights in memory came from (`weights`: what an evaluation records), counts
restores (a callback that restores during a loop rewinds training), and waits for saves that
finish in the background before an entry point returns. With the run's record (a
`cadence.core.protocols.RunRecordLike`), the run's timeline gets each restore and how long
each save and wait kept the training thread. Nothing here imports torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cadence.core.callbacks import CallbackList, RunState
from cadence.core.errors import StorageError
from cadence.core.intervals import Interval, check_interval
from cadence.core.protocols import CheckpointManagerLike, RunRecordLike, SavesInBackground
from cadence.core.rank import world_size
from cadence.core.storage import name_newest

logger = logging.getLogger("cadence")


class RunCheckpoints:
    """Saves and restores through `manager` (None: a run without checkpoints).

    Args:
        manager: the checkpoint manager, or None.
        global_step: returns the run's completed steps.
        callbacks: whose ``on_checkpoint_saved`` runs after each save.
        state: the run state those callbacks see.
        record: the run's record (its timeline), or None.

    Attributes:
        interval: the manager's ``checkpoint_interval``, with the step of the last save.
        weights: the checkpoint the weights in memory came from (None: not checkpointed).
        restores: how many restores happened.

    Raises:
        ValueError: if the manager's ``checkpoint_interval`` is not a positive int or None.
    """

    def __init__(self, manager: CheckpointManagerLike | None, global_step: Callable[[], int],
                 callbacks: CallbackList, state: RunState,
                 record: RunRecordLike | None = None) -> None:
        self.manager = manager
        self.record = record
        self._global_step = global_step
        self._callbacks, self._state = callbacks, state
        every = None if manager is None else check_interval(
            "checkpoint_manager.checkpoint_interval", manager.checkpoint_interval)
        self.interval = Interval(every, last=global_step())
        self.weights: str | None = None
        self.restores = 0
        self._background = manager if isinstance(manager, SavesInBackground) else None

    def require(self, what: str) -> CheckpointManagerLike:
        """The manager; `what` needs one.

        Raises:
            ValueError: without a manager.
        """
        if self.manager is None:
            raise ValueError(f"{what} needs a checkpoint manager: "
                             "Controller(checkpoint_manager=CheckpointManager(...)).")
        return self.manager

    def restore(self, path: str | None) -> str | None:
        """Restores `path`, or the newest complete checkpoint; with none on disk, runs the
        manager's ``init_fn``. Returns the restored path (None: nothing was restored)."""
        manager = self.require("restore_checkpoint()")
        record = self.record
        if record is not None:
            record.timeline.restore_begin()
        if path is None:
            path = manager.restore_or_initialize()
        else:
            manager.restore(path)
        step = self._global_step()
        if record is not None:
            record.timeline.restore_end(step, path)
        self.restores += 1
        self.interval.mark(step)
        self.weights = path
        if path is None:
            logger.info("No checkpoint to restore: starting from step %d.", step)
        else:
            logger.info("Restored %s (step %d).", path, step)
        return path

    def jumped_to(self, step: int) -> None:
        """The global step jumped during the loop that ended at `step` (a replica group healed
        from a live one): the multiples it passed were trained, and saved, by the live groups,
        so only a multiple at `step` itself is still this group's to save. Checkpoints stay on
        the interval's multiples after a heal."""
        self.interval.mark(max(self.interval.last, step - 1))

    def due(self, step: int) -> bool:
        """Whether a save is due at `step`: the interval's multiple was reached."""
        return self.manager is not None and self.interval.crossed(step)

    def save(self) -> str:
        """Saves now, and fires ``on_checkpoint_saved``. Returns the checkpoint's path."""
        manager = self.require("save_checkpoint()")
        step = self._global_step()
        started = time.perf_counter()
        path = manager.save(step)
        if self.record is not None:  # the training thread's stall: the write, or its snapshot
            self.record.timeline.save(step, time.perf_counter() - started)
        self.interval.mark(step)
        self.weights = path
        if self._background is None or not self._background.logs_saves:
            # A manager that logs its own saves does so after the commit (a background write
            # may still be running here).
            logger.info("Saved checkpoint %s.", path)
        self._callbacks.fire("on_checkpoint_saved", self._state, path)
        return path

    def name_newest(self, error: BaseException) -> None:
        """Says in a `StorageError` the run fails with (a full disk met by any writer) which
        checkpoint it resumes from, unless it says already."""
        if isinstance(error, StorageError) and self.manager is not None:
            found = self.manager.checkpoints
            name_newest(error, (str(found[-1].path), found[-1].step) if found else None)

    def saved_now(self) -> bool:
        """Whether the weights in memory are those of the newest save."""
        return self.weights is not None and self.interval.last == self._global_step()

    def wait(self, quiet: bool = False, failing: bool = False) -> None:
        """Waits until what was saved is committed (``wait()``; Orbit's sync before `train`
        returns), raising a failed write's error (`quiet`: logged); a `failing` rank of several
        commits nothing (``abandon()``: a commit's collectives would meet the others')."""
        manager = self._background
        if manager is None:
            return
        started = time.perf_counter()
        try:
            manager.abandon() if failing and world_size() > 1 else manager.wait()
            waited = time.perf_counter() - started
            if self.record is not None and not failing and waited >= 1e-3:  # it did wait
                self.record.timeline.save(self._global_step(), waited)
        except Exception:
            if not quiet:
                raise
            logger.exception("A checkpoint write failed while training was ending on an error.")
