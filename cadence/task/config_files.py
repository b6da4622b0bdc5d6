"""Reading and writing configs: `load_config`, `save_config`, `config_to_yaml`,
`config_differences`.

`load_config` builds the final config in a fixed order, later sources winning::

    registered experiment's defaults  ->  each --config-file, in order  ->  each --set a.b=value

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

import copy
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cadence.core.errors import ConfigError
from cadence.task.config import ExperimentConfig, config_error, merge_config
from cadence.task.registry import DEFAULT_EXPERIMENT, get_experiment_config, task_config_class

TASK_CLASS_KEY = "task_config_class"
"""The key `config_to_yaml` adds: the ``module.QualName`` of the config's `TaskConfig` class."""


def _omegaconf() -> Any:
    import omegaconf

    return omegaconf


def _read_yaml(path: Path) -> Any:
    oc = _omegaconf()
    if path.is_dir():
        raise ConfigError(f"Config file {str(path)!r} is a directory; pass a YAML file.")
    if not path.is_file():
        raise ConfigError(f"Config file {str(path)!r} does not exist.")
    try:
        loaded = oc.OmegaConf.load(path)
    except Exception as error:  # yaml.YAMLError and friends
        where = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise ConfigError(f"Config file {str(path)!r} is not valid YAML: {where}") from None
    if not isinstance(loaded, oc.DictConfig):
        raise ConfigError(f"Config file {str(path)!r} must hold a mapping of config keys.")
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


def experiment_of(path: str | os.PathLike[str]) -> str | ExperimentConfig:
    """What the config file at `path` was built from: its experiment's name, or for a hand-built
    config a fresh config of its recorded task class (the default experiment if neither).

    Raises:
        ConfigError: if the file is unreadable, or names a task class not registered here.
    """
    path = Path(path)
    data = _read_yaml(path)
    if data.get("experiment"):
        return str(data["experiment"])
    return _recorded_start(path, data) or DEFAULT_EXPERIMENT


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
        experiment: a registered experiment name, or a config to start from. None: the
            ``experiment`` key of the first config file, else the default experiment.
        config_files: YAML files merged in order (a file written by `save_config` reproduces
            its config exactly).
        overrides: ``"a.b=value"`` strings (values parsed as YAML), or a nested mapping.

    Raises:
        ConfigError: for an unknown experiment or key, a wrong type, or an invalid value.
    """
    oc = _omegaconf()
    files = [Path(f) for f in config_files]
    loaded = [(f, _read_yaml(f)) for f in files]
    if experiment is None:
        named = [str(y["experiment"]) for _, y in loaded if y.get("experiment")]
        if named:
            experiment = named[0]
        else:
            recorded = (_recorded_start(f, y) for f, y in loaded)
            experiment = next((r for r in recorded if r is not None), DEFAULT_EXPERIMENT)
    for _, data in loaded:
        data.pop(TASK_CLASS_KEY, None)
    if isinstance(experiment, str):
        start = get_experiment_config(experiment)
    elif isinstance(experiment, ExperimentConfig):
        start = copy.deepcopy(experiment)
    else:
        raise TypeError(
            f"`experiment` (got {type(experiment).__name__}) must be an experiment name or an "
            "ExperimentConfig."
        )
    merged = oc.OmegaConf.structured(start)
    for path, data in loaded:
        named = data.get("experiment")
        if named and start.experiment and named != start.experiment:
            raise ConfigError(
                f"Config file {str(path)!r} is for experiment {named!r}, not "
                f"{start.experiment!r}: drop --experiment or pick the matching file."
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
