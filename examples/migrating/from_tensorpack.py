"""The tensorpack program of docs/migrating/tensorpack.md on cadence: a ModelDesc trained for
epochs by launch_train_with_config, with a saver, validation and the best model kept (run it
again: it resumes from the logdir)."""

import torch
from sklearn.datasets import load_digits
from torch import nn

import cadence
from cadence.callbacks import InferenceRunner, MaxSaver, ModelSaver


class Model(cadence.ModelDesc):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def build_graph(self, image, label):
        return nn.functional.cross_entropy(self.net(image), label)

    def optimizer(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def infer(model, batch):
    image, label = batch
    logits = model.net(image)
    return {"cross_entropy_loss": nn.functional.cross_entropy(logits, label),
            "accuracy": (logits.argmax(-1) == label).float().mean()}


def main(logdir="runs/from_tensorpack", max_epoch=40):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16
    y = torch.tensor(digits.target)
    train = cadence.DataFlow.arrays([x[:1500], y[:1500]], batch_size=64, shuffle=True)
    valid = cadence.DataFlow.arrays([x[1500:], y[1500:]], batch_size=300)
    validation = InferenceRunner(valid, infer, names=["cross_entropy_loss", "accuracy"])
    # ModelSaver last: a checkpoint holds the callbacks' state as it is when it is saved, so
    # this epoch's validation results are in it (a finished run run again returns them).
    config = cadence.TrainConfig(
        model=Model(), dataflow=train, max_epoch=max_epoch, logdir=logdir,
        callbacks=[validation, MaxSaver("validation_accuracy"), ModelSaver(max_to_keep=3)])
    cadence.launch_train_with_config(config, cadence.SimpleTrainer())
    return validation.last_results


if __name__ == "__main__":
    print(main())
