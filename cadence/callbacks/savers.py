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
from pathlib import Path

from cadence.callbacks.logdir import resolve_directory
from cadence.core.best import lookup
from cadence.core.callbacks import Callback, RunState
from cadence.core.checkpoint_dir import DEFAULT_MAX_TO_KEEP
from cadence.engine.exporter import BestCheckpointExporter

logger = logging.getLogger("cadence")


class ModelSaver(Callback):
    """Saves a checkpoint of the run at each trigger (by default, every epoch's end).

    It saves through what drives the run (``state.controller``): the tensorpack trainers build
    their checkpoint manager from the run's ModelSaver -- its `checkpoint_dir` is where they
    save and where a run resumes from, its `max_to_keep` their retention.

    Args:
        max_to_keep: checkpoints to keep (None: all).
        checkpoint_dir: where; default ``<logdir>/checkpoints``.
    """

    def __init__(self, max_to_keep: int | None = DEFAULT_MAX_TO_KEEP,
                 checkpoint_dir: str | Path | None = None) -> None:
        self.max_to_keep = max_to_keep
        self.checkpoint_dir = checkpoint_dir

    def trigger(self, state: RunState) -> None:
        save = getattr(state.controller, "save_checkpoint", None)
        if save is None:
            raise ValueError(
                "ModelSaver saves through the run's checkpoint manager, and this run has none: "
                "train with a tensorpack trainer, a TrainLoop(checkpoint_dir=...), or a "
                "Controller(checkpoint_manager=...)."
            )
        save()

    def on_epoch_end(self, state: RunState) -> None:
        self.trigger(state)


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
        model = getattr(state.trainer, "model", None)
        if model is None:
            raise ValueError(f"{type(self).__name__} exports state.trainer.model, which this "
                             "trainer does not have.")
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

