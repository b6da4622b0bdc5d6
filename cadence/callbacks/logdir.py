"""Where built-in callbacks write when they are not told: under the trainer's ``logdir``."""

from __future__ import annotations

from pathlib import Path

from cadence.core.callbacks import RunState


def resolve_directory(state: RunState, given: str | Path | None, what: str,
                      subdirectory: str = "") -> Path:
    """`given`, else ``<trainer's logdir>/<subdirectory>``.

    Raises:
        ValueError: when neither is there; the message names the callback `what`.
    """
    if given is not None:
        return Path(given)
    logdir = getattr(state.trainer, "logdir", None)
    if logdir is None:
        raise ValueError(f"{what} needs a directory: pass one, or train with a logdir "
                         "(TrainConfig(logdir=...)).")
    return Path(logdir) / subdirectory
