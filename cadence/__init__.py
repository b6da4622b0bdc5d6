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
    "StopTraining": "cadence.core.errors",
    "SingleCostTrainer": "cadence.tensorpack",
    "SlidingWindow": "cadence.data.flows",
    "SimpleTrainer": "cadence.tensorpack",
    "ModelDesc": "cadence.tensorpack",
    "AbstractEvaluator": "cadence.engine.runner",
    "AbstractTrainer": "cadence.engine.runner",
    "Accuracy": "cadence.engine.metrics",
    "Action": "cadence.core.controller",
    "BestCheckpointExporter": "cadence.engine.exporter",
    "Callback": "cadence.core.callbacks",
    "CheckpointError": "cadence.core.errors",
    "CheckpointIO": "cadence.engine.checkpoint",
    "CheckpointManager": "cadence.engine.checkpoint",
    "CheckpointMismatchError": "cadence.core.errors",
    "CheckpointIncompatibleError": "cadence.core.errors",
    "ConfigError": "cadence.core.errors",
    "Controller": "cadence.core.controller",
    "DataConfig": "cadence.task.config",
    "DataFlow": "cadence.data.dataflow",
    "DataIterator": "cadence.data.iterator",
    "DivergenceError": "cadence.core.errors",
    "EventKeys": "cadence.tfsnippet.events",
    "EventSource": "cadence.tfsnippet.events",
    "EMAConfig": "cadence.task.config",
    "ExperimentConfig": "cadence.task.config",
    "FSDPConfig": "cadence.task.config",
    "ParallelOptions": "cadence.engine.parallelize",
    "parallelize_model": "cadence.engine.parallelize",
    "prepare_model": "cadence.engine.distributed",
    "InputContext": "cadence.data.sharding",
    "Last": "cadence.engine.metrics",
    "LearningRateConfig": "cadence.task.config",
    "LossGuard": "cadence.callbacks.loss_guard",
    "Mean": "cadence.engine.metrics",
    "Metric": "cadence.engine.metrics",
    "Module": "cadence.engine.module",
    "NotRegisteredError": "cadence.core.errors",
    "OptimizationConfig": "cadence.task.config",
    "OptimizerConfig": "cadence.task.config",
    "Output": "cadence.engine.runner",
    "Preempted": "cadence.core.errors",
    "ProgressBar": "cadence.callbacks.progress",
    "RunState": "cadence.core.callbacks",
    "RuntimeConfig": "cadence.task.config",
    "StandardEvaluator": "cadence.engine.standard_runner",
    "StandardEvaluatorOptions": "cadence.engine.standard_runner",
    "StandardTrainer": "cadence.engine.standard_runner",
    "StandardTrainerOptions": "cadence.engine.standard_runner",
    "Sum": "cadence.engine.metrics",
    "SummaryManager": "cadence.core.summary",
    "Task": "cadence.task.task",
    "build_dataloader": "cadence.data.sharding",
    "TaskConfig": "cadence.task.config",
    "StateFileIO": "cadence.engine.checkpoint",
    "TorchSaveIO": "cadence.engine.checkpoint",
    "TrainLoop": "cadence.tfsnippet.train_loop",
    "Trainer": "cadence.task.trainer",
    "TrainerConfig": "cadence.task.config",
    "load_config": "cadence.task.config_files",
    "load_weights": "cadence.engine.exporter",
    "register_experiment": "cadence.task.registry",
    "register_task": "cadence.task.registry",
    "run_experiment": "cadence.task.train_lib",
    "save_config": "cadence.task.config_files",
}
_SUBMODULES = {"summary": "cadence.core.summary", "core": "cadence.core",
               "callbacks": "cadence.callbacks", "tensorpack": "cadence.tensorpack",
               "debug": "cadence.engine.debug"}

__all__ = [
    "AbstractEvaluator",
    "AbstractTrainer",
    "Accuracy",
    "Action",
    "BestCheckpointExporter",
    "Callback",
    "CheckpointError",
    "CheckpointIO",
    "CheckpointIncompatibleError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "ConfigError",
    "Controller",
    "DataConfig",
    "DataFlow",
    "DataIterator",
    "DivergenceError",
    "EMAConfig",
    "EventKeys",
    "EventSource",
    "ExperimentConfig",
    "FSDPConfig",
    "InputContext",
    "Last",
    "LearningRateConfig",
    "LossGuard",
    "Mean",
    "Metric",
    "ModelDesc",
    "Module",
    "NotRegisteredError",
    "OptimizationConfig",
    "OptimizerConfig",
    "Output",
    "ParallelOptions",
    "Preempted",
    "ProgressBar",
    "RunState",
    "RuntimeConfig",
    "SimpleTrainer",
    "SingleCostTrainer",
    "SlidingWindow",
    "StandardEvaluator",
    "StandardEvaluatorOptions",
    "StandardTrainer",
    "StandardTrainerOptions",
    "StateFileIO",
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
    "parallelize_model",
    "prepare_model",
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
    from cadence import tensorpack as tensorpack
    from cadence.callbacks.loss_guard import LossGuard
    from cadence.callbacks.progress import ProgressBar
    from cadence.core import summary as summary
    from cadence.core.callbacks import Callback, RunState
    from cadence.core.controller import Action, Controller
    from cadence.core.errors import (
        CheckpointError,
        CheckpointIncompatibleError,
        CheckpointMismatchError,
        ConfigError,
        DivergenceError,
        NotRegisteredError,
        Preempted,
    )
    from cadence.core.summary import SummaryManager
    from cadence.data.dataflow import DataFlow
    from cadence.data.flows import SlidingWindow
    from cadence.data.iterator import DataIterator
    from cadence.data.sharding import InputContext, build_dataloader
    from cadence.engine import debug as debug
    from cadence.engine.checkpoint import (
        CheckpointIO,
        CheckpointManager,
        StateFileIO,
        TorchSaveIO,
    )
    from cadence.engine.distributed import prepare_model
    from cadence.engine.exporter import BestCheckpointExporter, load_weights
    from cadence.engine.metrics import Accuracy, Last, Mean, Metric, Sum
    from cadence.engine.module import Module
    from cadence.engine.parallelize import ParallelOptions, parallelize_model
    from cadence.engine.runner import AbstractEvaluator, AbstractTrainer, Output
    from cadence.engine.standard_runner import (
        StandardEvaluator,
        StandardEvaluatorOptions,
        StandardTrainer,
        StandardTrainerOptions,
    )
    from cadence.task.config import (
        DataConfig,
        EMAConfig,
        ExperimentConfig,
        FSDPConfig,
        LearningRateConfig,
        OptimizationConfig,
        OptimizerConfig,
        RuntimeConfig,
        TaskConfig,
        TrainerConfig,
    )
    from cadence.task.config_files import load_config, save_config
    from cadence.task.registry import register_experiment, register_task
    from cadence.task.task import Task
    from cadence.task.train_lib import run_experiment
    from cadence.task.trainer import Trainer
    from cadence.tensorpack import (
        ModelDesc,
        SimpleTrainer,
        SingleCostTrainer,
        StopTraining,
        TrainConfig,
        launch_train_with_config,
    )
    from cadence.tfsnippet.events import EventKeys, EventSource
    from cadence.tfsnippet.train_loop import TrainLoop

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
