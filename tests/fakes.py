"""Shared fakes for the tests: toy runners and tiny data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cadence
from cadence.tensorpack import ModelDesc


class CountingTrainer:
    """A torch-free trainer: each step adds 1 to `global_step` and records it."""

    def __init__(self) -> None:
        self.global_step = 0
        self.loops: list[int] = []

    def train(self, num_steps: int) -> dict[str, Any]:
        self.loops.append(num_steps)
        self.global_step += num_steps
        return {"loss": 1.0 / self.global_step, "nested": {"value": float(num_steps)}}

    def state_dict(self) -> dict[str, Any]:
        return {"global_step": self.global_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = state["global_step"]


class CountingEvaluator:
    """A torch-free evaluator that records the steps at which it ran."""

    def __init__(self, trainer: CountingTrainer) -> None:
        self.trainer = trainer
        self.evaluated_at: list[int] = []

    def evaluate(self, num_steps: int) -> dict[str, Any]:
        self.evaluated_at.append(self.trainer.global_step)
        return {"accuracy": 0.5}


class FakeCheckpointManager:
    """Records saves in memory; implements what the Controller needs."""

    def __init__(self, trainer: CountingTrainer, checkpoint_interval: int | None = None) -> None:
        self.trainer = trainer
        self.checkpoint_interval = checkpoint_interval
        self.saved: dict[int, dict[str, Any]] = {}
        self.tracked: dict[str, Any] = {}

    @property
    def checkpoints(self) -> list[cadence.core.CheckpointInfo]:
        from pathlib import Path

        return [cadence.core.CheckpointInfo(s, Path(f"ckpt-{s}")) for s in sorted(self.saved)]

    def track(self, name: str, obj: Any) -> None:
        self.tracked[name] = obj

    def save(self, step: int) -> str:
        self.saved[step] = {
            "trainer": self.trainer.state_dict(),
            **{k: v.state_dict() for k, v in self.tracked.items()},
        }
        return f"ckpt-{step}"

    def restore(self, path: str) -> int:
        step = int(str(path).rsplit("-", 1)[1])
        saved = self.saved[step]
        self.trainer.load_state_dict(saved["trainer"])
        for name, obj in self.tracked.items():
            obj.load_state_dict(saved[name])
        return step

    def restore_or_initialize(self) -> str | None:
        if not self.saved:
            return None
        path = f"ckpt-{max(self.saved)}"
        self.restore(path)
        return path


def make_classification(n: int = 64, features: int = 4, classes: int = 3, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = torch.randint(0, classes, (n,), generator=generator)
    return x, y


class TinyClassifier(cadence.StandardTrainer, cadence.StandardEvaluator):
    """A small MLP with dropout, Adam and a StepLR schedule: everything exact resume must cover."""

    def __init__(self, train_data: Any, eval_data: Any = None, options: Any = None) -> None:
        cadence.StandardTrainer.__init__(self, train_data, options)
        cadence.StandardEvaluator.__init__(self, eval_data if eval_data is not None else [])
        self.model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=7, gamma=0.5)
        self.loss = cadence.Mean()
        self.accuracy = cadence.Mean()
        self.seen: list[torch.Tensor] = []
        self.record_batches = False

    _TRACKING_IGNORED = frozenset({"seen", "record_batches"})

    def train_loop_begin(self) -> None:
        self.model.train()
        self.loss.reset()

    def train_step(self, iterator: Iterator[Any]) -> None:
        x, y = next(iterator)
        if self.record_batches:
            self.seen.append(x)
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.loss.update(loss)

    def train_loop_end(self) -> dict[str, Any]:
        return {"loss": self.loss.result()}

    def eval_begin(self) -> None:
        self.model.eval()
        self.accuracy.reset()

    def eval_step(self, iterator: Iterator[Any]) -> Any:
        x, y = next(iterator)
        return (self.model(x).argmax(-1) == y).float()

    def eval_reduce(self, state: Any = None, step_outputs: Any = None) -> Any:
        self.accuracy.update(step_outputs)
        return state

    def eval_end(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy.result()}


def make_loader(n: int = 64, batch_size: int = 8, shuffle: bool = True,
                generator: torch.Generator | None = None, **kwargs: Any) -> DataLoader:
    x, y = make_classification(n)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle,
                      generator=generator, **kwargs)



class CountingBackend:
    """A ``torch.compile`` backend that runs graphs eagerly and counts compilations and runs."""

    def __init__(self) -> None:
        self.compiles = 0
        self.runs = 0

    def __call__(self, graph: Any, example_inputs: Any) -> Any:
        self.compiles += 1

        def run(*args: Any) -> Any:
            self.runs += 1
            return graph.forward(*args)

        return run


class LinearRegression(ModelDesc):
    """A tensorpack model: one linear layer, its cost the mean squared error."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)

    def build_graph(self, x, y):
        return nn.functional.mse_loss(self.net(torch.as_tensor(x)), torch.as_tensor(y))

    def optimizer(self):
        return torch.optim.SGD(self.parameters(), lr=0.02)


USER_MODELS = '''"""A user's own experiments: `cadence train -e {module}:NAME`."""

from __future__ import annotations  # string annotations: dataclasses look the module up

from dataclasses import dataclass

import torch
from torch import nn

import cadence


@dataclass
class BlobsConfig(cadence.TaskConfig):
    hidden: int = 8


@cadence.register_task(BlobsConfig)
class Blobs(cadence.Task):
    def build_model(self):
        return nn.Sequential(nn.Linear(2, self.task_config.hidden), nn.ReLU(),
                             nn.Linear(self.task_config.hidden, 3))

    def build_inputs(self, params, input_context=None):
        seed = 0 if params.is_training else 1
        x = torch.randn(64, 2, generator=torch.Generator().manual_seed(seed))
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        return cadence.build_dataloader(torch.utils.data.TensorDataset(x, y), params,
                                        input_context)

    def build_losses(self, labels, model_outputs, aux_losses=None):
        return nn.functional.cross_entropy(model_outputs, labels)

    def build_metrics(self, training=True):
        return {{"accuracy": cadence.Accuracy()}}


@cadence.register_experiment("{experiment}")
def make_config():
    """Blobs in a few steps."""
    return cadence.ExperimentConfig(task=BlobsConfig(), trainer=cadence.TrainerConfig(
        train_steps=4, steps_per_loop=2, validation_interval=2, checkpoint_interval=2,
        best_checkpoint_eval_metric="accuracy"))


def wide():
    """Not registered: a function that returns a config is an experiment too."""
    config = make_config()
    config.task.hidden = 16
    return config


def with_hidden(hidden):
    return make_config()


def not_a_config():
    return {{"trainer": {{"train_steps": 4}}}}


A_CONFIG = make_config()
STEPS = 4
'''
"""The source of a user's module of experiments (`cadence.task.module_experiments`), with its
module and registered experiment names to fill in: `Blobs` trains in a few steps on CPU."""
