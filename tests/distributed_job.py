"""Run under torchrun (gloo): every rank trains, checkpoints together, and restores its own RNG."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from fakes import TinyClassifier, make_classification

import cadence


def main() -> None:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)
    x, y = make_classification(32)
    runner = TinyClassifier([(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)])
    controller = cadence.Controller(
        trainer=runner, steps_per_loop=2, summary_dir=str(directory / "train"),
        checkpoint_manager=cadence.CheckpointManager(runner, directory / "ckpt",
                                                     checkpoint_interval=3),
    )
    if mode == "train":
        controller.train(6)
    controller.close()
    torch.save({"step": runner.global_step, "draw": torch.rand(3),
                "rank_env": os.environ["RANK"]}, directory / f"{mode}-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
