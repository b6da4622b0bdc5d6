"""The TF Model Garden program of docs/migrating/tf-model-garden.md on cadence: a task, its
config and a registered experiment, run by run_experiment (run it again: it resumes)."""

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
class DigitsTask(cadence.Task):
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


@cadence.register_experiment("digits_mlp")
def digits_mlp():
    """An MLP on scikit-learn's digits (docs/migrating/tf-model-garden.md)."""
    return cadence.ExperimentConfig(
        task=DigitsConfig(
            train_data=cadence.DataConfig(global_batch_size=64, is_training=True),
            validation_data=cadence.DataConfig(global_batch_size=300, is_training=False,
                                               drop_remainder=False)),
        trainer=cadence.TrainerConfig(
            train_steps=1000, steps_per_loop=50, checkpoint_interval=200,
            validation_interval=200, best_checkpoint_export_subdir="best",
            best_checkpoint_eval_metric="accuracy", best_checkpoint_metric_comp="higher",
            optimizer_config=cadence.OptimizationConfig(
                optimizer=cadence.OptimizerConfig(name="adam", learning_rate=1e-3),
                learning_rate=cadence.LearningRateConfig(schedule="constant"))))


def main(model_dir="runs/from_tf_model_garden", train_steps=1000):
    config = cadence.load_config("digits_mlp", overrides=[f"trainer.train_steps={train_steps}"])
    _, eval_logs = cadence.run_experiment(config, "train_and_eval", model_dir)
    return eval_logs


if __name__ == "__main__":
    print(main())
