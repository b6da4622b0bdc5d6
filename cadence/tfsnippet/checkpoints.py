"""`LoopCheckpoints`: where a `TrainLoop` saves checkpoints, and what it resumes from."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cadence.engine.checkpoint import CheckpointManager

RESERVED_OBJECTS = frozenset({"loop", "params", "callbacks"})
"""The names of what the loop saves itself (its state, its callbacks, the parameters)."""


class LoopCheckpoints:
    """Opens a `CheckpointManager` on `directory` when the run starts -- restoring the newest
    checkpoint there, a given one, or none -- and saves through it.

    Args:
        directory: where checkpoints go; None: nowhere (`open` does nothing, `save` raises).
        max_to_keep: checkpoints to keep (None or 0: all).
        save_objects: more stateful objects to save, by name (optimizers, schedulers, ...).
        restore: True: the newest checkpoint in `directory`, if any; a path: that checkpoint;
            False: none (checkpoints are still saved).

    Raises:
        KeyError: if `save_objects` uses a name of `RESERVED_OBJECTS`.
    """

    def __init__(self, directory: str | Path | None, max_to_keep: int | None = None,
                 save_objects: Mapping[str, Any] | None = None,
                 restore: bool | str | Path = True) -> None:
        objects = dict(save_objects or {})
        taken = RESERVED_OBJECTS.intersection(objects)
        if taken:
            raise KeyError(f"checkpoint_save_objects uses reserved names {sorted(taken)}; rename "
                           "them.")
        self.directory = Path(directory) if directory is not None else None
        self.manager: CheckpointManager | None = None
        """The manager of `directory`, once opened."""
        self._max_to_keep = max_to_keep or None
        self._save_objects = objects
        self._restore = restore

    def open(self, objects: Mapping[str, Any],
             on_commit: Callable[[int, Path], None] | None = None) -> str | None:
        """Opens the manager on `objects` (what the loop saves itself) and the `save_objects`,
        and restores them; returns the checkpoint restored, or None. `on_commit` is told of
        each checkpoint committed (the run's timeline)."""
        if self.directory is None:
            return None
        self.manager = CheckpointManager({**objects, **self._save_objects}, self.directory,
                                         max_to_keep=self._max_to_keep, on_commit=on_commit)
        if isinstance(self._restore, (str, Path)):
            self.manager.restore(str(self._restore))
            return str(self._restore)
        return self.manager.restore_or_initialize() if self._restore else None

    def save(self, step: int) -> str:
        """Saves a checkpoint of `step` now; returns its path.

        Raises:
            RuntimeError: without a `directory`.
        """
        if self.manager is None:
            raise RuntimeError("make_checkpoint() needs a checkpoint_dir.")
        return self.manager.save(step)
