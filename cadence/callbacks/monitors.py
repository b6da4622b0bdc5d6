"""Monitors: where the scalars of each loop (an epoch, in the tensorpack trainer) go.

They listen to ``on_loop_end``, which every front-end fires with host values, so they add
nothing per step. Put them last: they then see what every other callback recorded. A loop that
a pause cut short in the middle of an epoch (``RunState.epoch_paused``) writes nothing: its
scalars belong to the epoch, which the run that continues it finishes and records once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cadence.callbacks.logdir import resolve_directory, run_directory
from cadence.core.callbacks import Callback, RunState
from cadence.core.logs import format_logs
from cadence.core.rank import is_chief
from cadence.core.summary import (
    DEFAULT_WRITERS,
    SummaryManager,
    WriterSpec,
    check_writers,
    close_summaries,
)
from cadence.writers.jsonl import JSONLWriter

logger = logging.getLogger("cadence")


def _snapshot(state: RunState, logs: dict[str, Any]) -> dict[str, Any]:
    return {**state.metrics, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}


class JSONWriter(Callback):
    """Appends one JSON line per loop -- ``global_step``, ``epoch`` and every scalar -- to
    ``stats.jsonl`` (tensorpack rewrote a whole ``stats.json`` each epoch; appending never
    loses earlier lines to a crash, and each line is synced to disk).

    Args:
        directory: where; default the trainer's logdir.
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = directory
        self._writer: JSONLWriter | None = None

    def on_loop_end(self, state: RunState, logs: dict[str, Any]) -> None:
        if not is_chief() or state.epoch_paused:
            return
        if self._writer is None:
            directory = resolve_directory(state, self.directory, "JSONWriter")
            self._writer = JSONLWriter(directory, "stats.jsonl", step_key="global_step",
                                       fsync=True)
        self._writer.write(state.global_step, _snapshot(state, logs),
                           extra={"epoch": state.epoch})

    def on_train_end(self, state: RunState) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class TFEventWriter(Callback):
    """Writes every scalar of each loop as summaries at the global step: TensorBoard event files
    and JSON lines, or the metric `writers` given (tensorpack's ``TFEventWriter``; it drives the
    metric writer `cadence.writers.tensorboard.TensorBoardWriter`).

    Args:
        directory: where; default ``<logdir>/train``.
        writers: the metric writers: names (``tensorboard``, ``jsonl``, ``csv``, ``mlflow``,
            ``wandb``) or functions of a directory (see ``docs/writers.md``). MLflow and W&B
            keep their run in the logdir (when `directory` is inside it).

    Raises:
        ValueError: for an unknown writer name.
    """

    def __init__(self, directory: str | Path | None = None,
                 writers: Sequence[WriterSpec] = DEFAULT_WRITERS) -> None:
        self.directory = directory
        self.writers = check_writers(writers)
        self._summaries: SummaryManager | None = None

    def on_train_begin(self, state: RunState) -> None:
        directory = resolve_directory(state, self.directory, "TFEventWriter", "train")
        run = run_directory(state)
        inside = run is not None and os.path.abspath(directory).startswith(
            os.path.join(os.path.abspath(run.root), ""))
        self._summaries = SummaryManager(str(directory), lambda: state.global_step,
                                         writers=self.writers,
                                         run_dir=run.root if run is not None and inside else None)

    def on_loop_end(self, state: RunState, logs: dict[str, Any]) -> None:
        if state.epoch_paused:
            return
        if self._summaries is None:
            self.on_train_begin(state)
        assert self._summaries is not None
        self._summaries.write_summaries(_snapshot(state, logs), step=state.global_step)
        self._summaries.flush()

    def on_train_end(self, state: RunState) -> None:
        if self._summaries is not None:
            # with how the run ended: MLflow's status, W&B's exit code
            close_summaries(state.error, close=[self._summaries])
            self._summaries = None


class ScalarPrinter(Callback):
    """Logs the scalars of each loop as one line."""

    def on_loop_end(self, state: RunState, logs: dict[str, Any]) -> None:
        if state.epoch_paused:
            return
        logger.info("epoch %d | step %d | %s", state.epoch, state.global_step,
                    format_logs(_snapshot(state, logs)))

