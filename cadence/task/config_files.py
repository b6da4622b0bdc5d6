"""Reading and writing configs: `load_config`, `save_config`, `config_to_yaml`,
`config_differences`.

`load_config` builds the final config in a fixed order, later sources winning::

    experiment's defaults  ->  each --config-file, in order  ->  each --set a.b=value

The experiment is a registered one (``digits``) or one of one's own module (``mymodels:NAME``,
``path/to/mymodels.py:NAME``; `cadence.task.module_experiments`), which the config records
(``experiment_module``) so that a saved file reloads through the same module.
`load_run_config` reads a run's ``params.yaml`` this way and refuses one that is not whole;
`check_saved_config` compares a run's with the config it is started with again, and
`save_run_config` writes it once the run has started.

Every step is strict: an unknown key, a value of the wrong type, or a value out of range raises
`ConfigError` naming the key path, where it came from, and the valid choices. The merge and type
checks are OmegaConf's (structured configs); the dataclasses stay plain Python. `save_config`
writes the final config as YAML; `load_config(config_files=[that file])` reproduces it exactly,
also for a config built by hand around a task of one's own (``experiment: ''``): the file
records its `TaskConfig` class (``task_config_class``), found again among the registered ones.

>>> config = load_config(ExperimentConfig(), overrides=["trainer.train_steps=500"])
>>> config.trainer.train_steps
500
>>> load_config(config, overrides=["trainer.train_step=500"])
Traceback (most recent call last):
...
cadence.core.errors.ConfigError: --set trainer.train_step=500: unknown key 'trainer.train_step'...
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cadence.core.arguments import check_items
from cadence.core.errors import ConfigError
from cadence.core.rank import process_rank
from cadence.core.run_dir import RunDirectory
from cadence.core.storage import writing
from cadence.task.config import ExperimentConfig, config_error, merge_config
from cadence.task.module_experiments import spelled
from cadence.task.registry import (
    DEFAULT_EXPERIMENT,
    experiment_functions,
    get_experiment_config,
    task_config_class,
)

TASK_CLASS_KEY = "task_config_class"
"""The key `config_to_yaml` adds: the ``module.QualName`` of the config's `TaskConfig` class."""
MODULE_KEY = "experiment_module"
"""The field that records the module of an experiment of one's own (``mymodels``)."""

logger = logging.getLogger("cadence")


def _omegaconf() -> Any:
    import omegaconf

    return omegaconf


def _read_yaml(path: Path, run: bool = False) -> Any:
    """The YAML mapping in the file at `path`; for a `run`'s ``params.yaml``, a damaged file's
    error says how to recover the run."""
    oc = _omegaconf()
    if path.is_dir():
        raise ConfigError(f"Config file {str(path)!r} is a directory; pass a YAML file.")
    if not path.is_file():
        raise ConfigError(f"Config file {str(path)!r} does not exist.")
    fix = f" {_RESTORE}" if run else ""
    try:
        loaded = oc.OmegaConf.load(path)
    except Exception as error:  # yaml.YAMLError and friends
        where = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise ConfigError(f"Config file {str(path)!r} is not valid YAML: {where}.{fix}"
                          ) from None
    if not isinstance(loaded, oc.DictConfig):
        raise ConfigError(f"Config file {str(path)!r} must hold a mapping of config keys.{fix}")
    return loaded


def _recorded_start(path: Path, data: Any) -> ExperimentConfig | None:
    """A fresh config of the `TaskConfig` class the file records, for a hand-built config
    (``experiment: ''``); None when the file records none."""
    name = data.get(TASK_CLASS_KEY)
    if not name:
        return None
    cls = task_config_class(str(name))
    if cls is None:
        raise ConfigError(
            f"Config file {str(path)!r} was written for the task config class {name}, which no "
            "task is registered for in this process: import the module that defines it (with "
            f"@cadence.register_task({str(name).rpartition('.')[2]})) before loading it."
        )
    return ExperimentConfig(task=cls())


