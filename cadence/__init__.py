"""cadence: a training-loop framework for PyTorch.

The public API is exactly what this module exports. Names are imported on first use, so that
``import cadence`` stays light and ``cadence.core`` (the engine that needs no tensors) can be
used without importing torch at all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AbstractEvaluator": "cadence.runner",
    "AbstractTrainer": "cadence.runner",
    "Action": "cadence.core.controller",
    "Callback": "cadence.core.callbacks",
    "CheckpointError": "cadence.core.errors",
    "CheckpointIO": "cadence.checkpoint",
    "CheckpointManager": "cadence.checkpoint",
    "CheckpointMismatchError": "cadence.core.errors",
    "Controller": "cadence.core.controller",
    "DataIterator": "cadence.data",
    "Last": "cadence.metrics",
    "Mean": "cadence.metrics",
    "Metric": "cadence.metrics",
    "Module": "cadence.module",
    "Output": "cadence.runner",
    "Preempted": "cadence.core.errors",
    "ProgressBar": "cadence.core.progress",
    "RunState": "cadence.core.callbacks",
    "StandardEvaluator": "cadence.standard_runner",
    "StandardEvaluatorOptions": "cadence.standard_runner",
    "StandardTrainer": "cadence.standard_runner",
    "StandardTrainerOptions": "cadence.standard_runner",
    "Sum": "cadence.metrics",
    "SummaryManager": "cadence.core.summary",
    "TorchSaveIO": "cadence.checkpoint",
}
_SUBMODULES = {"summary": "cadence.core.summary", "core": "cadence.core"}

__all__ = [
    "AbstractEvaluator",
    "AbstractTrainer",
    "Action",
    "Callback",
    "CheckpointError",
    "CheckpointIO",
    "CheckpointManager",
    "CheckpointMismatchError",
    "Controller",
    "DataIterator",
    "Last",
    "Mean",
    "Metric",
    "Module",
    "Output",
    "Preempted",
    "ProgressBar",
    "RunState",
    "StandardEvaluator",
    "StandardEvaluatorOptions",
    "StandardTrainer",
    "StandardTrainerOptions",
    "Sum",
    "SummaryManager",
    "TorchSaveIO",
    "__version__",
    "core",
    "summary",
]

if TYPE_CHECKING:
    from cadence import core as core
    from cadence.checkpoint import CheckpointIO, CheckpointManager, TorchSaveIO
    from cadence.core import summary as summary
    from cadence.core.callbacks import Callback, RunState
    from cadence.core.controller import Action, Controller
    from cadence.core.errors import CheckpointError, CheckpointMismatchError, Preempted
    from cadence.core.progress import ProgressBar
    from cadence.core.summary import SummaryManager
    from cadence.data import DataIterator
    from cadence.metrics import Last, Mean, Metric, Sum
    from cadence.module import Module
    from cadence.runner import AbstractEvaluator, AbstractTrainer, Output
    from cadence.standard_runner import (
        StandardEvaluator,
        StandardEvaluatorOptions,
        StandardTrainer,
        StandardTrainerOptions,
    )


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    else:
        raise AttributeError(f"module 'cadence' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
