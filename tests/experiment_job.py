"""Run under torchrun (gloo): the digits experiment trained data-parallel by run_experiment."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import cadence


def main() -> None:
    directory = Path(sys.argv[1])
    # On the CPU, with gloo (as every multi-process test): with CUDA visible, "auto" would put
    # every rank on cuda:0 -- one device per rank (LOCAL_RANK) is the distributed runtime's job.
    config = cadence.load_config("digits", overrides=[
        "trainer.train_steps=40", "trainer.steps_per_loop=10", "trainer.checkpoint_interval=20",
        "trainer.validation_interval=20", "task.model.hidden_sizes=[32]", "runtime.device=cpu"])
    model, logs = cadence.run_experiment(config, "train_and_eval", directory / "run")
    rank = dist.get_rank()
    if rank == 0:  # the same weights evaluated on the whole validation set in one process
        from cadence.task.experiments.digits import DigitsTask

        images, labels = DigitsTask(config.task)._split("validation").tensors
        model.eval()
        with torch.no_grad():
            logs["single_process_accuracy"] = float(
                (model(images).argmax(-1) == labels).float().mean())
    torch.save(model.state_dict(), directory / f"weights-{rank}.pt")
    (directory / f"logs-{rank}.json").write_text(json.dumps(logs))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
