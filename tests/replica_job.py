"""One replica group of a fault-tolerant job, run under torchrun: the digits experiment with
``runtime.fault_tolerance`` on, its steps paced like a real model's, writing what its model
holds when training ends. While a file ``hold`` exists beside RUN_DIR, its steps wait.

usage: replica_job.py RUN_DIR OUT_PREFIX SECONDS_PER_STEP [OVERRIDE ...]

The mode is ``train``, or the environment's ``REPLICA_JOB_MODE`` (``train_and_eval``).

Writes OUT_PREFIX-g<group>-r<rank>.pt: {"step", "model"} with each tensor of the model's state
as this rank holds it (its local shard under FSDP2), so that the groups compare bit for bit.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

import cadence
from cadence.core.rank import process_rank


class Pace(cadence.Callback):
    """A step that takes `seconds`, as a real model's does (the digits MLP's takes ~1 ms); and
    longer while the file `hold` exists: a test holds the live groups there while a group it
    started again spends its start-up (seconds of imports on a loaded machine), so that they
    are still training when it joins."""

    def __init__(self, seconds: float, hold: Path) -> None:
        self.seconds, self.hold = seconds, hold

    def on_step_end(self, state: cadence.RunState) -> None:
        time.sleep(self.seconds)
        while self.hold.exists():
            time.sleep(0.05)


class Final(cadence.Callback):
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def on_train_end(self, state: cadence.RunState) -> None:
        if state.error is not None or state.trainer is None:
            return
        tensors = {name: (t.to_local() if hasattr(t, "to_local") else t).detach().clone()
                   for name, t in state.trainer.model.state_dict().items()}
        group = os.environ["REPLICA_GROUP_ID"]
        torch.save({"step": state.global_step, "model": tensors},
                   f"{self.prefix}-g{group}-r{process_rank()}.pt")


def main() -> None:
    run, prefix, seconds, *overrides = sys.argv[1:]
    config = cadence.load_config("digits", overrides=[
        "runtime.device=cpu", "runtime.fault_tolerance.enabled=true", *overrides])
    cadence.run_experiment(config, os.environ.get("REPLICA_JOB_MODE", "train"), Path(run),
                           callbacks=[Pace(float(seconds), Path(run).parent / "hold"),
                                      Final(prefix)])


if __name__ == "__main__":
    main()