def saved_task_class(path: str | os.PathLike[str]) -> str | None:
    """The ``module.QualName`` of the `TaskConfig` class a file written by `save_config`
    records, or None."""
    name = _read_yaml(Path(path)).get(TASK_CLASS_KEY)
    return str(name) if name else None


def experiment_of(path: str | os.PathLike[str], run: bool = False) -> str | ExperimentConfig:
    """What the config file at `path` (a `run`'s ``params.yaml``?) was built from: its
    experiment's name (``MODULE:NAME`` for an experiment of one's own module, which is not
    imported), or for a hand-built config a fresh config of its recorded task class (the
    default experiment if neither).

    Raises:
        ConfigError: if the file is unreadable, or names a task class not registered here.
    """
    path = Path(path)
    data = _read_yaml(path, run)
    if data.get("experiment"):
        return spelled(str(data.get(MODULE_KEY) or ""), str(data["experiment"]))
    return _recorded_start(path, data) or DEFAULT_EXPERIMENT


def _start(experiment: str, recorded_in: Path | None = None) -> ExperimentConfig:
    """A fresh config of `experiment`: a registered name, or ``MODULE:NAME`` /
    ``path/to/file.py:NAME`` (`cadence.task.module_experiments`)."""
    from cadence.task.module_experiments import experiment_from_module, split_spelling

    if experiment in experiment_functions():
        return get_experiment_config(experiment)
    spelling = split_spelling(experiment)
    if spelling is None:
        return get_experiment_config(experiment)  # raises, listing the registered ones
    return experiment_from_module(*spelling, recorded_in=recorded_in)


def _recorded_experiment(path: Path, data: Any) -> ExperimentConfig:
    """A fresh config of the experiment the config file at `path` names (importing the module
    it records only as `cadence.task.module_experiments` allows)."""
    from cadence.task.module_experiments import experiment_from_module

    module = str(data.get(MODULE_KEY) or "")
    if not module:
        return get_experiment_config(str(data["experiment"]))
    return experiment_from_module(module, str(data["experiment"]), recorded_in=path)


def _parse_override(text: str) -> Any:
    oc = _omegaconf()
    if not isinstance(text, str):
        raise ConfigError(f"overrides: {text!r} is not a 'key=value' string; pass e.g. "
                          "['trainer.train_steps=500'], or a mapping {'trainer': {...}}.")
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            f"--set {text}: an override is KEY=VALUE with a dotted key, e.g. "
            "trainer.train_steps=500."
        )
    if any(not part.strip() for part in key.split(".")):
        raise ConfigError(
            f"--set {text}: the key {key!r} has an empty part; a key is dotted names, e.g. "
            "trainer.train_steps=500."
        )
    try:
        return oc.OmegaConf.from_dotlist([text])
    except oc.errors.OmegaConfBaseException as error:
        raise ConfigError(f"--set {text}: {str(error).splitlines()[0]}.") from None


def load_config(
    experiment: str | ExperimentConfig | None = None,
    config_files: Sequence[str | os.PathLike[str]] = (),
    overrides: Sequence[str] | Mapping[str, Any] = (),
) -> ExperimentConfig:
    """Builds, checks and returns the final config of a run.

    Args:
        experiment: a registered experiment name; ``"MODULE:NAME"`` or
            ``"path/to/file.py:NAME"``, an experiment of one's own module (NAME registered by
            it, or a function there that returns an `ExperimentConfig`; see
            `cadence.task.module_experiments`); or a config to start from. None: the
            ``experiment`` key of the first config file that has one (and the module it
            records, ``experiment_module``), else the default experiment.
        config_files: YAML files merged in order (a file written by `save_config` reproduces
            its config exactly).
        overrides: ``"a.b=value"`` strings (values parsed as YAML), or a nested mapping.

    Raises:
        ConfigError: for an unknown experiment or key, a wrong type, or an invalid value; for
            a module that cannot be imported, or a NAME it does not offer.
        TypeError: for an argument of the wrong kind (`experiment` neither a name nor a
            config, `config_files` not a list of paths, `overrides` a single string): the
            message names it and what it must be.
    """
    return _build(experiment, *_check_sources("load_config", config_files, overrides))


