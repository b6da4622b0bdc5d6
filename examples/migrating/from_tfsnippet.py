"""The tfsnippet program of docs/migrating/tfsnippet.md on cadence: a loop written by hand
with TrainLoop (logs, summaries, checkpoints, early stopping; run it again: it resumes)."""

import torch
from sklearn.datasets import load_digits
from torch import nn

import cadence


def main(model_dir="runs/from_tfsnippet", max_epoch=40):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16
    y = torch.tensor(digits.target)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_flow = cadence.DataFlow.arrays([x[:1500], y[:1500]], batch_size=64, shuffle=True,
                                         skip_incomplete=True)

    with cadence.TrainLoop(model, max_epoch=max_epoch, early_stopping=True,
                           valid_metric_name="valid_acc",
                           checkpoint_dir=f"{model_dir}/checkpoints", checkpoint_epoch_freq=1,
                           checkpoint_save_objects={"optimizer": optimizer},
                           summary_dir=f"{model_dir}/summaries") as loop:
        loop.print_training_summary()
        for _ in loop.iter_epochs():
            for _, (batch_x, batch_y) in loop.iter_steps(train_flow):
                loss = nn.functional.cross_entropy(model(batch_x), batch_y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                loop.collect_metrics(loss=loss)  # a tensor: read once, when printed
            with loop.timeit("valid_time"), torch.no_grad():
                logits = model(x[1500:])
                valid_loss = nn.functional.cross_entropy(logits, y[1500:])
                valid_acc = (logits.argmax(-1) == y[1500:]).float().mean()
            loop.collect_metrics(valid_loss=valid_loss, valid_acc=valid_acc)
            loop.print_logs()
    return loop.best_valid_metric


if __name__ == "__main__":
    print(main())
