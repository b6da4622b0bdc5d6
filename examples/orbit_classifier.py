"""An Orbit-style program: a StandardTrainer + StandardEvaluator driven by a Controller.

A small MLP learns to classify points drawn from three Gaussian blobs (synthetic, seeded, no
downloads). The Controller trains in loops of `steps_per_loop` steps, writes TensorBoard
summaries (train/ and eval/ runs), checkpoints every `checkpoint_interval` steps and evaluates
every `eval_interval` steps. Run it twice with the same --model-dir and the second run resumes
where the first stopped (or does nothing more, if it finished).

    python examples/orbit_classifier.py --model-dir runs/orbit --train-steps 600
    tensorboard --logdir runs/orbit
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cadence


def make_blobs(n: int, seed: int) -> TensorDataset:
    """Three 2-D Gaussian blobs, one class each."""
    generator = torch.Generator().manual_seed(seed)
    centers = torch.tensor([[0.0, 2.0], [-2.0, -1.0], [2.0, -1.0]])
    labels = torch.randint(0, 3, (n,), generator=generator)
    points = centers[labels] + 0.8 * torch.randn(n, 2, generator=generator)
    return TensorDataset(points, labels)


class BlobClassifier(cadence.StandardTrainer, cadence.StandardEvaluator):
    """One object that trains and evaluates, as in Orbit's single-task example."""

    def __init__(self, train_data: DataLoader, eval_data: DataLoader) -> None:
        cadence.StandardTrainer.__init__(self, train_data)
        cadence.StandardEvaluator.__init__(self, eval_data)
        self.model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.train_loss = cadence.Mean()
        self.eval_loss = cadence.Mean()
        self.eval_accuracy = cadence.Mean()

    def train_loop_begin(self) -> None:
        self.model.train()
        self.train_loss.reset()

    def train_step(self, iterator: Iterator[Any]) -> None:
        points, labels = next(iterator)
        loss = nn.functional.cross_entropy(self.model(points), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.train_loss.update(loss)  # stays on the device: no sync per step

    def train_loop_end(self) -> cadence.Output:
        return {"loss": self.train_loss.result()}

    def eval_begin(self) -> None:
        self.model.eval()
        self.eval_loss.reset()
        self.eval_accuracy.reset()

    def eval_step(self, iterator: Iterator[Any]) -> None:
        points, labels = next(iterator)
        logits = self.model(points)
        self.eval_loss.update(nn.functional.cross_entropy(logits, labels))
        self.eval_accuracy.update((logits.argmax(-1) == labels).float())

    def eval_end(self) -> cadence.Output:
        return {"loss": self.eval_loss.result(), "accuracy": self.eval_accuracy.result()}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=os.path.join("runs", "orbit_classifier"))
    parser.add_argument("--train-steps", type=int, default=600)
    parser.add_argument("--steps-per-loop", type=int, default=50)
    parser.add_argument("--eval-interval", type=int, default=200)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    torch.manual_seed(0)
    train_data = DataLoader(make_blobs(2048, seed=1), batch_size=32, shuffle=True)
    eval_data = DataLoader(make_blobs(512, seed=2), batch_size=128)
    runner = BlobClassifier(train_data, eval_data)
    controller = cadence.Controller(
        trainer=runner,
        evaluator=runner,
        steps_per_loop=args.steps_per_loop,
        checkpoint_manager=cadence.CheckpointManager(
            runner, os.path.join(args.model_dir, "checkpoints"), max_to_keep=3,
            checkpoint_interval=args.eval_interval,
        ),
        summary_dir=os.path.join(args.model_dir, "train"),
        eval_summary_dir=os.path.join(args.model_dir, "eval"),
        callbacks=[cadence.ProgressBar()],  # shown on a terminal only
    )
    result = controller.train_and_evaluate(
        train_steps=args.train_steps, eval_interval=args.eval_interval
    )
    controller.close()
    if result is not None:
        print(f"final eval accuracy: {result['accuracy']:.3f} at step {controller.global_step}")
    return result


if __name__ == "__main__":
    main()
