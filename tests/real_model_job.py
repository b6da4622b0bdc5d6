"""A registered experiment trained by `run_experiment` in every process of a torchrun job (or
alone), recording the whole model and optimizer state where training begins (after the restore)
and where it ends -- gathered from every rank's shards, so that states written and read at
different world sizes compare exactly.

usage: real_model_job.py EXPERIMENT RUN_DIR STEPS OUT_PREFIX [OVERRIDE ...]

EXPERIMENT may also be ``user_moe`` (tests/user_moe.py, a user's model). With the environment
variable POISON=STEP:RANK:PARAMETER, that rank writes a NaN into its shard of that parameter
after step STEP (a NaN gradient on one rank, as a checkpoint is about to be saved).

Writes OUT_PREFIX-begin.pt and OUT_PREFIX-end.pt ({"step", "model", "optimizer"}, rank 0)
and OUT_PREFIX-log-<rank>.txt (what cadence logged on that rank).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
import user_moe  # noqa: F401 -- registers a user's experiment, as a user's module would
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

import cadence
from cadence.core.rank import process_rank


def full_state(trainer: Any) -> dict[str, Any]:
    """The trainer's model and optimizer state, whole, on every rank (a collective under FSDP2)
    -- of a pipeline, on rank 0, every stage's merged. The optimizer's state is keyed by
    parameter name, so that it compares across shardings and stages."""
    pipeline = getattr(trainer, "pipeline", None)
    # cpu_offload keeps the gathered state on global rank 0 alone: a later stage's would be lost
    options = StateDictOptions(full_state_dict=True, cpu_offload=pipeline is None)
    model = get_model_state_dict(trainer.model, options=options)
    optimizer = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=options)
    if pipeline is not None:
        from torch.utils._pytree import tree_map

        from cadence.engine.distributed import gather_on_rank_zero

        model, optimizer = tree_map(
            lambda value: value.detach().cpu() if isinstance(value, torch.Tensor) else value,
            (model, optimizer))
        stages = [sent for sent in gather_on_rank_zero(
            (model, optimizer) if pipeline.sends_state else None) if sent]
        model, optimizer = {}, {"state": {}, "param_groups": []}
        for stage_model, stage_optimizer in stages:
            model.update(stage_model)
            optimizer["state"].update(stage_optimizer["state"])
            for index, group in enumerate(stage_optimizer["param_groups"]):
                if index == len(optimizer["param_groups"]):
                    optimizer["param_groups"].append({**group, "params": []})
                merged = optimizer["param_groups"][index]["params"]
                merged.extend(name for name in group["params"] if name not in merged)
    return {"step": trainer.global_step, "model": model, "optimizer": optimizer}


class Capture(cadence.Callback):
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def _save(self, state: cadence.RunState, when: str) -> None:
        captured = full_state(state.trainer)
        if process_rank() == 0:
            torch.save(captured, f"{self.prefix}-{when}.pt")

    def on_train_begin(self, state: cadence.RunState) -> None:
        self._save(state, "begin")

    def on_train_end(self, state: cadence.RunState) -> None:
        self._save(state, "end")


class Poison(cadence.Callback):
    """After step `step`, rank `rank` writes a NaN into its local shard of `parameter`."""

    def __init__(self, spec: str) -> None:
        step, rank, self.parameter = spec.split(":")
        self.step, self.rank = int(step), int(rank)

    def on_step_end(self, state: cadence.RunState) -> None:
        if state.global_step != self.step or process_rank() != self.rank:
            return
        parameter = dict(state.trainer.model.named_parameters())[self.parameter]
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        assert local.numel() > 0, "choose a parameter this rank holds a part of"
        with torch.no_grad():
            local.view(-1)[0] = float("nan")


def count_files_hashed_by_commits(prefix: str) -> None:
    """Counts the files a checkpoint commit reads back to hash, and the files (not folders) it
    fsyncs (rank 0 commits; every digest should have come from the rank that wrote the file,
    which also made it durable): OUT_PREFIX-commit-hashes.txt, OUT_PREFIX-commit-fsyncs.txt."""
    import cadence.core.checkpoint_dir as checkpoint_dir

    hashed: list[str] = []
    synced: list[str] = []
    original_hash = checkpoint_dir.file_sha256
    original_fsync = checkpoint_dir.fsync_path
    original_commit = checkpoint_dir.CheckpointDirectory.commit

    def fsync(path: Path) -> None:
        if path.is_file():
            synced.append(str(path))
        original_fsync(path)

    def commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        checkpoint_dir.file_sha256 = lambda path, *a: hashed.append(str(path)) or original_hash(
            path, *a)
        checkpoint_dir.fsync_path = fsync
        try:
            return original_commit(self, *args, **kwargs)
        finally:
            checkpoint_dir.file_sha256 = original_hash
            checkpoint_dir.fsync_path = original_fsync
            Path(f"{prefix}-commit-hashes.txt").write_text("\n".join(hashed))
            Path(f"{prefix}-commit-fsyncs.txt").write_text("\n".join(synced))

    checkpoint_dir.CheckpointDirectory.commit = commit  # type: ignore[method-assign]


def count_files_hashed_at_restore(prefix: str) -> None:
    """Records the checkpoint files each rank reads back to hash while it restores (not the
    state and rank files it reads, which are hashed as they are read):
    OUT_PREFIX-restore-hashes-<rank>.txt. Each rank should check only what it reads."""
    import cadence.core.checkpoint_dir as checkpoint_dir
    from cadence.engine.checkpoint import CheckpointManager

    original_hash = checkpoint_dir.file_sha256
    original_restore = CheckpointManager.restore

    def restore(self: Any, path: Any) -> int:
        hashed: list[str] = []
        checkpoint_dir.file_sha256 = lambda file, *a: hashed.append(
            str(Path(file).relative_to(path))) or original_hash(file, *a)
        try:
            return original_restore(self, path)
        finally:
            checkpoint_dir.file_sha256 = original_hash
            Path(f"{prefix}-restore-hashes-{process_rank()}.txt").write_text("\n".join(hashed))

    CheckpointManager.restore = restore  # type: ignore[method-assign]


def main() -> None:
    experiment, run, steps, prefix, *overrides = sys.argv[1:]
    count_files_hashed_by_commits(prefix)
    count_files_hashed_at_restore(prefix)
    handler = logging.FileHandler(f"{prefix}-log-{process_rank()}.txt")
    logging.getLogger("cadence").addHandler(handler)
    logging.getLogger("cadence").setLevel(logging.INFO)
    config = cadence.load_config(experiment, overrides=[
        f"trainer.train_steps={steps}", "runtime.device=cpu", *overrides])
    callbacks: list[cadence.Callback] = [Capture(prefix)]
    if os.environ.get("POISON"):
        callbacks.append(Poison(os.environ["POISON"]))
    cadence.run_experiment(config, "train", Path(run), callbacks=callbacks,
                           allow_config_change=True)


if __name__ == "__main__":
    main()
