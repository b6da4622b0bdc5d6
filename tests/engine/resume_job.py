"""A training program for the exact-resume tests: run it, kill it, run it again.

It trains `TinyClassifier` (dropout, Adam, StepLR) on a shuffled DataLoader under a Controller
with frequent checkpoints, and on reaching the target writes the final model and optimizer state
to --out. With --pause-in-write, every checkpoint write prints WRITING and sleeps half-way, so a
test can kill it in the middle of a write. With --device cuda it trains on the GPU (batches
prefetched there, dropout drawing from the CUDA generator, deterministic algorithms).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent))

from fakes import TinyClassifier, make_loader

import cadence


class PausingIO(cadence.StateFileIO):
    def save(self, payload, directory):
        digests = super().save(payload, directory)
        print("WRITING", flush=True)
        time.sleep(0.5)
        return digests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out")
    parser.add_argument("--generator", action="store_true")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--pause-in-write", action="store_true")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(7) if args.generator else None
    options = None
    if args.device != "cpu":  # CUBLAS_WORKSPACE_CONFIG comes from the test's environment
        torch.use_deterministic_algorithms(True)
        options = cadence.StandardTrainerOptions(prefetch_to_device=args.device)
    runner = TinyClassifier(make_loader(n=64, batch_size=8, generator=generator), options=options)
    runner.model.to(args.device)  # in place: the optimizer keeps the same parameters
    if args.step_sleep:
        step = runner.train_step

        def slow_step(iterator):
            time.sleep(args.step_sleep)
            return step(iterator)

        runner.train_step = slow_step
    manager = cadence.CheckpointManager(
        runner, args.dir, max_to_keep=2, checkpoint_interval=2,
        io=PausingIO() if args.pause_in_write else None,
    )
    controller = cadence.Controller(trainer=runner, steps_per_loop=3, checkpoint_manager=manager)
    print(f"START {runner.global_step}", flush=True)
    controller.train(args.steps)
    if args.out:
        torch.save({"model": runner.model.state_dict(),
                    "optimizer": runner.optimizer.state_dict(),
                    "scheduler": runner.scheduler.state_dict(),
                    "epoch": runner.epoch}, args.out)


if __name__ == "__main__":
    main()
