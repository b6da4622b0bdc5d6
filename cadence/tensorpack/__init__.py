"""The tensorpack front-end (seed 003): trainers that run `run_step` in epochs, driven by the
engine's `Controller`, and the declarative `TrainConfig` / `launch_train_with_config`.

A front-end: it builds on the engine and imports no other front-end.
"""

from cadence.core.errors import StopTraining
from cadence.tensorpack.defaults import default_callbacks, default_monitors
from cadence.tensorpack.launch import TrainConfig, launch_train_with_config
from cadence.tensorpack.trainer import (
    ModelDesc,
    SimpleTrainer,
    SingleCostTrainer,
    Trainer,
    cost_from_model,
)

__all__ = [
    "ModelDesc",
    "SimpleTrainer",
    "SingleCostTrainer",
    "StopTraining",
    "TrainConfig",
    "Trainer",
    "cost_from_model",
    "default_callbacks",
    "default_monitors",
    "launch_train_with_config",
]
