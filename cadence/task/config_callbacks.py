"""The callbacks a config asks for: early stopping (``trainer.early_stopping``), a time limit
(``trainer.time_limit``), the profiler (``runtime.profiler``), and the model summary every
training run logs at its start.

`check_config_callbacks` runs before anything is written (a monitored metric the task does not
report, or early stopping in a mode that never evaluates while training, is a `ConfigError`
then, not at the first evaluation); `config_callbacks` builds them.
"""

from __future__ import annotations

from cadence.callbacks.control import EarlyStopping, StopAtTimeLimit
from cadence.callbacks.model_summary import ModelSummary
from cadence.callbacks.profiler import Profiler
from cadence.core.callbacks import Callback
from cadence.core.errors import ConfigError
from cadence.task.config import ExperimentConfig
from cadence.task.config_checks import duration_seconds


def check_config_callbacks(config: ExperimentConfig, mode: str,
                           metric_names: set[str] | None) -> None:
    """Checks ``trainer.early_stopping`` against the mode and what the task reports
    (`metric_names`: the evaluation's metric names, None when unknown before it runs).

    Raises:
        ConfigError: when early stopping monitors a metric the task does not report, or is set
            for a training mode that does not evaluate during training.
    """
    monitor = config.trainer.early_stopping.monitor.replace("|", "/")
    if not monitor or not mode.startswith("train"):
        return  # evaluation modes read the same config: early stopping is training's
    if mode != "train_and_eval":
        raise ConfigError(
            f"trainer.early_stopping.monitor (got {monitor!r}) is checked after evaluations "
            f"during training, and mode {mode!r} has none: run train_and_eval, or set "
            "trainer.early_stopping.monitor='' to train without early stopping.")
    if metric_names is not None and not any(
            monitor == n or monitor.startswith(f"{n}/") for n in metric_names):
        raise ConfigError(
            f"trainer.early_stopping.monitor (got {monitor!r}) is not a metric the task "
            f"reports; it reports: {', '.join(sorted(metric_names))}. Set it to one of them, "
            "or to '' to train without early stopping.")


def config_callbacks(config: ExperimentConfig, mode: str) -> list[Callback]:
    """The callbacks of a training `mode` (none for the evaluation modes): the model summary,
    then what ``trainer.early_stopping``, ``trainer.time_limit`` and ``runtime.profiler``
    ask for. Only the time limit and the profiler run per step, and only when configured."""
    if not mode.startswith("train"):
        return []
    callbacks: list[Callback] = [ModelSummary()]
    stopping = config.trainer.early_stopping
    if stopping.monitor and mode == "train_and_eval":
        callbacks.append(EarlyStopping(
            "eval/" + stopping.monitor.replace("|", "/"), patience=stopping.patience,
            min_delta=stopping.min_delta, mode=stopping.mode,
            restore_best=stopping.restore_best, after="evaluation"))
    seconds = duration_seconds(config.trainer.time_limit)  # None: no limit (validated)
    if seconds is not None:
        callbacks.append(StopAtTimeLimit(seconds))
    profiler = config.runtime.profiler
    if profiler.enabled:
        callbacks.append(Profiler(wait=profiler.wait, warmup=profiler.warmup,
                                  active=profiler.active, repeat=profiler.repeat))
    return callbacks