def _check_sources(owner: str, config_files: Any, overrides: Any,
                   ) -> tuple[list[str | os.PathLike[str]], Sequence[str] | Mapping[str, Any]]:
    """The config files and overrides of a config, checked for their kinds: a list of paths,
    and a list of ``KEY=VALUE`` strings or a mapping (a single string would be read as its
    characters).

    Raises:
        TypeError: naming the argument and what it must be.
    """
    files = check_items(owner, "config_files", config_files, "a list of paths of YAML files",
                        "e.g. config_files=['my_config.yaml']",
                        lambda one: isinstance(one, (str, os.PathLike)))
    if not isinstance(overrides, Mapping):
        overrides = check_items(owner, "overrides", overrides,
                                "a list of 'KEY=VALUE' strings or a mapping",
                                "e.g. overrides=['trainer.train_steps=500']")
    return files, overrides


def load_run_config(
    params: str | os.PathLike[str],
    experiment: str | ExperimentConfig | None = None,
    config_files: Sequence[str | os.PathLike[str]] = (),
    overrides: Sequence[str] | Mapping[str, Any] = (),
) -> ExperimentConfig:
    """`load_config` of an existing run: its ``params.yaml`` first, then `config_files`, then
    `overrides` (how a run continues, and is evaluated, as it was configured).

    A run's ``params.yaml`` is untrusted input that `save_config` wrote whole: every key of its
    experiment's config, defaults included. One that lacks keys (cut short by a full disk or an
    interrupted copy, or edited) is refused rather than completed with defaults. The one
    exception is ``experiment_module``, which runs made before it existed lack.

    Raises:
        ConfigError: as `load_config`, and if `params` lacks keys of its experiment's config
            (naming them).
    """
    return _build(experiment, [params, *config_files], overrides, run_params=Path(params))


def _build(experiment: str | ExperimentConfig | None,
           config_files: Sequence[str | os.PathLike[str]],
           overrides: Sequence[str] | Mapping[str, Any],
           run_params: Path | None = None) -> ExperimentConfig:
    oc = _omegaconf()
    files = [Path(f) for f in config_files]
    loaded = [(path, _read_yaml(path, run=path == run_params)) for path in files]
    start: ExperimentConfig | None = None
    if experiment is None:
        named = [(f, y) for f, y in loaded if y.get("experiment")]
        if named:
            start = _recorded_experiment(*named[0])
        else:
            recorded = (_recorded_start(f, y) for f, y in loaded)
            experiment = next((r for r in recorded if r is not None), DEFAULT_EXPERIMENT)
    for _, data in loaded:
        data.pop(TASK_CLASS_KEY, None)
    if start is None:
        if isinstance(experiment, str):
            start = _start(experiment)
        elif isinstance(experiment, ExperimentConfig):
            start = copy.deepcopy(experiment)
        else:
            raise TypeError(
                f"`experiment` (got {type(experiment).__name__}) must be an experiment name or "
                "an ExperimentConfig."
            )
    if run_params is not None:
        _check_whole(run_params, loaded[0][1], start)
    merged = oc.OmegaConf.structured(start)
    ours = spelled(start.experiment_module, start.experiment)
    for path, data in loaded:
        named = data.get("experiment")
        if named and start.experiment:
            # A file that does not say which module is for the experiment of that name.
            module = data.get(MODULE_KEY, start.experiment_module)
            theirs = spelled(str(module or ""), str(named))
            if theirs != ours:
                raise ConfigError(
                    f"Config file {str(path)!r} is for experiment {theirs!r}, not "
                    f"{ours!r}: drop --experiment or pick the matching file."
                )
        merged = merge_config(merged, data, f"config file {str(path)!r}")
    if isinstance(overrides, Mapping):
        merged = merge_config(merged, oc.OmegaConf.create(dict(overrides)), "overrides")
    else:
        for text in overrides:
            merged = merge_config(merged, _parse_override(text), f"--set {text}")
    try:
        config = oc.OmegaConf.to_object(merged)
    except oc.errors.OmegaConfBaseException as error:
        raise config_error(error, "config", merged) from None
    assert isinstance(config, ExperimentConfig)
    config.validate()
    return config


