"""Where built-in callbacks write when they are not told: in the run's directory."""

from __future__ import annotations

from pathlib import Path

from cadence.core.callbacks import RunState
from cadence.core.run_dir import RunDirectory


def run_directory(state: RunState) -> RunDirectory | None:
    """The run's directory: the front-end's (``state.run_dir``), else the trainer's ``logdir``
    (a runner driven by a plain Controller may set one)."""
    if state.run_dir is not None:
        return state.run_dir
    logdir = state.trainer.logdir if state.trainer is not None else None
    return RunDirectory(logdir) if logdir is not None else None


def resolve_directory(state: RunState, given: str | Path | None, what: str,
                      subdirectory: str = "") -> Path:
    """`given`, else ``<run directory>/<subdirectory>``.

    Raises:
        ValueError: when neither is there; the message names the callback `what`.
    """
    if given is not None:
        return Path(given)
    run = run_directory(state)
    if run is None:
        raise ValueError(f"{what} needs a directory: pass one, or train with a logdir "
                         "(TrainConfig(logdir=...)).")
    return run.subdir(subdirectory) if subdirectory else run.root
