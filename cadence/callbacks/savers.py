"""Checkpoint savers: `ModelSaver` (periodic, keep N) and `MinSaver` / `MaxSaver` (keep the best).

`ModelSaver` saves full checkpoints -- model, optimizer, schedules, counters, data position,
random state, and every callback's state -- through the run's one checkpoint manager (the
Controller's, or a `TrainLoop`'s), so there is one place checkpoints go and a run resumes from.
`MinSaver` and `MaxSaver` export the model's weights whenever a metric reaches a new best
(safetensors + JSON, through `BestCheckpointExporter`), so the best model is never confused
with the resume checkpoint.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from pathlib import Path

from cadence.callbacks.logdir import resolve_directory
from cadence.core.best import lookup
from cadence.core.callbacks import Callback, RunState
from cadence.core.checkpoint_dir import DEFAULT_MAX_TO_KEEP
from cadence.core.logs import is_scalar
from cadence.core.rank import is_chief
from cadence.core.trainer_view import trained_model
from cadence.engine.exporter import BestCheckpointExporter

logger = logging.getLogger("cadence")

KEPT = "kept"
"""The folder, inside the checkpoint directory, of the checkpoints `ModelSaver` keeps every n
hours: outside the ``ckpt-<step>`` names that retention prunes (and that a run resumes from)."""

_clock = time.time  # the wall clock of `keep_checkpoint_every_n_hours` (tests replace it)


def _link_or_copy(source: str, target: str) -> None:
    """A hard link (no second copy of the bytes: a checkpoint's files are never rewritten),
    or a copy where the file system has none."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class ModelSaver(Callback):
    """Saves a checkpoint of the run at each trigger (by default, every epoch's end).

    It saves through what drives the run (``state.controller``): the tensorpack trainers build
    their checkpoint manager from the run's ModelSaver -- its `checkpoint_dir` is where they
    save and where a run resumes from, its `max_to_keep` their retention.

    With `keep_checkpoint_every_n_hours` (TF's ``Saver`` option, which tensorpack passes on),
    the first checkpoint saved once each period of that many hours has passed since training
    started (by this saver or any other save of the run) is also kept forever, as
    ``<checkpoint_dir>/kept/ckpt-<step>``: hard links to its files, out of reach of
    `max_to_keep`. A run resumes from the newest ``ckpt-<step>`` only, never from a kept one.

    Args:
        max_to_keep: checkpoints to keep (None: all).
        checkpoint_dir: where; default ``<logdir>/checkpoints``.
        keep_checkpoint_every_n_hours: also keep one checkpoint per period of this many hours;
            None keeps none beyond `max_to_keep` (tensorpack's default is 0.5).

    Raises:
        ValueError: if `keep_checkpoint_every_n_hours` is not a positive number or None.
    """

    def __init__(self, max_to_keep: int | None = DEFAULT_MAX_TO_KEEP,
                 checkpoint_dir: str | Path | None = None,
                 keep_checkpoint_every_n_hours: float | None = None) -> None:
        hours = keep_checkpoint_every_n_hours
        if hours is not None and not (is_scalar(hours) and 0 < hours < math.inf):
            raise ValueError(f"ModelSaver: `keep_checkpoint_every_n_hours` (got {hours!r}) must "
                             "be a positive number of hours or None. Pass e.g. "
                             "keep_checkpoint_every_n_hours=0.5.")
        self.max_to_keep = max_to_keep
        self.checkpoint_dir = checkpoint_dir
        self.keep_checkpoint_every_n_hours = hours
        self._next_keep = math.inf
        """When the next checkpoint saved is kept (wall-clock seconds, TF's rule)."""

    def trigger(self, state: RunState) -> None:
        if state.controller is None:
            raise ValueError(
                "ModelSaver saves through the run's checkpoint manager, and this run has none: "
                "train with a tensorpack trainer, a TrainLoop(checkpoint_dir=...), or a "
                "Controller(checkpoint_manager=...)."
            )
        state.controller.save_checkpoint()

    def on_epoch_end(self, state: RunState) -> None:
        self.trigger(state)

    def on_train_begin(self, state: RunState) -> None:
        if self.keep_checkpoint_every_n_hours is not None:
            self._next_keep = _clock() + self.keep_checkpoint_every_n_hours * 3600

    def on_checkpoint_saved(self, state: RunState, path: str) -> None:
        hours = self.keep_checkpoint_every_n_hours
        if hours is None or not is_chief() or _clock() < self._next_keep:
            return
        source = Path(path)
        if not source.is_dir():  # a background write not committed yet: the next one
            return
        self._next_keep += hours * 3600
        target = source.parent / KEPT / source.name
        if target.exists():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".tmp-{source.name}")
        shutil.rmtree(temp, ignore_errors=True)
        shutil.copytree(source, temp, copy_function=_link_or_copy)
        os.rename(temp, target)  # whole or not at all
        logger.info("Kept %s as %s (one checkpoint every %g hours).", source, target, hours)


class _BestSaver(Callback):
    comp = "higher"

    def __init__(self, monitor_stat: str, export_dir: str | Path | None = None,
                 max_to_keep: int = 1) -> None:
        self.monitor_stat = monitor_stat
        self.requires = (monitor_stat,)
        self.export_dir = export_dir
        self.max_to_keep = max_to_keep
        self.exporter: BestCheckpointExporter | None = None

    def on_train_begin(self, state: RunState) -> None:
        name = type(self).__name__
        directory = resolve_directory(
            state, self.export_dir, name,
            f"{name.lower()}-{self.monitor_stat.replace('/', '_')}")
        self.exporter = BestCheckpointExporter(directory, self.monitor_stat, self.comp,
                                               self.max_to_keep)

    def trigger(self, state: RunState) -> None:
        if lookup(state.metrics, self.monitor_stat, type(self).__name__) is None:
            return  # nothing measured yet
        if self.exporter is None:
            self.on_train_begin(state)
        assert self.exporter is not None
        model = trained_model(state.trainer, type(self).__name__)
        self.exporter.maybe_export_checkpoint(model, state.metrics, state.global_step)

    def on_epoch_end(self, state: RunState) -> None:
        self.trigger(state)


class MinSaver(_BestSaver):
    """Exports the model's weights whenever `monitor_stat` reaches a new minimum.

    Args:
        monitor_stat: the metric (in ``state.metrics``) to watch; a trigger without it is an
            error that lists the metrics there are.
        export_dir: where; default ``<logdir>/minsaver-<stat>``.
        max_to_keep: keep the best K exports.
    """

    comp = "lower"


class MaxSaver(_BestSaver):
    """Exports the model's weights whenever `monitor_stat` reaches a new maximum (see
    `MinSaver`)."""

    comp = "higher"