ADDED_KEYS = frozenset({MODULE_KEY, *(f"runtime.parallelism.{key}" for key in (
    "pp_schedule", "pp_microbatches", "pp_stages_per_rank", "pp_stage_modules"))})
"""Keys that configs saved before they existed lack: absent from a run's ``params.yaml``, they
take their defaults (``experiment_module: ''``, a registered experiment; the pipeline's
settings, which a run of one stage never read)."""


def missing_keys(data: Any, start: ExperimentConfig) -> list[str]:
    """The key paths of `start`'s config classes that the loaded YAML `data` lacks (besides
    `ADDED_KEYS`): every field of every nested config, where `data` holds a mapping for it."""
    oc = _omegaconf()
    plain = oc.OmegaConf.to_container(data, resolve=False) if isinstance(
        data, oc.DictConfig) else data

    def walk(config: Any, values: Any, prefix: str) -> list[str]:
        missing: list[str] = []
        for item in dataclasses.fields(config):
            value = getattr(config, item.name)
            if item.name not in values:
                missing.append(f"{prefix}{item.name}")
            elif dataclasses.is_dataclass(value) and isinstance(values[item.name], dict):
                missing.extend(walk(value, values[item.name], f"{prefix}{item.name}."))
        return missing

    return [key for key in walk(start, plain, "") if key not in ADDED_KEYS]


def incompleteness(path: str | os.PathLike[str], start: ExperimentConfig) -> str | None:
    """What a config file written whole by `save_config` lacks of `start`'s config classes,
    in words (``"it lacks runtime.seed, ... (was it cut short?)"``), or None if nothing.

    Raises:
        ConfigError: if the file is unreadable.
    """
    data = _read_yaml(Path(path))
    data.pop(TASK_CLASS_KEY, None)
    return _lacking(missing_keys(data, start))


def _lacking(missing: list[str]) -> str | None:
    if not missing:
        return None
    listed = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6
                                       else "")
    return f"it lacks {listed} (was it cut short?)"


def _check_whole(path: Path, data: Any, start: ExperimentConfig) -> None:
    """Refuses a run's ``params.yaml`` that lacks keys of its experiment's config."""
    lacking = _lacking(missing_keys(data, start))
    if lacking is not None:
        raise ConfigError(
            f"{str(path)!r} is not a whole config of experiment "
            f"{spelled(start.experiment_module, start.experiment) or '(custom)'!r}: {lacking}. "
            f"{_RESTORE}")


_RESTORE = ("Restore it from a copy, or move it aside and run again with the experiment, config "
            "files and --set values the run was started with (its checkpoints are kept).")


def config_to_yaml(config: ExperimentConfig) -> str:
    """The config as YAML (every field, defaults included), led by the ``module.QualName`` of
    its `TaskConfig` class (``task_config_class``), so that a hand-built config
    (``experiment: ''``) reloads into the classes it was made with."""
    oc = _omegaconf()
    cls = type(config.task)
    return (f"{TASK_CLASS_KEY}: {cls.__module__}.{cls.__qualname__}\n"
            + str(oc.OmegaConf.to_yaml(oc.OmegaConf.structured(config))))


def save_config(config: ExperimentConfig, path: str | os.PathLike[str]) -> Path:
    """Writes `config` as YAML (`config_to_yaml`) to `path` atomically (temp file, then
    rename); returns the path."""
    from cadence.core.checkpoint_dir import write_atomically

    return write_atomically(Path(path), config_to_yaml(config))


