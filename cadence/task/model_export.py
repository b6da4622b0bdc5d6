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
from cadence.core.files import plain_name
from cadence.core.run_dir import RunDirectory

logger = logging.getLogger("cadence")

LATEST = "latest"
BEST = "best"


@dataclass(frozen=True)
class ExportedModel:
    """What `export_model` wrote.

    Attributes:
        weights: the safetensors file.
        step: the training step of the weights (None when the source does not say).
        source: where they were read from.
        tensors: how many tensors it holds.
        files: the other files written beside it (``config.json``, ...).
    """

    weights: Path
    step: int | None
    source: Path
    tensors: int
    files: list[Path] = field(default_factory=list)

    def summary(self) -> str:
        """What was written, in one line (what ``cadence export`` prints)."""
        step = f"step {self.step}" if self.step is not None else "the weights"
        beside = (f"; beside it {', '.join(path.name for path in self.files)}"
                  if self.files else "")
        return f"Exported {step} of {self.source} ({self.tensors} tensors): {self.weights}{beside}"


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
        CheckpointError: when there is nothing there, or the path goes through a link.
    """
    from cadence.core.checkpoint_dir import CheckpointDirectory
    from cadence.engine.exporter import LEDGER_FILE

    root = run.root
    if checkpoint is None or checkpoint == LATEST:
        _no_links(root, run.checkpoints)
        latest = CheckpointDirectory(run.checkpoints, None).latest()
        if latest is None:
            raise CheckpointError(f"{str(root)!r} holds no complete checkpoint (in "
                                  f"{str(run.checkpoints)!r}): pass --checkpoint best or a path.")
        source = latest.path
    elif checkpoint == BEST:
        ledger = run.best / LEDGER_FILE
        _no_links(root, ledger)
        try:
            entries = json.loads(ledger.read_text(encoding="utf-8"))["exports"]
            name = entries[0]["path"]
        except FileNotFoundError:
            raise CheckpointError(f"{str(root)!r} has no best export ({str(ledger)!r} does not "
                                  "exist): pass --checkpoint latest or a path.") from None
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
            raise CheckpointError(f"--checkpoint {checkpoint!r} does not exist: pass best, "
                                  "latest, a checkpoint (ckpt-<step>), a best-export directory "
                                  "or a .safetensors file.")
    _no_links(root, source)
    if source.is_dir():
        for name in ("manifest.json", "model.safetensors"):
            _no_links(root, source / name)
    return source


def _step_of(source: Path) -> int | None:
    """The step of the weights at `source`: a checkpoint's manifest, or an export's metadata."""
    from safetensors import SafetensorError, safe_open

    if (source / "manifest.json").is_file():
        from cadence.core.checkpoint_dir import read_manifest

        return int(read_manifest(source, sizes_of=())["step"])
    weights = source / "model.safetensors" if source.is_dir() else source
    try:
        with safe_open(str(weights), framework="pt") as opened:
            step = (opened.metadata() or {}).get("step")
    except (SafetensorError, OSError):
        return None
    return int(step) if isinstance(step, str) and step.isdigit() else None


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


def export_model(run_dir: str | os.PathLike[str], out: str | os.PathLike[str],
                 checkpoint: str | None = None, config: Any = None) -> ExportedModel:
    """Writes the model of a run's checkpoint as ``<out>/model.safetensors``.

    Args:
        run_dir: the run directory.
        out: the folder to write into (created if needed; its ``model.safetensors`` and
            ``config.json`` are replaced atomically).
        checkpoint: ``latest`` (default), ``best``, or a path (see `chosen_source`).
        config: the run's `ExperimentConfig` (its ``params.yaml``), or None. With it, the
            model is built (without weights) to check the weights' names and shapes, write
            each tied weight under every name the model gives it, and, for a transformers
            ``PreTrainedModel``, write its ``config.json``.

    Returns:
        What was written.

    Raises:
        ConfigError: if `out` is a file, or `run_dir` is not a directory.
        CheckpointError: if the weights are missing, damaged, not a checkpoint, or not the
            run's model's.
    """
    from cadence.engine.exporter import WEIGHTS_FILE, model_config_files, read_weights, save_weights

    run_path, out = Path(run_dir), Path(out)
    if not run_path.is_dir():
        raise ConfigError(f"{str(run_path)!r} is not a directory: pass the directory of a run, "
                          "e.g. runs/<experiment>-<time>.")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file: pass a folder for model.safetensors "
                          "(it is created if it does not exist).")
    run = RunDirectory(run_path)
    if config is not None:
        from cadence.task.train_lib import run_directory

        run = run_directory(config, run_path)
    source = chosen_source(run, checkpoint)
    weights = read_weights(source)
    step = _step_of(source)
    files: dict[str, str] = {}
    if config is not None:
        model = _built_model(config)
        weights = fit_to_model(weights, model, source)
        files = model_config_files(model)
    out.mkdir(parents=True, exist_ok=True)
    target = out / WEIGHTS_FILE
    temp = out / f".tmp-{WEIGHTS_FILE}"
    metadata = {"source": str(source)}
    if step is not None:
        metadata["step"] = str(step)
    try:
        save_weights(weights, temp, metadata)
        fsync_path(temp)
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
    written = [write_atomically(out / name, text) for name, text in files.items()]
    logger.debug("Exported %d tensors of %s to %s.", len(weights), source, target)
    return ExportedModel(target, step, source, len(weights), written)
