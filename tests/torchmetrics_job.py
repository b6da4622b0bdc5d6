"""Run under torchrun (gloo): torchmetrics' metrics across ranks, gathered by their own compute().

    torchmetrics_job.py DIR

- the Task `Trainer` (DDP): a training loop's and an evaluation's metrics on every rank, and --
  on rank 0 -- the same metrics computed by torchmetrics in one process over the whole data with
  the trained weights;
- a `TrainLoop`: each rank updates with its shard and the print reads the metric of all of it;
  run straight, and stopped by an exception after a checkpoint in mid-epoch and resumed (each
  rank's own states come back from its rank file).

Every rank writes its results to DIR/metrics-<rank>.json.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torchmetrics
from torch import nn
from torch.utils.data import TensorDataset
from torchmetrics.classification import MulticlassAccuracy, MulticlassAUROC

import cadence
from cadence.data.sharding import build_dataloader
from cadence.engine.runtime import init_distributed
from cadence.task.config import TaskConfig
from cadence.task.config_files import load_config

generator = torch.Generator().manual_seed(0)
X = torch.randn(64, 4, generator=generator)
Y = torch.randint(0, 3, (64,), generator=generator)


def metrics(**kwargs) -> dict[str, object]:
    return {"micro": MulticlassAccuracy(num_classes=3, average="micro", **kwargs),
            "macro": MulticlassAccuracy(num_classes=3, average="macro", **kwargs),  # per class
            "curves": torchmetrics.MetricCollection(  # list states, concatenated across ranks
                {"auroc": MulticlassAUROC(num_classes=3, thresholds=None, **kwargs)}),
            "cadence": cadence.Accuracy()}


def host(logs: dict) -> dict:
    return {key: host(value) if isinstance(value, dict) else float(value)
            for key, value in logs.items()}


class Classify(cadence.Task):
    def build_model(self):
        return nn.Linear(4, 3)

    def build_inputs(self, params, input_context=None):
        return build_dataloader(TensorDataset(X, Y), params, input_context)

    def build_losses(self, labels, model_outputs, aux_losses=None):
        return nn.functional.cross_entropy(model_outputs, labels)

    def build_metrics(self, training=True):
        return metrics()


def trainer_results() -> dict:
    config = load_config(cadence.ExperimentConfig(), overrides=[
        "trainer.train_steps=100", "runtime.device=cpu",
        "task.train_data.global_batch_size=16", "task.train_data.is_training=true",
        "task.validation_data.global_batch_size=16", "task.validation_data.is_training=false",
        "task.validation_data.drop_remainder=false"])
    task = Classify(TaskConfig())
    torch.manual_seed(0)
    model = task.build_model()
    trainer = cadence.Trainer(config, task, model, torch.optim.SGD(model.parameters(), lr=0.5))
    train = host(trainer.train(4))  # 4 steps of 8 examples a rank: each example once
    evaluated = host(trainer.evaluate(-1))
    results = {"train": train, "eval": evaluated}
    if dist.get_rank() == 0:  # one process, all the data, the trained weights
        single = {key: value for key, value in metrics(sync_on_compute=False).items()
                  if key != "cadence"}
        with torch.no_grad():
            outputs = trainer.model(X)
        for metric in single.values():
            metric.update(outputs, Y)
        results["single"] = host({key: metric.compute() for key, metric in single.items()})
    return results


class Interrupt(Exception):
    pass


def train_loop(directory: Path, stop_at: int | None = None) -> list[dict]:
    """Two epochs over this rank's half of the data, the accuracy printed per epoch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    ddp = nn.parallel.DistributedDataParallel(model)
    metric = MulticlassAccuracy(num_classes=3, average="macro")
    printed: list[dict] = []

    class Printed(cadence.Callback):
        def on_loop_end(self, state, logs):
            printed.append({k: v for k, v in logs.items() if not k.endswith("time")})

    shard = [(X[i:i + 8][rank::world], Y[i:i + 8][rank::world]) for i in range(0, 64, 8)]
    with cadence.TrainLoop(model, max_epoch=2, checkpoint_dir=directory, print_func=str,
                           checkpoint_save_objects={"optimizer": optimizer, "metric": metric},
                           callbacks=[Printed()]) as loop:
        for _ in loop.iter_epochs():
            for step, (x, y) in loop.iter_steps(shard):
                outputs = ddp(x)
                optimizer.zero_grad()
                nn.functional.cross_entropy(outputs, y).backward()
                optimizer.step()
                metric.update(outputs.detach(), y)
                loop.collect_metrics(accuracy=metric)
                if step == stop_at:
                    loop.make_checkpoint()
                    raise Interrupt
            loop.print_logs()
    return printed


def main() -> None:
    directory = Path(sys.argv[1])
    init_distributed()
    results = trainer_results()
    results["loop_straight"] = train_loop(directory / "straight")
    with contextlib.suppress(Interrupt):
        train_loop(directory / "resumed", stop_at=3)  # in epoch 1 (8 steps an epoch)
    results["loop_resumed"] = train_loop(directory / "resumed")
    (directory / f"metrics-{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
