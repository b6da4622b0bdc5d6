"""The declarative entry point of the tensorpack front-end: `TrainConfig` and
`launch_train_with_config`, with tensorpack's default callbacks and monitors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadence.core.arguments import check_items, check_path
from cadence.core.callbacks import Callback
from cadence.core.hook_checks import describe
from cadence.core.intervals import check_int
from cadence.core.summary import DEFAULT_WRITERS, WriterSpec, check_writers
from cadence.tensorpack.defaults import default_callbacks, default_monitors
from cadence.tensorpack.trainer import ModelDesc, SingleCostTrainer

__all__ = ["TrainConfig", "default_callbacks", "default_monitors", "launch_train_with_config"]


@dataclass
class TrainConfig:
    """What `launch_train_with_config` trains, and how (tensorpack's ``TrainConfig``).

    Attributes:
        model: a `ModelDesc`.
        dataflow: the input (a `DataFlow`, DataLoader, list of batches...); `data` is an alias.
        callbacks: callbacks, in order.
        extra_callbacks: appended to `callbacks`; None means `default_callbacks()`.
        monitors: None means `default_monitors(writers)` (with a `logdir`).
        steps_per_epoch: steps per epoch; None: one pass over the input (its length).
        starting_epoch: the first epoch of a fresh run.
        max_epoch: the last epoch.
        session_init: weights to start from (a ``.safetensors`` file, an export directory or
            a checkpoint) when there is no checkpoint to resume.
        logdir: where checkpoints, summaries and ``stats.jsonl`` go; training resumes from it.
        writers: the metric writers of the default monitors' summaries in ``<logdir>/train``:
            ``tensorboard``, ``jsonl``, ``csv``, ``mlflow``, ``wandb`` (see ``docs/writers.md``).

    Raises:
        ValueError: without exactly one input, for an input of no length and no
            `steps_per_epoch`, if `steps_per_epoch`, `max_epoch` or `starting_epoch` is not a
            positive int, or if `starting_epoch` is after `max_epoch`.
        TypeError: for a `model` that is not a `ModelDesc`, callbacks not in a list of
            `Callback` objects, or a `session_init` or `logdir` that is not a path.
    """

    model: ModelDesc | None = None
    dataflow: Any = None
    data: Any = None
    callbacks: Sequence[Callback] = field(default_factory=list)
    extra_callbacks: Sequence[Callback] | None = None
    monitors: Sequence[Callback] | None = None
    steps_per_epoch: int | None = None
    starting_epoch: int = 1
    max_epoch: int = 99999
    session_init: str | Path | None = None
    logdir: str | Path | None = None
    writers: Sequence[WriterSpec] = DEFAULT_WRITERS

    def __post_init__(self) -> None:
        if (self.dataflow is None) == (self.data is None):
            raise ValueError("TrainConfig needs exactly one of `dataflow` and `data`.")
        if self.model is not None and not isinstance(self.model, ModelDesc):
            raise TypeError(f"`model` (got {type(self.model).__name__}) must be a "
                            "cadence.tensorpack.ModelDesc.")
        for name in ("callbacks", "extra_callbacks", "monitors"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, check_items(
                    "TrainConfig", name, value, "a list of cadence.Callback objects",
                    f"e.g. {name}=[cadence.callbacks.ModelSaver()]",
                    lambda one: isinstance(one, Callback)))
        for name in ("session_init", "logdir"):
            check_path("TrainConfig", name, getattr(self, name),
                       f"e.g. {name}='runs/{'mnist' if name == 'logdir' else 'pretrained'}'",
                       none_ok=True)
        self.writers = check_writers(self.writers)
        if self.steps_per_epoch is None:
            try:
                self.steps_per_epoch = len(self.input)
            except TypeError:
                raise ValueError("The input has no length: set steps_per_epoch.") from None
            if self.steps_per_epoch == 0:
                raise ValueError("TrainConfig: the input is empty (its length is 0), so an "
                                 "epoch would have no steps. Give it data, or set "
                                 "steps_per_epoch.")
        # A schedule that trains nothing (max_epoch=0) or is misread (2.5, True) is refused
        # here, where the config is written, not when training starts.
        self.steps_per_epoch = check_int(
            "TrainConfig", "steps_per_epoch", self.steps_per_epoch,
            "Pass the number of steps in one epoch, e.g. steps_per_epoch=100, or None for "
            "one pass over the input.")
        self.max_epoch = check_int("TrainConfig", "max_epoch", self.max_epoch,
                                   "Pass the number of epochs to train, e.g. max_epoch=10.")
        self.starting_epoch = check_int(
            "TrainConfig", "starting_epoch", self.starting_epoch,
            "Pass the first epoch of a fresh run, e.g. starting_epoch=1.")
        if self.starting_epoch > self.max_epoch:
            raise ValueError(f"TrainConfig: `starting_epoch` (got {self.starting_epoch}) is "
                             f"after `max_epoch` (got {self.max_epoch}), so no epoch would "
                             f"run. Pass a max_epoch of at least {self.starting_epoch}.")

    @property
    def input(self) -> Any:
        """The input source."""
        return self.dataflow if self.dataflow is not None else self.data


def launch_train_with_config(config: TrainConfig, trainer: SingleCostTrainer) -> None:
    """Sets up `trainer` with the config's model and input and trains it with the defaults;
    resumes from the newest checkpoint of the run.

    Raises:
        TypeError: if `config` is not a `TrainConfig`, `trainer` not a `SingleCostTrainer`, or
            the config has no model.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"launch_train_with_config: `config` (got {describe(config)}) must be a "
                        "cadence.tensorpack.TrainConfig, e.g. TrainConfig(model=MyModel(), "
                        "data=batches, max_epoch=10).")
    if not isinstance(trainer, SingleCostTrainer):
        raise TypeError(f"`trainer` (got {type(trainer).__name__}) must be a SingleCostTrainer "
                        "such as SimpleTrainer().")
    if config.model is None:
        raise TypeError("TrainConfig.model is required: a ModelDesc.")
    if config.logdir is not None:
        trainer.logdir = Path(config.logdir)
    trainer.setup_graph(config.input, config.model.build_graph, config.model.optimizer,
                        model=config.model)
    monitors = config.monitors
    if monitors is None and trainer.logdir is not None:
        monitors = default_monitors(config.writers)
    trainer.train_with_defaults(
        callbacks=list(config.callbacks), monitors=monitors,
        session_init=config.session_init, steps_per_epoch=config.steps_per_epoch,
        starting_epoch=config.starting_epoch, max_epoch=config.max_epoch,
        extra_callbacks=config.extra_callbacks,
    )
