"""A hand-written loop with `cadence.TrainLoop` (tfsnippet's style, seed 004).

Trains an MLP on scikit-learn's bundled digits with a `DataFlow` over in-memory arrays, prints a
log line per epoch (mean ± std of the loss, validation metrics, times, ETA, a (*) on a new best),
writes TensorBoard summaries, checkpoints every epoch and restores the best parameters at the
end (early stopping). Run it again and it resumes from the last checkpoint.

    python examples/train_loop_digits.py --model-dir runs/train_loop
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

import cadence
from cadence.task.experiments.digits import load_digits_arrays


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default="runs/train_loop")
    parser.add_argument("--epochs", type=int, default=15)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    images, labels = load_digits_arrays()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    valid, train = order[:360], order[360:]
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    flow = cadence.DataFlow.arrays([images[train], labels[train]], batch_size=64, shuffle=True,
                                   random_state=0)

    with cadence.TrainLoop(model, max_epoch=args.epochs, early_stopping=True,
                           valid_metric_name="valid_acc",  # larger is better, from the name
                           checkpoint_dir=f"{args.model_dir}/checkpoints",
                           checkpoint_epoch_freq=1, checkpoint_max_to_keep=2,
                           checkpoint_save_objects={"optimizer": optimizer},
                           summary_dir=f"{args.model_dir}/summaries") as loop:
        loop.print_training_summary()
        for _ in loop.iter_epochs():
            model.train()
            for _, (x, y) in loop.iter_steps(flow):
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                loop.collect_metrics(loss=loss)  # a tensor: read once, when printed
            with loop.timeit("valid_time"), torch.no_grad():
                model.eval()
                logits = model(images[valid])
                loop.collect_metrics(
                    valid_loss=nn.functional.cross_entropy(logits, labels[valid]),
                    valid_acc=(logits.argmax(-1) == labels[valid]).float().mean())
            loop.print_logs()
    with torch.no_grad():
        model.eval()
        accuracy = float((model(images[valid]).argmax(-1) == labels[valid]).float().mean())
    return {"valid_acc": accuracy, "best_valid_acc": loop.best_valid_metric}


if __name__ == "__main__":
    print(main())
