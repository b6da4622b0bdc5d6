"""tensorpack's default callbacks and monitors, which both `TrainConfig` (``launch.py``) and
``Trainer.train_with_defaults`` (``trainer.py``) use: here, so that neither imports the other."""

from __future__ import annotations

from collections.abc import Sequence

from cadence.callbacks.monitors import JSONWriter, ScalarPrinter, TFEventWriter
from cadence.callbacks.progress import ProgressBar
from cadence.core.callbacks import Callback
from cadence.core.summary import DEFAULT_WRITERS, WriterSpec


def default_callbacks() -> list[Callback]:
    """tensorpack's ``DEFAULT_CALLBACKS``, in cadence: the progress bar (on a terminal)."""
    return [ProgressBar()]


def default_monitors(writers: Sequence[WriterSpec] = DEFAULT_WRITERS) -> list[Callback]:
    """tensorpack's ``DEFAULT_MONITORS``: summaries (TensorBoard and JSON lines, or the metric
    `writers` given), ``stats.jsonl`` and a printed line."""
    return [TFEventWriter(writers=writers), JSONWriter(), ScalarPrinter()]
