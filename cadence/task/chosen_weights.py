"""Which weights of a run an evaluation or an export reads: its newest checkpoint, its best
export, or a path -- and, in a checkpoint of a run with an EMA, which of its two sets.

``cadence eval --checkpoint best|latest|PATH``, ``run_experiment(..., checkpoint=...)`` and
``cadence export RUN --checkpoint ...`` name them the same way (`chosen_source`):

- ``latest`` (the default): the run's newest complete checkpoint.
- ``best``: the run's best export (``best/``, the weights that ranked first by
  ``trainer.best_checkpoint_metric``), at the step it was exported.
- a path: a checkpoint (``ckpt-<step>``), a best-export directory, or a ``.safetensors`` file.

A checkpoint of a run with an EMA (``trainer.ema.enabled``) holds two sets of weights: the
trained ones (``model``) and their average (``ema``), which every evaluation of the run uses and
the best export holds. Evaluating or exporting a checkpoint reads what the run evaluates --
the average where there is one (`EVALUATED`) --, and ``cadence export --raw`` the trained
weights (`RAW`). A best export or a ``.safetensors`` file holds one set: it is read as it is,
and never mixed with the average of a freshly built model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cadence.core.checkpoint_dir import CheckpointDirectory
from cadence.core.errors import CheckpointError, ConfigError
from cadence.core.files import plain_name
from cadence.core.run_dir import RunDirectory

LATEST = "latest"
BEST = "best"

EVALUATED = "evaluated"
"""The weights a run evaluates: a checkpoint's EMA average where it holds one, else its model."""
RAW = "raw"
"""A checkpoint's trained weights, without the EMA average."""


def _no_links(root: Path, path: Path) -> None:
    """Refuses `path` when it, or a folder between `root` and it, is a symbolic link: a link in
    a run directory could point anywhere."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return  # a path of the user's own choosing, outside the run
    here = root
    for part in parts:
        here = here / part
        if here.is_symlink():
            raise CheckpointError(f"{str(here)!r} is a symbolic link: cadence does not read "
                                  "through links in a run directory (one could point anywhere).")


def chosen_source(run: RunDirectory, checkpoint: str | None) -> Path:
    """Where the weights `checkpoint` names are: ``latest`` (or None) the newest complete
    checkpoint of the run, ``best`` the best export its ledger ranks first, else a path (a
    ``ckpt-<step>`` directory, a best-export directory, a ``.safetensors`` file).

    Raises:
        ConfigError: when there is nothing there (no checkpoint, no best export, no such
            path), saying what to pass instead.
        CheckpointError: when the export ledger is damaged or names a folder that is not its
            own, or the path goes through a link inside the run.
    """
    from cadence.engine.exporter import LEDGER_FILE

    root = run.root
    if checkpoint is None or checkpoint == LATEST:
        _no_links(root, run.checkpoints)
        latest = CheckpointDirectory(run.checkpoints, None).latest()
        if latest is None:
            raise ConfigError(f"{str(root)!r} holds no complete checkpoint (in "
                              f"{str(run.checkpoints)!r}): pass --checkpoint best or a path.")
        source = latest.path
    elif checkpoint == BEST:
        ledger = run.best / LEDGER_FILE
        _no_links(root, ledger)
        try:
            entries = json.loads(ledger.read_text(encoding="utf-8"))["exports"]
            name = entries[0]["path"]
        except FileNotFoundError:
            raise ConfigError(
                f"{str(root)!r} has no best export ({str(run.best)!r} holds none): a run "
                "exports its best weights when it evaluates during training with "
                "trainer.best_checkpoint_eval_metric set. Pass --checkpoint latest or a "
                "path.") from None
        except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
            raise CheckpointError(f"The export ledger {str(ledger)!r} is damaged "
                                  f"({type(error).__name__}: {error}): pass --checkpoint "
                                  "latest or a path.") from None
        if not plain_name(name):
            raise CheckpointError(f"The export ledger {str(ledger)!r} names {name!r}, which is "
                                  "not a folder of its own: it is not read.")
        source = run.best / name
    else:
        source = Path(checkpoint)
        if not source.exists():
            raise ConfigError(f"--checkpoint {checkpoint!r} does not exist: pass best, latest, "
                              "a checkpoint (ckpt-<step>), a best-export directory or a "
                              ".safetensors file.")
    _no_links(root, source)
    if source.is_dir():
        for name in ("manifest.json", "model.safetensors"):
            _no_links(root, source / name)
    return source


def chosen_weights(choice: str | None, run: RunDirectory) -> Path | None:
    """The weights `choice` names for an evaluation of `run`; None for the newest checkpoint
    (``latest``, or no choice), which the checkpoint manager restores -- moving past a damaged
    one to the newest good one.

    Raises:
        ConfigError: when there is nothing there to evaluate, saying what to pass instead.
        CheckpointError: see `chosen_source`.
    """
    if choice is None or choice == LATEST:
        return None
    return chosen_source(run, choice)


def is_checkpoint(path: Path) -> bool:
    """Whether `path` is a whole cadence checkpoint (``ckpt-<step>``), not a set of weights."""
    return (path / "manifest.json").is_file()


def weights_step(path: Path) -> int | None:
    """The training step of the weights at `path`: a checkpoint's (its manifest), the best
    export's of a best-export directory (its ledger), a ``.safetensors`` file's where its
    metadata says; None where nothing says."""
    from cadence.engine.exporter import LEDGER_FILE, WEIGHTS_FILE, weights_metadata

    if is_checkpoint(path):
        from cadence.core.checkpoint_dir import read_manifest

        return int(read_manifest(path, sizes_of=())["step"])
    if path.is_dir() and (path / LEDGER_FILE).is_file():  # the best/ folder: its best
        try:
            ledger = json.loads((path / LEDGER_FILE).read_text(encoding="utf-8"))
            return int(ledger["exports"][0]["step"])  # best first
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return None
    step = weights_metadata(path / WEIGHTS_FILE if path.is_dir() else path).get("step")
    return int(step) if step is not None and step.isdigit() else None


def load_chosen(path: Path, state: dict[str, Any], trainer: Any) -> int:
    """Loads the weights at `path` (`chosen_weights`) into an evaluation's `state` (its
    ``model``, ``progress`` and ``ema``) and sets the trainer's step to theirs; returns it.

    A checkpoint restores the model, the step and the EMA average it holds. A best export or a
    ``.safetensors`` file holds one set of weights, the ones evaluated: they go into the model
    and, with an EMA, into its average too, which the evaluation reads.

    Raises:
        CheckpointError: if `path` holds no weights or is damaged.
        CheckpointMismatchError: if they do not fit the model.
    """
    from cadence.engine.checkpoint import CheckpointManager
    from cadence.engine.exporter import load_weights

    if is_checkpoint(path):  # a whole checkpoint: the model, step and EMA
        return CheckpointManager(state, path.parent, read_only=True, strict=False).restore(path)
    load_weights(trainer.model, path)
    if trainer.ema is not None:
        trainer.ema.reset()  # the average is the weights loaded: nothing else is evaluated
    step = weights_step(path)
    if step is not None:
        trainer.global_step = step
    return int(trainer.global_step)
