"""Models users already have (tests/user_models.py), trained one after another in every process
of a torchrun job (or alone).

usage: user_model_job.py OUT_DIR SPEC [SPEC ...]

Each SPEC is ``task:EXPERIMENT:STRATEGY[:SETTING,...]`` -- `run_experiment` of that experiment in
OUT_DIR/EXPERIMENT-STRATEGY, recording the whole model where training ends in
OUT_DIR/EXPERIMENT-STRATEGY-end.pt (tests/real_model_job.py's `Capture`) -- or
``runner:FAMILY:STRATEGY`` -- a `HubRunner` (a StandardTrainer of one's own) driven by a
Controller in OUT_DIR/runner-FAMILY-STRATEGY, its model's whole weights saved by rank 0 in
OUT_DIR/runner-FAMILY-STRATEGY-end.pt. Each process logs what cadence said to
OUT_DIR/log-<rank>.txt.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch
import user_models
from real_model_job import Capture
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import cadence
from cadence.core.rank import process_rank


def run_task(out: Path, experiment: str, strategy: str, settings: list[str]) -> None:
    name = f"{experiment}-{strategy}"
    config = cadence.load_config(experiment, overrides=[f"runtime.strategy={strategy}",
                                                        *settings])
    cadence.run_experiment(config, "train_and_eval", out / name,
                           callbacks=[Capture(str(out / name))])


def run_runner(out: Path, family: str, strategy: str) -> None:
    name = f"runner-{family}-{strategy}"
    options = cadence.ParallelOptions(activation_checkpointing=True)
    runner = user_models.train_runner(family, strategy, out / name, steps=4, eval_interval=4,
                                      options=options)
    state = get_model_state_dict(runner.model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))  # a collective under FSDP2
    if process_rank() == 0:
        torch.save({"step": runner.global_step, "model": state}, out / f"{name}-end.pt")


def main() -> None:
    out, *specs = sys.argv[1:]
    logging.getLogger("cadence").addHandler(
        logging.FileHandler(Path(out) / f"log-{process_rank()}.txt"))
    logging.getLogger("cadence").setLevel(logging.INFO)
    for spec in specs:
        kind, name, strategy, *rest = spec.split(":")
        if kind == "task":
            run_task(Path(out), name, strategy, rest[0].split(",") if rest else [])
        else:
            run_runner(Path(out), name, strategy)


if __name__ == "__main__":
    main()
