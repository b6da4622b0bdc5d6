"""Which weights an evaluation of a run reads: its newest checkpoint, its best export, or a path.

``cadence eval --checkpoint best|latest|PATH`` and ``run_experiment(..., checkpoint=...)``:

- ``latest`` (the default): the run's newest good checkpoint, as an evaluation job reads it.
- ``best``: the run's best export (``best/``, the weights that ranked first by
  ``trainer.best_checkpoint_metric``), at the step it was exported.
- a path: a checkpoint (``ckpt-<step>``; its model, step and EMA weights are restored), a
  best-export directory, or a ``.safetensors`` file (its weights; its step where it says it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cadence.core.errors import ConfigError
from cadence.core.run_dir import RunDirectory
from cadence.engine.exporter import LEDGER_FILE

LATEST = "latest"
BEST = "best"


def chosen_weights(choice: str | None, run: RunDirectory) -> Path | None:
    """The weights `choice` names for an evaluation of `run`; None for the newest checkpoint
    (``latest``, or no choice), which the checkpoint manager restores.

    Raises:
        ConfigError: when there is nothing there to evaluate, saying what to pass instead.
    """
    if choice is None or choice == LATEST:
        return None
    if choice == BEST:
        if not (run.best / LEDGER_FILE).is_file():
            raise ConfigError(
                f"{str(run.root)!r} has no best export ({str(run.best)!r} holds none): a run "
                "exports its best weights when it evaluates during training with "
                "trainer.best_checkpoint_metric set. Pass --checkpoint latest or a path.")
        return run.best
    path = Path(choice)
    if not path.exists():
        raise ConfigError(f"--checkpoint {choice!r} does not exist: pass best, latest, a "
                          "checkpoint (ckpt-<step>), a best-export directory or a .safetensors "
                          "file.")
    return path


def _export_step(path: Path) -> int | None:
    """The step of the weights a best-export directory or a ``.safetensors`` file holds."""
    if path.is_dir():
        try:
            ledger = json.loads((path / LEDGER_FILE).read_text(encoding="utf-8"))
            return int(ledger["exports"][0]["step"])  # best first
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return None
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as opened:
            step = (opened.metadata() or {}).get("step")
    except (SafetensorError, OSError):
        return None
    return int(step) if step is not None and step.isdigit() else None


def load_chosen(path: Path, state: dict[str, Any], trainer: Any) -> int:
    """Loads the weights at `path` (`chosen_weights`) into an evaluation's `state` (its
    ``model``, ``progress`` and ``ema``) and sets the trainer's step to theirs; returns it.

    Raises:
        CheckpointError: if `path` holds no weights or is damaged.
        CheckpointMismatchError: if they do not fit the model.
    """
    from cadence.engine.checkpoint import CheckpointManager
    from cadence.engine.exporter import load_weights

    if (path / "manifest.json").is_file():  # a whole checkpoint: the model, step and EMA
        return CheckpointManager(state, path.parent, read_only=True, strict=False).restore(path)
    load_weights(trainer.model, path)
    step = _export_step(path)
    if step is not None:
        trainer.global_step = step
    return int(trainer.global_step)
