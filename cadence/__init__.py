"""cadence: a training-loop framework for PyTorch.

The public API is exactly what this module exports.
"""

from cadence.checkpoint import CheckpointIO, CheckpointManager, TorchSaveIO
from cadence.core import (
    Action,
    Callback,
    CheckpointError,
    CheckpointMismatchError,
    Controller,
    Preempted,
    RunState,
    SummaryManager,
)
from cadence.core import summary as summary
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

__version__ = "0.1.0"

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
    "RunState",
    "StandardEvaluator",
    "StandardEvaluatorOptions",
    "StandardTrainer",
    "StandardTrainerOptions",
    "Sum",
    "SummaryManager",
    "TorchSaveIO",
    "__version__",
    "summary",
]
