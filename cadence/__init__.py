"""cadence: a training-loop framework for PyTorch.

The public API is exactly what this module exports. Names are imported on first use, so that
``import cadence`` stays light and ``cadence.core`` (the engine that needs no tensors) can be
used without importing torch at all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The public API, the one hand-kept list: each name and the module it is imported from on first
# use. `__all__` is made from it; the imports under TYPE_CHECKING below repeat it for type
# checkers (which cannot read a table), and tests/test_public_api.py checks that they agree.
_EXPORTS = {
    "AbstractEvaluator": "cadence.engine.runner",
    "AbstractTrainer": "cadence.engine.runner",
    "Accuracy": "cadence.engine.metrics",
    "Action": "cadence.core.controller",
    "BestCheckpointExporter": "cadence.engine.exporter",
    "build_dataloader": "cadence.data.sharding",
    "build_token_inputs": "cadence.data.token_loader",
    "Callback": "cadence.core.callbacks",
    "CheckpointError": "cadence.core.errors",
    "CheckpointIncompatibleError": "cadence.core.errors",
    "CheckpointIO": "cadence.engine.checkpoint",
    "CheckpointManager": "cadence.engine.checkpoint",
    "CheckpointMismatchError": "cadence.core.errors",
    "ConfigError": "cadence.core.errors",
    "Controller": "cadence.core.controller",
    "DataConfig": "cadence.task.config",
    "DataFlow": "cadence.data.dataflow",
    "DataIterator": "cadence.data.iterator",
    "DivergenceError": "cadence.core.errors",
    "document_causal_mask": "cadence.data.packing",
    "EMAConfig": "cadence.task.config",
    "EventKeys": "cadence.tfsnippet.events",
    "EventSource": "cadence.tfsnippet.events",
    "ExperimentConfig": "cadence.task.config",
    "FSDPConfig": "cadence.task.config",
    "HookError": "cadence.core.errors",
    "InputContext": "cadence.data.sharding",
    "Last": "cadence.engine.metrics",
    "launch_train_with_config": "cadence.tensorpack",
    "LearningRateConfig": "cadence.task.config",
    "load_config": "cadence.task.config_files",
    "load_weights": "cadence.engine.exporter",
    "LossGuard": "cadence.callbacks.loss_guard",
    "Mean": "cadence.engine.metrics",
    "Metric": "cadence.engine.metrics",
    "ModelDesc": "cadence.tensorpack",
    "Module": "cadence.engine.module",
    "NotRegisteredError": "cadence.core.errors",
    "OptimizationConfig": "cadence.task.config",
    "OptimizerConfig": "cadence.task.config",
    "Output": "cadence.engine.runner",
    "parallelize_model": "cadence.engine.parallelize",
    "ParallelOptions": "cadence.engine.parallelize",
    "ParallelismConfig": "cadence.task.config",
    "Preempted": "cadence.core.errors",
    "prepare_data": "cadence.data.prepare",
    "prepare_model": "cadence.engine.parallelize",
    "ProgressBar": "cadence.callbacks.progress",
    "register_experiment": "cadence.task.registry",
    "register_task": "cadence.task.registry",
    "run_experiment": "cadence.task.train_lib",
    "RunRecord": "cadence.records.run_record",
    "RunState": "cadence.core.callbacks",
    "Runtime": "cadence.engine.runtime",
    "RuntimeConfig": "cadence.task.config",
    "save_config": "cadence.task.config_files",
    "setup_runtime": "cadence.engine.runtime",
    "SimpleTrainer": "cadence.tensorpack",
    "SingleCostTrainer": "cadence.tensorpack",
    "SlidingWindow": "cadence.data.flows",
    "StandardEvaluator": "cadence.engine.standard_runner",
    "StandardEvaluatorOptions": "cadence.engine.standard_runner",
    "StandardTrainer": "cadence.engine.standard_runner",
    "StandardTrainerOptions": "cadence.engine.standard_runner",
    "StateFileIO": "cadence.engine.checkpoint",
    "StepDiscarded": "cadence.core.errors",
    "StopTraining": "cadence.core.errors",
    "StorageError": "cadence.core.errors",
    "StreamLoader": "cadence.data.streaming",
    "Sum": "cadence.engine.metrics",
    "SummaryManager": "cadence.core.summary",
    "Task": "cadence.task.task",
    "TaskConfig": "cadence.task.config",
    "TokenDataConfig": "cadence.task.config",
    "TokenLoader": "cadence.data.token_loader",
    "TokenShards": "cadence.data.token_shards",
    "TrainConfig": "cadence.tensorpack",
    "Trainer": "cadence.task.trainer",
    "TrainerConfig": "cadence.task.config",
    "TrainerView": "cadence.core.trainer_view",
    "TrainLoop": "cadence.tfsnippet.train_loop",
}
_SUBMODULES = {"summary": "cadence.core.summary", "core": "cadence.core",
               "callbacks": "cadence.callbacks", "tensorpack": "cadence.tensorpack",
               "debug": "cadence.engine.debug"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])

if TYPE_CHECKING:  # `name as name`: re-exported, for type checkers
    from cadence import callbacks as callbacks
    from cadence import core as core
    from cadence import tensorpack as tensorpack
    from cadence.callbacks.loss_guard import LossGuard as LossGuard
    from cadence.callbacks.progress import ProgressBar as ProgressBar
    from cadence.core import summary as summary
    from cadence.core.callbacks import Callback as Callback
    from cadence.core.callbacks import RunState as RunState
    from cadence.core.controller import Action as Action
    from cadence.core.controller import Controller as Controller
    from cadence.core.errors import CheckpointError as CheckpointError
    from cadence.core.errors import CheckpointIncompatibleError as CheckpointIncompatibleError
    from cadence.core.errors import CheckpointMismatchError as CheckpointMismatchError
    from cadence.core.errors import ConfigError as ConfigError
    from cadence.core.errors import DivergenceError as DivergenceError
    from cadence.core.errors import HookError as HookError
    from cadence.core.errors import NotRegisteredError as NotRegisteredError
    from cadence.core.errors import Preempted as Preempted
    from cadence.core.errors import StepDiscarded as StepDiscarded
    from cadence.core.errors import StopTraining as StopTraining
    from cadence.core.errors import StorageError as StorageError
    from cadence.core.summary import SummaryManager as SummaryManager
    from cadence.core.trainer_view import TrainerView as TrainerView
    from cadence.data.dataflow import DataFlow as DataFlow
    from cadence.data.flows import SlidingWindow as SlidingWindow
    from cadence.data.iterator import DataIterator as DataIterator
    from cadence.data.packing import document_causal_mask as document_causal_mask
    from cadence.data.prepare import prepare_data as prepare_data
    from cadence.data.sharding import InputContext as InputContext
    from cadence.data.sharding import build_dataloader as build_dataloader
    from cadence.data.streaming import StreamLoader as StreamLoader
    from cadence.data.token_loader import TokenLoader as TokenLoader
    from cadence.data.token_loader import build_token_inputs as build_token_inputs
    from cadence.data.token_shards import TokenShards as TokenShards
    from cadence.engine import debug as debug
    from cadence.engine.checkpoint import CheckpointIO as CheckpointIO
    from cadence.engine.checkpoint import CheckpointManager as CheckpointManager
    from cadence.engine.checkpoint import StateFileIO as StateFileIO
    from cadence.engine.exporter import BestCheckpointExporter as BestCheckpointExporter
    from cadence.engine.exporter import load_weights as load_weights
    from cadence.engine.metrics import Accuracy as Accuracy
    from cadence.engine.metrics import Last as Last
    from cadence.engine.metrics import Mean as Mean
    from cadence.engine.metrics import Metric as Metric
    from cadence.engine.metrics import Sum as Sum
    from cadence.engine.module import Module as Module
    from cadence.engine.parallelize import ParallelOptions as ParallelOptions
    from cadence.engine.parallelize import parallelize_model as parallelize_model
    from cadence.engine.parallelize import prepare_model as prepare_model
    from cadence.engine.runner import AbstractEvaluator as AbstractEvaluator
    from cadence.engine.runner import AbstractTrainer as AbstractTrainer
    from cadence.engine.runner import Output as Output
    from cadence.engine.runtime import Runtime as Runtime
    from cadence.engine.runtime import setup_runtime as setup_runtime
    from cadence.engine.standard_runner import StandardEvaluator as StandardEvaluator
    from cadence.engine.standard_runner import StandardEvaluatorOptions as StandardEvaluatorOptions
    from cadence.engine.standard_runner import StandardTrainer as StandardTrainer
    from cadence.engine.standard_runner import StandardTrainerOptions as StandardTrainerOptions
    from cadence.records.run_record import RunRecord as RunRecord
    from cadence.task.config import DataConfig as DataConfig
    from cadence.task.config import EMAConfig as EMAConfig
    from cadence.task.config import ExperimentConfig as ExperimentConfig
    from cadence.task.config import FSDPConfig as FSDPConfig
    from cadence.task.config import LearningRateConfig as LearningRateConfig
    from cadence.task.config import OptimizationConfig as OptimizationConfig
    from cadence.task.config import OptimizerConfig as OptimizerConfig
    from cadence.task.config import ParallelismConfig as ParallelismConfig
    from cadence.task.config import RuntimeConfig as RuntimeConfig
    from cadence.task.config import TaskConfig as TaskConfig
    from cadence.task.config import TokenDataConfig as TokenDataConfig
    from cadence.task.config import TrainerConfig as TrainerConfig
    from cadence.task.config_files import load_config as load_config
    from cadence.task.config_files import save_config as save_config
    from cadence.task.registry import register_experiment as register_experiment
    from cadence.task.registry import register_task as register_task
    from cadence.task.task import Task as Task
    from cadence.task.train_lib import run_experiment as run_experiment
    from cadence.task.trainer import Trainer as Trainer
    from cadence.tensorpack import ModelDesc as ModelDesc
    from cadence.tensorpack import SimpleTrainer as SimpleTrainer
    from cadence.tensorpack import SingleCostTrainer as SingleCostTrainer
    from cadence.tensorpack import TrainConfig as TrainConfig
    from cadence.tensorpack import launch_train_with_config as launch_train_with_config
    from cadence.tfsnippet.events import EventKeys as EventKeys
    from cadence.tfsnippet.events import EventSource as EventSource
    from cadence.tfsnippet.train_loop import TrainLoop as TrainLoop


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
