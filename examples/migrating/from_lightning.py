"""The Lightning program of docs/migrating/lightning.md on cadence: a Task run by
run_experiment, validated every 200 steps, the best weights kept (run it again: it resumes)."""

from dataclasses import dataclass

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import cadence


@dataclass
class DigitsConfig(cadence.TaskConfig):
    hidden: int = 64


@cadence.register_task(DigitsConfig)
class DigitsClassifier(cadence.Task):
    def build_model(self):
        hidden = self.task_config.hidden
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def build_inputs(self, params, input_context=None):
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16
        y = torch.tensor(digits.target)
        part = slice(0, 1500) if params.is_training else slice(1500, None)
        return cadence.build_dataloader(TensorDataset(x[part], y[part]), params, input_context)

    def build_losses(self, labels, model_outputs, aux_losses=None):
        return nn.functional.cross_entropy(model_outputs, labels)

    def build_metrics(self, training=True):
        return {"accuracy": cadence.Accuracy()}


def main(model_dir="runs/from_lightning", train_steps=1000):
    config = cadence.load_config(cadence.ExperimentConfig(task=DigitsConfig()), overrides=[
        "task.train_data.global_batch_size=64", "task.validation_data.global_batch_size=300",
        "task.validation_data.drop_remainder=false",
        f"trainer.train_steps={train_steps}", "trainer.validation_interval=200",
        "trainer.checkpoint_interval=200", "trainer.best_checkpoint_eval_metric=accuracy",
        "trainer.optimizer_config.optimizer.name=adam",
        "trainer.optimizer_config.optimizer.learning_rate=1e-3"])
    _, eval_logs = cadence.run_experiment(config, "train_and_eval", model_dir)
    return eval_logs


if __name__ == "__main__":
    print(main())
