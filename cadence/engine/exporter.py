"""`BestCheckpointExporter`: keeps the best weights by an evaluation metric, as safetensors.

Each export is a directory ``best-<step>/`` holding ``model.safetensors`` (the evaluated
weights: the EMA average when enabled) and ``metrics.json`` (the step and every scalar of the
evaluation). ``info.json`` is the ledger of the kept exports, best first, with the SHA-256 of
each export's files; it is rewritten atomically after the files it names exist, and read back
on construction, so the best survives restarts. `load_weights` checks those checksums: an export
whose bytes changed is skipped with a warning (the next best is loaded) or, named alone, refused.
Unlike TF Model Garden's exporter (one export, numbered by save count), it keeps the top K,
named by step, and nested metric names work everywhere.

Exports are plain tensors: `load_weights` reads them (and cadence checkpoints) without
executing anything from the file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cadence.core.best import COMP_TO_MODE, is_better
from cadence.core.checkpoint_dir import (
    CheckpointDirectory,
    file_sha256,
    fsync_path,
    write_atomically,
)
from cadence.core.errors import CheckpointError, CheckpointMismatchError, MissingMetricError
from cadence.core.files import plain_name
from cadence.core.hook_checks import describe
from cadence.core.intervals import check_int, is_int
from cadence.core.logs import flatten, is_scalar
from cadence.core.rank import process_rank
from cadence.core.storage import storage_error
from cadence.engine.sharded import (
    load_full_model_state,
    read_sharded,
    sharded_names,
    sharded_reader,
)

logger = logging.getLogger("cadence")

WEIGHTS_FILE = "model.safetensors"
METRICS_FILE = "metrics.json"
LEDGER_FILE = "info.json"


def _write_json(path: Path, data: Any) -> None:
    write_atomically(path, json.dumps(data, indent=2, sort_keys=True))


def _lookup(logs: Mapping[str, Any], name: str) -> Any:
    """The value of `name` in (nested) `logs`; "a/b" and "a|b" address ``logs["a"]["b"]``."""
    flat = flatten(logs)
    key = name.replace("|", "/")
    if key in flat:
        return flat[key]
    raise MissingMetricError(
        f"The evaluation logs have no metric {name!r}; they have: {', '.join(sorted(flat))}. "
        "Give BestCheckpointExporter one of them as `metric_name`."
    )


class BestCheckpointExporter:
    """Exports the model's weights whenever an evaluation is among the best `max_to_keep`.

    Args:
        export_dir: where the exports and the ledger live.
        metric_name: the evaluation metric; "a/b" or "a|b" for nested logs.
        metric_comp: ``"higher"`` or ``"lower"`` is better.
        max_to_keep: how many of the best to keep.
        writes: None: this job writes the exports (its rank 0). A function: whether this job
            writes them now -- False when another writes them (replica groups: the first of
            the live groups, `cadence.CheckpointManager`'s `writes` too); every job decides the
            same, from the ledger on disk, read again before each decision (another job keeps
            it).

    Raises:
        ValueError: for a bad `metric_comp`, `metric_name` or `max_to_keep`.
        CheckpointError: if the ledger in `export_dir` is unreadable or tracks another metric.
    """

    def __init__(self, export_dir: str | os.PathLike[str], metric_name: str,
                 metric_comp: str = "higher", max_to_keep: int = 1,
                 writes: Callable[[], bool] | None = None) -> None:
        if metric_comp not in ("higher", "lower"):
            raise ValueError(f"`metric_comp` (got {metric_comp!r}) must be 'higher' or 'lower'.")
        if not metric_name:
            raise ValueError("`metric_name` must name an evaluation metric, e.g. 'accuracy'.")
        max_to_keep = check_int("BestCheckpointExporter", "max_to_keep", max_to_keep,
                                "Pass the number of best exports to keep, e.g. max_to_keep=1.")
        self.export_dir = Path(export_dir)
        self.metric_name = metric_name
        self.metric_key = metric_name.replace("|", "/")
        self.metric_comp = metric_comp
        self.mode = COMP_TO_MODE[metric_comp]
        """The direction in the engine's words (``"max"`` for ``"higher"``)."""
        self.max_to_keep = max_to_keep
        self.writes = writes
        """Whether this job writes the files now (None: it does); see the class."""
        self._entries: list[dict[str, Any]] = self._read_ledger()

    # ------------------------------------------------------------------ the ledger

    @property
    def best_ckpt_logs_path(self) -> Path:
        """The ledger file."""
        return self.export_dir / LEDGER_FILE

    def _read_ledger(self) -> list[dict[str, Any]]:
        path = self.best_ckpt_logs_path
        if not path.is_file():
            return []
        ledger = read_ledger(path)
        entries = ledger["exports"]
        if ledger.get("metric") != self.metric_key:
            raise CheckpointError(
                f"{str(path)!r} ranks exports by {ledger.get('metric')!r}, not "
                f"{self.metric_key!r}: use another export directory for another metric."
            )
        foreign = [e for e in entries if not isinstance(e, dict) or not plain_name(e.get("path"))]
        if foreign:  # never read, never deleted: a name from the ledger stays in export_dir
            logger.warning("%s lists %d export(s) whose path is not a name in %s; they are "
                           "ignored.", path, len(foreign), self.export_dir)
            entries = [e for e in entries if e not in foreign]
        kept = [e for e in entries if (self.export_dir / e["path"] / WEIGHTS_FILE).is_file()]
        if len(kept) != len(entries):
            logger.warning("%d export(s) listed in %s are missing; they are forgotten.",
                           len(entries) - len(kept), path)
        return kept

    @property
    def best_exports(self) -> list[dict[str, Any]]:
        """The kept exports, best first: ``{"step", "value", "path", "logs"}`` each."""
        return [dict(e) for e in self._entries]

    @property
    def best_ckpt_logs(self) -> dict[str, Any] | None:
        """The evaluation logs of the best export (with ``best_ckpt_global_step``)."""
        if not self._entries:
            return None
        return {**self._entries[0]["logs"], "best_ckpt_global_step": self._entries[0]["step"]}

    @property
    def best_value(self) -> float | None:
        """The best metric value so far."""
        return self._entries[0]["value"] if self._entries else None

    @property
    def best_ckpt_path(self) -> Path | None:
        """The weights file of the best export."""
        if not self._entries:
            return None
        return self.export_dir / self._entries[0]["path"] / WEIGHTS_FILE

    def _better(self, a: float, b: float) -> bool:
        return is_better(a, b, self.mode)

    # ------------------------------------------------------------------ exporting

    def maybe_export_checkpoint(self, model: nn.Module | Mapping[str, torch.Tensor],
                                eval_logs: Mapping[str, Any], global_step: int,
                                coordinator: Any = None, kind: str = "model",
                                weights: Callable[[], Mapping[str, torch.Tensor]] | None = None
                                ) -> bool:
        """Exports `model`'s weights if these logs are among the best; returns whether it did.

        `kind` says which weights they are -- ``"model"`` (trained) or ``"ema"`` (an EMA
        average) -- in the file's metadata (``weights``), so that an export says what it holds.
        `weights`, when given, gathers the weights to write instead of `model`'s own (a
        pipeline's stages, consolidated on rank 0: a collective, called on every rank when
        these logs are among the best); `model` then gives the files beside them.

        The weights are copied to host memory now; with a `coordinator` (the Trainer's) the
        files are written in the background. Every rank decides (and reports the same best
        value); only rank 0 writes the files, and only rank 0 returns True.

        Raises:
            MissingMetricError: a `KeyError`, if the metric is not in `eval_logs` (the message
                lists those that are).
        """
        if self.writes is not None:  # another job may have exported since: its ledger
            self._entries = self._read_ledger()
        value = _lookup(eval_logs, self.metric_name)
        if not is_scalar(value):
            raise ValueError(f"The metric {self.metric_name!r} is not a scalar: {value!r}.")
        value = float(value)
        if math.isnan(value):
            return False
        if any(e["step"] == global_step for e in self._entries):
            return False  # this step is exported already (a restarted run evaluating again)
        full = len(self._entries) >= self.max_to_keep
        if full and not self._better(value, self._entries[-1]["value"]):
            return False
        logs = {k: float(v) for k, v in flatten(eval_logs).items() if is_scalar(v)}
        entry = {"step": int(global_step), "value": value, "path": f"best-{global_step}",
                 "logs": logs}
        entries = sorted([*self._entries, entry], key=lambda e: e["value"],
                         reverse=self.metric_comp == "higher")
        kept, dropped = entries[: self.max_to_keep], entries[self.max_to_keep:]
        # Decided on every rank, so that every rank reports the same best value; the files
        # follow on rank 0 alone (in the background if asked).
        self._entries = kept
        # a collective for a sharded model or a pipeline: on every rank
        written = host_weights(weights() if weights is not None else model)
        if process_rank() != 0 or (self.writes is not None and not self.writes()):
            return False
        files = model_config_files(model) if isinstance(model, nn.Module) else {}
        if coordinator is not None:
            coordinator.schedule(self._write, entry, written, kept, dropped, files, kind)
        else:
            self._write(entry, written, kept, dropped, files, kind)
        return True

    def _write(self, entry: dict[str, Any], weights: dict[str, torch.Tensor],
               kept: list[dict[str, Any]], dropped: list[dict[str, Any]],
               files: Mapping[str, str] | None = None, kind: str = "model") -> None:
        final = self.export_dir / entry["path"]
        temp = self.export_dir / f".tmp-{entry['path']}"
        files = dict(files or {})
        try:
            self.export_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(temp, ignore_errors=True)
            temp.mkdir()
            save_weights(weights, temp / WEIGHTS_FILE,
                         {"step": str(entry["step"]), "metric": self.metric_key,
                          "value": repr(entry["value"]), "weights": kind})
            _write_json(temp / METRICS_FILE, {"step": entry["step"], "metric": self.metric_key,
                                              "value": entry["value"], "logs": entry["logs"]})
            for name, text in files.items():
                write_atomically(temp / name, text)
            names = (WEIGHTS_FILE, METRICS_FILE, *files)
            for name in names:
                fsync_path(temp / name)
            entry["sha256"] = {name: file_sha256(temp / name) for name in names}
            if final.exists():
                shutil.rmtree(final)
            os.replace(temp, final)
            _write_json(self.best_ckpt_logs_path, {"metric": self.metric_key,
                                                   "comp": self.metric_comp, "exports": kept})
        except BaseException as error:
            shutil.rmtree(temp, ignore_errors=True)
            what = f"Exporting the weights of step {entry['step']} to {str(self.export_dir)!r}"
            # A full disk as safetensors says it (`SafetensorError`) or as the rest do
            storage = storage_error(what, error)
            if storage is not None:
                raise storage from error
            if not isinstance(error, OSError):
                raise
            raise CheckpointError(
                f"{what} failed: {error}. {LEDGER_FILE} still lists the exports before it. "
                "Fix the cause, then run again."
            ) from error
        for old in dropped:
            if old is not entry:
                shutil.rmtree(self.export_dir / old["path"], ignore_errors=True)
        logger.info("Exported the weights of step %d (%s = %.6g) to %s.", entry["step"],
                    self.metric_key, entry["value"], final)


# ---------------------------------------------------------------------------- writing weights


def host_weights(model: nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`model`'s weights by the model's own names, whole, copied to host memory on rank 0 (the
    other ranks get an empty dict): a plain model's state dict; a DDP- or compile-wrapped one's
    without the wrappers' prefixes; an FSDP2 model's gathered from every rank's shards -- a
    collective, which every rank must call. Tied weights appear under each of their names, as
    the model's ``state_dict`` names them, so that ``load_state_dict(strict=True)`` takes them.
    """
    state: Mapping[str, Any] = model if not isinstance(model, nn.Module) else {}
    if isinstance(model, nn.Module):
        from cadence.engine.parallelize import unwrap_model
        from cadence.engine.sharded import is_sharded_module

        model = unwrap_model(model)
        if is_sharded_module(model):
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            state = get_model_state_dict(model, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True))
        elif process_rank() == 0:
            state = model.state_dict()
    if process_rank() != 0:
        return {}
    return {name: value.detach().to("cpu", copy=True).contiguous()
            for name, value in state.items() if isinstance(value, torch.Tensor)}


def save_weights(weights: Mapping[str, torch.Tensor], path: Path,
                 metadata: Mapping[str, str] | None = None) -> None:
    """Writes `weights` as one safetensors file at `path`, readable with
    ``safetensors.torch.load_file`` alone (no cadence) and by transformers' ``from_pretrained``
    (whose metadata must say ``format: pt``). Tensors that share memory (tied weights) are
    written once per name."""
    from safetensors.torch import save_file

    seen: set[tuple[int, int]] = set()
    plain = {}
    for name, tensor in weights.items():
        tensor = tensor.detach().contiguous()
        key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()))
        if key in seen and tensor.numel():  # a second name of one tensor: its own copy
            tensor = tensor.clone()
        seen.add(key)
        plain[name] = tensor
    save_file(plain, str(path), metadata={"format": "pt", **(metadata or {})})


def model_config_files(model: nn.Module) -> dict[str, str]:
    """The files beside the weights that make an export a folder transformers'
    ``from_pretrained`` opens: ``config.json`` (and ``generation_config.json``) of a
    transformers ``PreTrainedModel``, its ``architectures`` the model's class as its author
    named it (not FSDP2's subclass); nothing for any other model."""
    import copy
    import sys

    from cadence.engine.parallelize import author_class, unwrap_model

    transformers = sys.modules.get("transformers")
    model = unwrap_model(model)
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        return {}
    config = copy.deepcopy(model.config)
    config.architectures = [author_class(model).__name__]
    files = {"config.json": config.to_json_string(use_diff=True)}
    generation = getattr(model, "generation_config", None)
    if generation is not None and hasattr(generation, "to_json_string"):
        files["generation_config.json"] = generation.to_json_string(use_diff=True)
    return files


# ---------------------------------------------------------------------------- the ledger


def read_ledger(path: Path) -> dict[str, Any]:
    """The export ledger at `path` (``{"metric", "comp", "exports"}``), its entries checked:
    each export's ``step`` a whole number, its ``value`` a number (not NaN) and its ``logs``
    numbers -- what the exporter ranks and reports. An entry whose ``path`` is not a plain
    name is left for the exporter to ignore.

    Raises:
        CheckpointError: in one line saying what is wrong and what to do, for a file that is
            not a ledger or holds an entry that is not a number where one goes.
    """
    aside = ("Move the file aside (the exports beside it stay) and run again: the ledger starts "
             "anew from the next evaluation.")
    try:
        ledger = json.loads(path.read_text())
        entries = list(ledger["exports"])
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{str(path)!r} is not a cadence export ledger ({error}). "
                              f"{aside}") from None
    for entry in entries:
        if not isinstance(entry, dict) or not plain_name(entry.get("path")):
            continue  # not an export of this directory: the exporter ignores it
        problem = _entry_problem(entry)
        if problem is not None:
            raise CheckpointError(f"{str(path)!r} lists export {entry['path']!r} with "
                                  f"{problem}, so the exports cannot be ranked. {aside}")
    ledger["exports"] = entries
    return ledger


def _is_number(value: Any) -> bool:
    """A JSON number the exporter can compare: not a bool, not NaN (infinity can be a value)."""
    return is_scalar(value) and not math.isnan(value)


def _entry_problem(entry: dict[str, Any]) -> str | None:
    """What is wrong with one ledger entry, as ``<field> <value>, which is not ...``; None."""
    step, value, logs = entry.get("step"), entry.get("value"), entry.get("logs", {})
    if not (is_int(step) and step >= 0):
        return f"step {describe(step)}, which is not a step number"
    if not _is_number(value):
        return f"value {describe(value)}, which is not a number"
    if not isinstance(logs, dict):
        return f"logs {describe(logs)}, which is not a mapping of metrics"
    bad = next((key for key, item in logs.items()  # NaN is one: a metric that saw no data
                if not is_scalar(item)), None)
    if bad is not None:
        return f"logs[{bad!r}] {describe(logs[bad])}, which is not a number"
    return None


# ---------------------------------------------------------------------------- loading weights


def _ledger_checksum(weights: Path) -> str | None:
    """The SHA-256 the export ledger recorded for an export's weights file, if any."""
    ledger = weights.parent.parent / LEDGER_FILE
    try:
        entries = json.loads(ledger.read_text()).get("exports") or []
    except (OSError, ValueError, AttributeError):
        return None
    for entry in entries:
        if isinstance(entry, dict) and entry.get("path") == weights.parent.name:
            checksum = (entry.get("sha256") or {}).get(WEIGHTS_FILE)
            return checksum if isinstance(checksum, str) else None
    return None


def _candidates(path: Path) -> list[tuple[str, Path]]:
    """Where the weights at `path` may come from, best first: ("safetensors" | "checkpoint",
    file or directory) each. Several when `path` is a ledger or a directory of checkpoints."""
    if path.is_file():
        if path.suffix == ".safetensors":
            return [("safetensors", path)]
        raise CheckpointError(
            f"{str(path)!r} is a file but not a .safetensors file; pass a .safetensors file, a "
            "best-export directory, a checkpoint directory (ckpt-<step>) or a directory of them."
        )
    if not path.exists():
        raise CheckpointError(f"{str(path)!r} does not exist.")
    if (path / WEIGHTS_FILE).is_file():
        return [("safetensors", path / WEIGHTS_FILE)]
    if (path / LEDGER_FILE).is_file():
        try:
            exports = json.loads((path / LEDGER_FILE).read_text()).get("exports") or []
        except (OSError, ValueError, AttributeError) as error:
            raise CheckpointError(f"The export ledger {str(path / LEDGER_FILE)!r} is "
                                  f"unreadable: {error}.") from None
        found = [("safetensors", path / e["path"] / WEIGHTS_FILE) for e in exports
                 if isinstance(e, dict) and plain_name(e.get("path"))]
        if found:
            return found
    if (path / "manifest.json").is_file():
        return [("checkpoint", path)]
    complete = CheckpointDirectory(path, None).checkpoints()
    if complete:
        return [("checkpoint", info.path) for info in reversed(complete)]
    raise CheckpointError(
        f"{str(path)!r} holds no weights: expected a .safetensors file, a best-export directory, "
        "a cadence checkpoint (ckpt-<step>) or a directory of checkpoints."
    )


def weights_metadata(path: Path) -> dict[str, str]:
    """The metadata of a safetensors file (``step``, ``weights``, ...), or {} where it has none
    or cannot be read (its weights are checked when they are read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as opened:
            return dict(opened.metadata() or {})
    except (SafetensorError, OSError):
        return {}


MODEL, EMA, EVALUATED = "model", "ema", "evaluated"
"""The sets of weights `read_weight_set` reads from a checkpoint: the trained ones, their EMA
average (in a run with ``trainer.ema.enabled``), or what the run evaluates -- the average where
the checkpoint holds one, else the trained weights."""


@dataclass(frozen=True)
class WeightSet:
    """Weights read from a checkpoint or an export.

    Attributes:
        tensors: the weights, by the model's names.
        kind: ``"model"`` (trained weights), ``"ema"`` (an EMA average), or None where the file
            does not say (an export written before exports said it).
        location: the file or checkpoint read.
    """

    tensors: dict[str, torch.Tensor]
    kind: str | None
    location: Path


def _read_one(kind: str, location: Path, which: str) -> WeightSet:
    if kind == "safetensors":
        from safetensors.torch import load_file

        expected = _ledger_checksum(location)
        try:
            if expected is not None and file_sha256(location) != expected:
                raise CheckpointError(
                    f"Export {str(location)!r} is damaged: it does not match the SHA-256 its "
                    f"ledger ({LEDGER_FILE}) recorded (its bytes changed after it was written)."
                )
            tensors = load_file(str(location))
        except CheckpointError:
            raise
        except Exception as error:  # safetensors raises its own error types
            raise CheckpointError(f"Cannot read {str(location)!r}: {error}") from error
        said = weights_metadata(location).get("weights")
        return WeightSet(tensors, said if said in (MODEL, EMA) else None, location)
    from cadence.engine.checkpoint_io import read_checkpoint

    manifest, payload = read_checkpoint(location)
    state = payload["state"]
    shards = sharded_reader(location, manifest)
    held = {name for name in (MODEL, EMA)
            if isinstance(state.get(name), dict) or name in sharded_names(shards)}
    if MODEL not in held:
        raise CheckpointError(
            f"Checkpoint {str(location)!r} has no 'model' entry (it has {sorted(state)}): it "
            "was not written by a cadence Trainer; load it with CheckpointManager.restore "
            "instead.")
    if which == EMA and EMA not in held:
        raise CheckpointError(f"Checkpoint {str(location)!r} holds no EMA average: its run "
                              "trained without trainer.ema.enabled.")
    part = EMA if which == EMA or (which == EVALUATED and EMA in held) else MODEL
    tensors = state.get(part)
    if not isinstance(tensors, dict):  # written sharded (FSDP2)
        tensors = read_sharded(shards, part)
    return WeightSet(tensors, part, location)


def read_weight_set(path: str | os.PathLike[str], which: str = MODEL) -> WeightSet:
    """The weights stored at `path` (see `load_weights` for what it may be), with which set
    they are.

    Args:
        path: where the weights are.
        which: which of a checkpoint's sets (`MODEL`, `EMA` or `EVALUATED`); a best export or a
            ``.safetensors`` file holds one set, read as it is.

    Raises:
        CheckpointError: if nothing at `path` holds weights, or every candidate is damaged; a
            checkpoint without an EMA average read for ``"ema"``.
    """
    candidates = _candidates(Path(path))
    problems = []
    for kind, location in candidates:
        try:
            found = _read_one(kind, location, which)
        except CheckpointError as error:
            if len(candidates) == 1:
                raise
            problems.append(str(error))
            continue
        for problem in problems:
            logger.warning("Skipped: %s Loaded %s instead.", problem, location)
        return found
    raise CheckpointError(f"No weights in {str(path)!r} can be read:\n  "
                          + "\n  ".join(problems))


def read_weights(path: str | os.PathLike[str], which: str = MODEL) -> dict[str, torch.Tensor]:
    """The weights stored at `path`: `read_weight_set`'s tensors (a checkpoint's trained
    weights by default).

    Raises:
        CheckpointError: see `read_weight_set`.
    """
    return read_weight_set(path, which).tensors


def load_weights(model: nn.Module, path: str | os.PathLike[str], strict: bool = True) -> None:
    """Loads weights into `model` from a ``.safetensors`` file, a best-export directory (its
    best export), a cadence checkpoint directory, or a directory of checkpoints (the newest).

    Raises:
        CheckpointError: if nothing at `path` holds weights, or a file is unreadable.
        CheckpointMismatchError: if the weights do not fit `model` (every difference listed).
    """
    weights = read_weights(path)
    expected = model.state_dict()
    problems = []
    if strict:
        problems += [f"missing parameter {k!r}" for k in expected if k not in weights]
        problems += [f"unexpected parameter {k!r}" for k in weights if k not in expected]
    problems += [
        f"{k!r} has shape {tuple(weights[k].shape)} in {str(path)!r}, {tuple(v.shape)} in the model"
        for k, v in expected.items() if k in weights and weights[k].shape != v.shape
    ]
    if problems:
        raise CheckpointMismatchError(
            f"The weights in {str(path)!r} do not fit {type(model).__name__}:\n  - "
            + "\n  - ".join(problems)
            + "\nUse weights from the same model definition, or pass strict=False to load the "
            "matching part."
        )
    load_full_model_state(model, weights, strict)  # each rank its shards, where sharded
