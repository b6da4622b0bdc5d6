"""The Orbit program of docs/migrating/orbit.md on cadence: a digits classifier trained and
evaluated by a Controller, with checkpoints (run it again: it resumes) and summaries."""

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cadence


class DigitsRunner(cadence.StandardTrainer, cadence.StandardEvaluator):
    def __init__(self, train_data, valid_data):
        cadence.StandardTrainer.__init__(self, train_data)
        cadence.StandardEvaluator.__init__(self, valid_data)
        self.model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.train_loss = cadence.Mean()
        self.eval_accuracy = cadence.Accuracy()

    def train_loop_begin(self):
        self.model.train()
        self.train_loss.reset()

    def train_step(self, iterator):
        x, y = next(iterator)
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.train_loss.update(loss)  # stays on the device: no sync per step

    def train_loop_end(self):
        return {"loss": self.train_loss.result()}

    def eval_begin(self):
        self.model.eval()
        self.eval_accuracy.reset()

    def eval_step(self, iterator):
        x, y = next(iterator)
        with torch.no_grad():
            self.eval_accuracy.update_state(y, self.model(x))

    def eval_end(self):
        return {"accuracy": self.eval_accuracy.result()}


def main(model_dir="runs/from_orbit", train_steps=1000):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16
    y = torch.tensor(digits.target)
    train_data = DataLoader(TensorDataset(x[:1500], y[:1500]), batch_size=64, shuffle=True)
    valid_data = DataLoader(TensorDataset(x[1500:], y[1500:]), batch_size=300)

    runner = DigitsRunner(train_data, valid_data)
    manager = cadence.CheckpointManager(runner, f"{model_dir}/ckpt", max_to_keep=3,
                                        checkpoint_interval=200)
    controller = cadence.Controller(
        trainer=runner, evaluator=runner, steps_per_loop=50, checkpoint_manager=manager,
        summary_dir=f"{model_dir}/train", eval_summary_dir=f"{model_dir}/eval")
    return controller.train_and_evaluate(train_steps=train_steps, eval_steps=-1,
                                         eval_interval=200)


if __name__ == "__main__":
    print(main())