def flatten_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """A config as ``{"key.path": value}`` (an empty dict is a value): what differences are
    reported in, and the hyper-parameters metric writers record.

    >>> flatten_config(ExperimentConfig())["trainer.optimizer_config.optimizer.name"]
    'adamw'
    """
    value = config
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict) and (value or not prefix):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten_config(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def config_differences(old: ExperimentConfig, new: ExperimentConfig) -> list[str]:
    """Key paths whose values differ, as ``"key: old -> new"`` lines."""
    a, b = flatten_config(old), flatten_config(new)
    return [f"{key}: {a.get(key)!r} -> {b.get(key)!r}" for key in sorted(set(a) | set(b))
            if not _same(a.get(key), b.get(key))]


def _same(a: Any, b: Any) -> bool:
    """``a == b``, except that NaN equals NaN (a config holding NaN is the same config)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


# ---------------------------------------------------------------------------- a run's config


def run_directory(config: ExperimentConfig, model_dir: str | os.PathLike[str]) -> RunDirectory:
    """The run directory of `config` in `model_dir` (the config names its eval and best
    sub-directories)."""
    trainer = config.trainer
    return RunDirectory(model_dir, eval_subdir=trainer.validation_summary_subdir,
                        best_subdir=trainer.best_checkpoint_export_subdir)


def check_saved_config(config: ExperimentConfig, run: RunDirectory,
                       allow_config_change: bool = False) -> list[str]:
    """Compares `config` with the run directory's ``params.yaml``; writes nothing.

    The saved file is read with `config`'s own task config class, so a task of one's own
    (``experiment: ''``) compares as well as a registered experiment.

    Returns:
        The differences (``"key: old -> new"``), empty when nothing is saved yet or the
        configs are the same; `save_run_config` writes them once the run has started.

    Raises:
        ConfigError: listing the differences, when the directory holds another config and
            `allow_config_change` is False.
    """
    path, model_dir = run.params, run.root
    if not path.is_file():
        return []
    live_class = f"{type(config.task).__module__}.{type(config.task).__qualname__}"
    start = ExperimentConfig(task=type(config.task)())  # imports no module the file records
    try:
        saved_class = saved_task_class(path)
        lacking = incompleteness(path, start)
        if lacking is not None:
            differences = [f"the saved config is not whole: {lacking}"]
        else:
            differences = config_differences(load_run_config(path, start), config)
        if saved_class is not None and saved_class != live_class:
            differences.insert(0, f"task config class: {saved_class} -> {live_class}")
    except ConfigError as error:
        differences = [f"the saved config does not load as {type(config.task).__name__}: "
                       f"{str(error).splitlines()[0]}"]
    if differences and not allow_config_change:
        raise ConfigError(
            f"{str(model_dir)!r} holds a run with a different config ({'; '.join(differences)})"
            ": use another model directory for a new run, or pass --allow-config-change "
            "(allow_config_change=True) to continue this run with the new config."
        )
    return differences


def save_run_config(config: ExperimentConfig, run: RunDirectory,
                    differences: list[str]) -> None:
    """Writes ``params.yaml`` once the run has started (rank 0 only).

    With `differences` (an allowed config change), the old file is first copied to
    ``params.<time>.yaml``; the new one then replaces it atomically, so ``params.yaml`` is never
    missing, and a failure leaves the old one in place (and no copy of it).

    Raises:
        StorageError: if the machine fails the write (a full disk, a read-only file system).
    """
    path = run.params
    if process_rank() != 0 or (path.is_file() and not differences):
        return
    backup = (path.with_name(f"params.{time.strftime('%Y%m%d-%H%M%S')}.yaml") if differences
              else None)
    try:
        with writing(f"Saving the run's config to {str(path)!r}"):
            if backup is not None:
                shutil.copy2(path, backup)
            save_config(config, path)
    except BaseException:  # params.yaml is the old one still: no (half-made) copy of it
        if backup is not None:
            with contextlib.suppress(OSError):
                backup.unlink()
        raise
    if backup is not None:
        logger.warning("The config changed (%s); the old one is kept as %s.",
                       "; ".join(differences), backup)
