"""``cadence export``: a run's model, from any of its checkpoints, as one safetensors file.

`export_model` reads the weights a run holds -- its newest checkpoint, its best export, or a
path -- and writes them, whole, as ``<out>/model.safetensors``: plain tensors by the model's own
names, which ``safetensors.torch.load_file`` reads with no cadence installed and
``load_state_dict(strict=True)`` takes. A checkpoint sharded by FSDP2 (DCP's ``sharded/``) is
consolidated in this one process. When the run's model is a transformers ``PreTrainedModel``,
its ``config.json`` is written beside the weights: the folder is one ``from_pretrained`` opens.

Why not DCP's own converters: ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``
unpickles the checkpoint's ``.metadata`` with a plain ``pickle.load`` and writes a pickle, and
DCP's Hugging Face storage writer writes a state dict that is already whole in memory through a
save plan. A run directory is untrusted input, so the shards are read by cadence's restricted
reader (`cadence.engine.dcp_reading`: the metadata through an unpickler that admits DCP's
classes only, each shard file checked against the manifest's SHA-256), and the consolidated
tensors are written with ``safetensors`` directly.

Nothing read from the run runs code (the run's own experiment module aside, imported from its
``params.yaml`` as ``cadence eval -m RUN`` imports it, to build the model's config), no link
inside the run is followed, and nothing outside `out` is written.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadence.core.checkpoint_dir import fsync_path, write_atomically
from cadence.core.errors import CheckpointError, ConfigError
from cadence.core.run_dir import RunDirectory
from cadence.task.chosen_weights import (
    EVALUATED,
    RAW,
    chosen_source,
    is_checkpoint,
    weights_step,
)

logger = logging.getLogger("cadence")

@dataclass(frozen=True)
class ExportedModel:
    """What `export_model` wrote.

    Attributes:
        weights: the safetensors file.
        step: the training step of the weights (None when the source does not say).
        source: where they were read from.
        tensors: how many tensors it holds.
        files: the other files written beside it (``config.json``, ...).
        kind: which weights: ``"model"`` (trained), ``"ema"`` (the EMA average), or None
            where the source does not say.
    """

    weights: Path
    step: int | None
    source: Path
    tensors: int
    files: list[Path] = field(default_factory=list)
    kind: str | None = None

    def summary(self) -> str:
        """What was written, in one line (what ``cadence export`` prints)."""
        step = f"step {self.step}" if self.step is not None else "the weights"
        which = "the EMA weights (what the run evaluates) of " if self.kind == "ema" else ""
        beside = (f"; beside it {', '.join(path.name for path in self.files)}"
                  if self.files else "")
        return (f"Exported {which}{step} of {self.source} ({self.tensors} tensors): "
                f"{self.weights}{beside}")


def _built_model(config: Any) -> Any:
    """The run's model, built from its config without its weights (on the meta device: no
    memory, no initialization), to name and tie the weights as the model does."""
    import torch

    from cadence.task.registry import get_task

    task = get_task(config.task)
    with torch.device("meta"):
        return task.build_model()


def fit_to_model(weights: dict[str, Any], model: Any, source: Path) -> dict[str, Any]:
    """`weights` named as `model`'s state dict names them: a tied weight saved under one name
    only (a DCP checkpoint may keep one of a tie) is written under each, so that
    ``load_state_dict(strict=True)`` takes the file.

    Raises:
        CheckpointError: when the weights are not this model's (names or shapes differ).
    """
    expected = model.state_dict()
    ties: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        ties.setdefault(id(parameter), []).append(name)
    weights = dict(weights)
    for names in ties.values():
        present = [name for name in names if name in weights]
        for name in names:
            if name not in weights and present and name in expected:
                weights[name] = weights[present[0]]
    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected]
    shapes = [name for name, value in expected.items()
              if name in weights and tuple(weights[name].shape) != tuple(value.shape)]
    if missing or unexpected or shapes:
        problems = [f"{len(missing)} missing ({', '.join(missing[:3])})" if missing else "",
                    f"{len(unexpected)} unexpected ({', '.join(unexpected[:3])})"
                    if unexpected else "",
                    f"{len(shapes)} of another shape ({', '.join(shapes[:3])})" if shapes else ""]
        raise CheckpointError(
            f"The weights in {str(source)!r} are not those of the run's model "
            f"{type(model).__name__}: {'; '.join(p for p in problems if p)}. Pass a checkpoint "
            "of this run.")
    return {name: weights[name] for name in expected}


MODEL_CONFIG_FILES = ("config.json", "generation_config.json")
"""The files a best export keeps beside the weights of a transformers model."""
_MAX_CONFIG_BYTES = 1 << 20


def saved_config_files(run: RunDirectory, source: Path) -> dict[str, str]:
    """The ``config.json`` (and ``generation_config.json``) a best export of the run keeps
    beside its weights -- the chosen export's own, else the best export's -- for a run whose
    model cannot be built here (its task lives in a script). Read as untrusted input: no link
    followed, each file JSON of at most 1 MiB; anything else is left out."""
    from cadence.engine.exporter import LEDGER_FILE

    folders = [source] if source.is_dir() and not is_checkpoint(source) else []
    try:
        ledger = json.loads((run.best / LEDGER_FILE).read_text(encoding="utf-8"))
        folders += [run.best / str(entry["path"]) for entry in ledger["exports"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for folder in folders:
        files: dict[str, str] = {}
        for name in MODEL_CONFIG_FILES:
            path = folder / name
            try:
                if path.is_symlink() or not path.is_file() or (
                        path.stat().st_size > _MAX_CONFIG_BYTES):
                    continue
                text = path.read_text(encoding="utf-8")
                json.loads(text)
            except (OSError, ValueError):
                continue
            files[name] = text
        if "config.json" in files:
            return files
    return {}


def export_model(run_dir: str | os.PathLike[str], out: str | os.PathLike[str],
                 checkpoint: str | None = None, config: Any = None,
                 weights: str = EVALUATED) -> ExportedModel:
    """Writes the model of a run's checkpoint as ``<out>/model.safetensors``.

    Args:
        run_dir: the run directory.
        out: the folder to write into (created if needed; its ``model.safetensors`` and
            ``config.json`` are replaced atomically).
        checkpoint: ``latest`` (default), ``best``, or a path (see `chosen_source`).
        config: the run's `ExperimentConfig` (its ``params.yaml``), or None. With it, the
            model is built (without weights) to check the weights' names and shapes, write
            each tied weight under every name the model gives it, and, for a transformers
            ``PreTrainedModel``, write its ``config.json``. Without it, the ``config.json`` a
            best export of the run keeps is written (`saved_config_files`).
        weights: ``"evaluated"`` (default): what the run evaluates -- a checkpoint's EMA
            average where it holds one, else its trained weights; ``"raw"``: a checkpoint's
            trained weights. A best export or a ``.safetensors`` file holds one set.

    Returns:
        What was written (`ExportedModel.kind` says which weights).

    Raises:
        ConfigError: if `out` is a file, `run_dir` is not a directory, `weights` is neither
            choice, or the chosen weights are missing (no checkpoint, no best export).
        CheckpointError: if the weights are damaged, not a checkpoint, or not the run's
            model's; for ``"raw"``, an export that holds the EMA average alone.
    """
    from cadence.engine.exporter import (
        EMA,
        MODEL,
        WEIGHTS_FILE,
        model_config_files,
        read_weight_set,
        save_weights,
    )

    run_path, out = Path(run_dir), Path(out)
    if not run_path.is_dir():
        raise ConfigError(f"{str(run_path)!r} is not a directory: pass the directory of a run, "
                          "e.g. runs/<experiment>-<time>.")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file: pass a folder for model.safetensors "
                          "(it is created if it does not exist).")
    if weights not in (EVALUATED, RAW):
        raise ConfigError(f"`weights` (got {weights!r}) must be {EVALUATED!r} (what the run "
                          f"evaluates: the EMA average where there is one) or {RAW!r}.")
    run = RunDirectory(run_path)
    if config is not None:
        from cadence.task.train_lib import run_directory

        run = run_directory(config, run_path)
    source = chosen_source(run, checkpoint)
    found = read_weight_set(source, EVALUATED if weights == EVALUATED else MODEL)
    tensors, step = found.tensors, weights_step(source)
    if weights == RAW and found.kind == EMA:
        raise CheckpointError(
            f"{str(found.location)!r} holds the EMA average alone (what the run evaluated), "
            "not the trained weights: pass the checkpoint of its step with --raw (--checkpoint "
            f"{run.checkpoints / f'ckpt-{step}' if step is not None else 'ckpt-<step>'}).")
    if config is not None:
        model = _built_model(config)
        tensors = fit_to_model(tensors, model, source)
        files = model_config_files(model)
    else:
        files = saved_config_files(run, source)
    out.mkdir(parents=True, exist_ok=True)
    target = out / WEIGHTS_FILE
    temp = out / f".tmp-{WEIGHTS_FILE}"
    metadata = {"source": str(source)}
    if step is not None:
        metadata["step"] = str(step)
    if found.kind is not None:
        metadata["weights"] = found.kind
    try:
        save_weights(tensors, temp, metadata)
        fsync_path(temp)
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
    written = [write_atomically(out / name, text) for name, text in files.items()]
    logger.debug("Exported %d tensors of %s to %s.", len(tensors), source, target)
    return ExportedModel(target, step, source, len(tensors), written, found.kind)
