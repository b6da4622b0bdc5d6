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
    "launch_train_with_config": "cadence.tensorpack",
    "TrainConfig": "cadence.tensorpack",
    "StopTraining": "cadence.tensorpack",
    "SingleCostTrainer": "cadence.tensorpack",
    "SimpleTrainer": "cadence.tensorpack",
    "ModelDesc": "cadence.tensorpack",
    "AbstractEvaluator": "cadence.runner",
    "AbstractTrainer": "cadence.runner",
    "Accuracy": "cadence.metrics",
    "Action": "cadence.core.controller",
    "BestCheckpointExporter": "cadence.exporter",
    "Callback": "cadence.core.callbacks",
    "CheckpointError": "cadence.core.errors",
    "CheckpointIO": "cadence.checkpoint",
    "CheckpointManager": "cadence.checkpoint",
    "CheckpointMismatchError": "cadence.core.errors",
    "ConfigError": "cadence.core.errors",
    "Controller": "cadence.core.controller",
    "DataConfig": "cadence.config",
    "DataFlow": "cadence.dataflow",
    "DataIterator": "cadence.data",
    "EventKeys": "cadence.core.events",
    "EventSource": "cadence.core.events",
    "EMAConfig": "cadence.config",
    "ExperimentConfig": "cadence.config",
    "InputContext": "cadence.task",
    "Last": "cadence.metrics",
    "LearningRateConfig": "cadence.config",
    "LossGuard": "cadence.recovery",
    "Mean": "cadence.metrics",
    "Metric": "cadence.metrics",
    "Module": "cadence.module",
    "OptimizationConfig": "cadence.config",
    "OptimizerConfig": "cadence.config",
    "Output": "cadence.runner",
    "Preempted": "cadence.core.errors",
    "ProgressBar": "cadence.core.progress",
    "RunState": "cadence.core.callbacks",
    "RuntimeConfig": "cadence.config",
    "StandardEvaluator": "cadence.standard_runner",
    "StandardEvaluatorOptions": "cadence.standard_runner",
    "StandardTrainer": "cadence.standard_runner",
    "StandardTrainerOptions": "cadence.standard_runner",
    "Sum": "cadence.metrics",
    "SummaryManager": "cadence.core.summary",
    "Task": "cadence.task",
    "build_dataloader": "cadence.task",
    "TaskConfig": "cadence.config",
    "TorchSaveIO": "cadence.checkpoint",
    "TrainLoop": "cadence.train_loop",
    "Trainer": "cadence.trainer",
    "TrainerConfig": "cadence.config",
    "load_config": "cadence.config",
    "load_weights": "cadence.exporter",
    "register_experiment": "cadence.registry",
    "register_task": "cadence.registry",
    "run_experiment": "cadence.train_lib",
    "save_config": "cadence.config",
}
_SUBMODULES = {"summary": "cadence.core.summary", "core": "cadence.core",
               "callbacks": "cadence.callbacks", "tensorpack": "cadence.tensorpack",
               "debug": "cadence.debug"}

__all__ = [
    "AbstractEvaluator",
    "AbstractTrainer",
    "Accuracy",
    "Action",
    "BestCheckpointExporter",
    "Callback",
    "CheckpointError",
    "CheckpointIO",
    "CheckpointManager",
    "CheckpointMismatchError",
    "ConfigError",
    "Controller",
    "DataConfig",
    "DataFlow",
    "DataIterator",
    "EMAConfig",
    "EventKeys",
    "EventSource",
    "ExperimentConfig",
    "InputContext",
    "Last",
    "LearningRateConfig",
    "LossGuard",
    "Mean",
    "Metric",
    "ModelDesc",
    "Module",
    "OptimizationConfig",
    "OptimizerConfig",
    "Output",
    "Preempted",
    "ProgressBar",
    "RunState",
    "RuntimeConfig",
    "SimpleTrainer",
    "SingleCostTrainer",
    "StandardEvaluator",
    "StandardEvaluatorOptions",
    "StandardTrainer",
    "StandardTrainerOptions",
    "StopTraining",
    "Sum",
    "SummaryManager",
    "Task",
    "TaskConfig",
    "TorchSaveIO",
    "TrainConfig",
    "TrainLoop",
    "Trainer",
    "TrainerConfig",
    "__version__",
    "build_dataloader",
    "callbacks",
    "core",
    "debug",
    "launch_train_with_config",
    "load_config",
    "load_weights",
    "register_experiment",
    "register_task",
    "run_experiment",
    "save_config",
    "summary",
    "tensorpack",
]

if TYPE_CHECKING:
    from cadence import callbacks as callbacks
    from cadence import core as core
    from cadence import debug as debug
    from cadence import tensorpack as tensorpack
    from cadence.checkpoint import CheckpointIO, CheckpointManager, TorchSaveIO
    from cadence.config import (
        DataConfig,
        EMAConfig,
        ExperimentConfig,
        LearningRateConfig,
        OptimizationConfig,
        OptimizerConfig,
        RuntimeConfig,
        TaskConfig,
        TrainerConfig,
        load_config,
        save_config,
    )
    from cadence.core import summary as summary
    from cadence.core.callbacks import Callback, RunState
    from cadence.core.controller import Action, Controller
    from cadence.core.errors import CheckpointError, CheckpointMismatchError, ConfigError, Preempted
    from cadence.core.events import EventKeys, EventSource
    from cadence.core.progress import ProgressBar
    from cadence.core.summary import SummaryManager
    from cadence.data import DataIterator
    from cadence.dataflow import DataFlow
    from cadence.exporter import BestCheckpointExporter, load_weights
    from cadence.metrics import Accuracy, Last, Mean, Metric, Sum
    from cadence.module import Module
    from cadence.recovery import LossGuard
    from cadence.registry import register_experiment, register_task
    from cadence.runner import AbstractEvaluator, AbstractTrainer, Output
    from cadence.standard_runner import (
        StandardEvaluator,
        StandardEvaluatorOptions,
        StandardTrainer,
        StandardTrainerOptions,
    )
    from cadence.task import InputContext, Task, build_dataloader
    from cadence.tensorpack import (
        ModelDesc,
        SimpleTrainer,
        SingleCostTrainer,
        StopTraining,
        TrainConfig,
        launch_train_with_config,
    )
    from cadence.train_lib import run_experiment
    from cadence.train_loop import TrainLoop
    from cadence.trainer import Trainer

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
