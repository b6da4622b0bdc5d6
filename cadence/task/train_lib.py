"""`run_experiment`: builds the task, model, optimizer, Trainer and Controller, and runs a mode.

The model directory of a run is a `cadence.core.run_dir.RunDirectory`::

    model_dir/
      params.yaml        the final config (written by training modes once the run has started;
                         reloads exactly, custom task configs included, and the module of an
                         experiment of one's own: ``experiment_module``)
      train.lock         held while a process trains here: a second trainer is refused
      checkpoints/       ckpt-<step>/ (atomic, newest kept, resumed from automatically)
      resumes.jsonl      a line for each time training continued from a checkpoint
      train/  eval/      summaries: TensorBoard event files and metrics.jsonl (runtime.writers)
      best/              the best exports (safetensors + metrics.json, ledger info.json)
      mlflow_run.json    the MLflow run of the run (with the mlflow writer; ../mlruns/, shared
                         by the folder's runs, its default store), wandb_run.json and wandb/
                         the same for W&B

Modes (TF Model Garden's ``train_lib``):

=====================  ==========================================================================
``train``              train to ``trainer.train_steps``
``train_and_eval``     train, evaluating every ``trainer.validation_interval`` steps and at the end
``train_and_post_eval``  train, then evaluate once
``eval``               evaluate the newest good checkpoint once (an error if there is none,
                       unless ``task.init_checkpoint`` names weights to evaluate)
``continuous_eval``    evaluate every new checkpoint until the one of ``trainer.train_steps``
=====================  ==========================================================================

Running a training mode again in the same directory resumes from the newest checkpoint; a
finished run does nothing more (except a final evaluation that had not run), and returns the
logs of its final evaluation as its checkpoint kept them -- the same as the first time, without
evaluating again or writing a second evaluation record.

Before anything is written, the config is checked as far as it can be without training: the
device exists, the optimizer accepts its arguments, the best-checkpoint metric is one the task
reports, the run directory is a directory and holds the same config (or
``allow_config_change``). A mistake there is one `ConfigError` and leaves the directory as it
was: ``params.yaml`` is written (and, for a changed config, the old one kept as
``params.<time>.yaml``) only once the run has started.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cadence.callbacks.loss_guard import LossGuard
from cadence.callbacks.progress import ProgressBar
from cadence.core.callbacks import Callback
from cadence.core.checkpoint_dir import CheckpointDirectory
from cadence.core.controller import Action, Controller
from cadence.core.errors import CheckpointError, ConfigError, DivergenceError, StorageError
from cadence.core.notebook import show_log_lines
from cadence.core.rank import process_rank, world_size
from cadence.core.run_dir import RunDirectory
from cadence.core.slurm import SlurmOptions, adopt_launch_environment
from cadence.core.storage import name_newest, storage_error
from cadence.core.summary import SummaryManager, WriterSpec, close_summaries, writer_factory
from cadence.engine.checkpoint import CheckpointManager
from cadence.engine.checkpoint_writer import check_shared_directory
from cadence.engine.distributed import CollectiveTimeout, gather_objects
from cadence.engine.exporter import BestCheckpointExporter
from cadence.engine.fault_tolerance import ReplicaGroups, ReplicaOptions
from cadence.engine.runtime import Runtime
from cadence.records.run_record import RunRecord
from cadence.task.build_checks import built_model
from cadence.task.chosen_weights import chosen_weights, load_chosen
from cadence.task.config import ExperimentConfig
from cadence.task.config_callbacks import check_config_callbacks, config_callbacks
from cadence.task.config_files import (
    check_saved_config,
    flatten_config,
    load_config,
    run_directory,
    save_run_config,
)
from cadence.task.optimization import create_optimizer
from cadence.task.registry import get_task
from cadence.task.run_checks import (
    check_arguments,
    check_before_writing,
    check_best_metric,
    evaluation_metric_names,
    replica_options,
)
from cadence.task.task import Task
from cadence.task.trainer import Trainer, config_runtime

logger = logging.getLogger("cadence")

def start_runtime(config: ExperimentConfig) -> Runtime:
    """Applies ``config.runtime``: threads, determinism, seeds; joins the job and builds this
    process's place in it from ``runtime.parallelism`` (`cadence.engine.runtime`).

    Raises:
        ConfigError: for degrees that do not make the job's world size, or a layout that
            cannot work (one line, before anything is written).
    """
    runtime = config.runtime
    if runtime.num_threads is not None:
        torch.set_num_threads(runtime.num_threads)
    if runtime.deterministic:
        torch.use_deterministic_algorithms(True)
    if runtime.seed is not None:
        random.seed(runtime.seed)
        np.random.seed(runtime.seed)
        torch.manual_seed(runtime.seed)
    return config_runtime(config)


def agree_on_run(run: RunDirectory) -> None:
    """Checks that every rank of a distributed job works in the same run directory.

    Raises:
        ConfigError: naming the directories, when the ranks were given different ones.
    """
    roots = gather_objects(str(run.root.absolute()))
    if len(set(roots)) > 1:
        raise ConfigError(
            "The ranks of this job were given different run directories ("
            + ", ".join(f"rank {rank}: {root}" for rank, root in enumerate(roots))
            + "). They must share one, on a filesystem every node mounts: pass the same "
            "--model-dir to every node, or none (rank 0 then chooses it)."
        )


def agree_on_checkpoint(manager: CheckpointManager) -> None:
    """Checks that every rank sees one checkpoint directory (`check_shared_directory`: before
    step 0, not at the first save) and the same newest checkpoint in it, before restoring it.

    Raises:
        CheckpointError: naming what each rank sees (the checkpoint directory is not shared,
            or a rank sees a half-synchronized copy).
    """
    if not manager.read_only:
        check_shared_directory(manager.directory)
    seen = gather_objects(manager.latest_checkpoint)
    if len(set(seen)) > 1:
        raise CheckpointError(
            "The ranks see different newest checkpoints ("
            + ", ".join(f"rank {rank}: {path or 'none'}" for rank, path in enumerate(seen))
            + f") in {str(manager.directory)!r}: the run directory must be on a filesystem "
            "every node mounts."
        )


def create_writers(config: ExperimentConfig, run: RunDirectory) -> list[WriterSpec]:
    """The metric writers ``runtime.writers`` names, with the options of ``runtime.mlflow`` and
    ``runtime.wandb``; MLflow and W&B keep their run in the model directory.

    An MLflow experiment or W&B project that neither the config nor the environment names is
    the config's `experiment` (``digits``).
    """
    runtime = config.runtime
    experiment = config.experiment or None
    options: dict[str, dict[str, Any]] = {
        "mlflow": {"tracking_uri": runtime.mlflow.tracking_uri,
                   "experiment_name": (runtime.mlflow.experiment_name
                                       or os.environ.get("MLFLOW_EXPERIMENT_NAME") or experiment),
                   "run_name": runtime.mlflow.run_name},
        "wandb": {"project": (runtime.wandb.project or os.environ.get("WANDB_PROJECT")
                              or experiment),
                  "entity": runtime.wandb.entity, "mode": runtime.wandb.mode,
                  "dir": runtime.wandb.dir, "name": runtime.wandb.name},
    }
    writers: list[WriterSpec] = []
    for name in runtime.writers:
        factory = writer_factory(name, run.root)
        writers.append(functools.partial(factory, **options[name]) if name in options
                       else factory)
    return writers


def create_summaries(config: ExperimentConfig, run: RunDirectory,
                     global_step: Callable[[], int], groups: ReplicaGroups | None = None,
                     trains: bool = True) -> tuple[SummaryManager, SummaryManager]:
    """The train and eval summary managers of the run (one, when both write to one directory);
    a replica group of a fault-tolerant job writes its training summaries in
    ``train/replica-<g>``, and the evaluations -- the same in every group -- when it is the
    group that writes the checkpoints.

    While training (`trains`), an evaluation of a step evaluated before replaces its records:
    training resumed from a checkpoint made that step again, and its earlier evaluation was of
    the run's abandoned continuation. An evaluation job's records (``cadence eval``,
    ``continuous_eval``) are added beside the training's, each naming the weights it read:
    an evaluation never rewrites what training recorded (the record that chose a best export
    among them).

    Raises:
        ConfigError: when a writer's library is not installed (on rank 0, the one that writes).
    """
    writers = create_writers(config, run)
    train_dir = (run.train if groups is None
                 else run.train / f"replica-{groups.options.replica_id}")
    try:
        train = SummaryManager(train_dir, global_step, writers=writers, run_dir=run.root)
        if run.eval == run.train and groups is None:
            return train, train
        return train, SummaryManager(run.eval, global_step, writers=writers, run_dir=run.root,
                                     replace_steps=trains, writes=_writer_of(groups))
    except ImportError as error:
        raise ConfigError(f"runtime.writers: {error}") from None


def create_trainer(config: ExperimentConfig, task: Task, train: bool, evaluate: bool,
                   checkpoint_exporter: BestCheckpointExporter | None = None,
                   replicas: ReplicaGroups | None = None) -> Trainer:
    """The `Trainer` for `task`: the model from ``task.build_model()`` and the optimizer from
    ``config.trainer.optimizer_config``."""
    model = built_model(task)
    try:
        optimizer = create_optimizer(config.trainer.optimizer_config.optimizer, model)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return Trainer(config, task, model, optimizer, train=train, evaluate=evaluate,
                   checkpoint_exporter=checkpoint_exporter, replicas=replicas)


def maybe_create_best_ckpt_exporter(config: ExperimentConfig, run: RunDirectory,
                                    groups: ReplicaGroups | None = None,
                                    ) -> BestCheckpointExporter | None:
    """The exporter that ``trainer.best_checkpoint_*`` asks for, or None when either the
    sub-directory or the metric is empty. With replica groups every group decides, and the
    group that writes the checkpoints writes the exports: once."""
    trainer = config.trainer
    if not trainer.best_checkpoint_export_subdir or not trainer.best_checkpoint_eval_metric:
        return None
    return BestCheckpointExporter(
        run.best, trainer.best_checkpoint_eval_metric,
        trainer.best_checkpoint_metric_comp, trainer.best_checkpoint_max_to_keep,
        writes=_writer_of(groups),
    )


def _writer_of(groups: ReplicaGroups | None) -> Callable[[], bool] | None:
    """Whether this replica group writes what every group computes alike (checkpoints,
    evaluations, exports): the first of the live groups, asked at each write; None without
    replica groups (the job's rank 0 writes)."""
    return (lambda: groups.writes_checkpoints) if groups is not None else None


def run_experiment(
    config: ExperimentConfig | str,
    mode: str,
    model_dir: str | os.PathLike[str],
    *,
    callbacks: Iterable[Callback] = (),
    train_actions: Iterable[Action] = (),
    eval_actions: Iterable[Action] = (),
    progress_bar: bool | None = None,
    allow_config_change: bool = False,
    checkpoint: str | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Runs `mode` of the experiment `config` in `model_dir` (see the module docstring).

    Args:
        config: the final config (see `cadence.load_config`); it is locked (see
            `cadence.task.config.Config.lock`) -- use ``config.replace()`` for a changed copy.
            Or an experiment as `cadence.load_config` takes it, run with its defaults:
            ``"digits"``, ``"mymodels:my_experiment"``, ``"path/to/mymodels.py:NAME"``.
        mode: one of `MODES`.
        model_dir: the run's directory; training in it again resumes.
        callbacks: more callbacks for the Controller (after the built-in ones).
        train_actions: Orbit-style actions called with each loop's logs.
        eval_actions: Orbit-style actions called with each evaluation's logs.
        progress_bar: show a progress bar; None: when stderr is a terminal.
        allow_config_change: continue a run whose saved config differs.
        checkpoint: in ``eval`` mode, the weights to evaluate: ``"latest"`` (None: the newest
            checkpoint), ``"best"`` (the best export) or a path (`cadence.task.chosen_weights`).
            (A str or an ``os.PathLike``.)

    Returns:
        ``(model, eval_logs)``: the trained model and the last evaluation's logs ({} if none;
        for a finished run of an evaluating training mode, its final evaluation's).

    Raises:
        ValueError: for an unknown mode.
        TypeError: if `config` is neither an `ExperimentConfig` nor an experiment's name, or
            another argument is of the wrong kind (`model_dir` not a path, `callbacks` not a
            list of `Callback` objects, ...): the message names it and what it must be.
        ConfigError: for an experiment that cannot be loaded (`cadence.load_config`); for a
            config that cannot run (``trainer.train_steps`` = 0 in a training
            mode, a device that does not exist, an optimizer argument it does not take, a best
            or early-stopping metric the task does not report, early stopping in a training
            mode without evaluations), or if `model_dir` is a file or holds a run with
            another config. Nothing is written then.
        CheckpointError: in ``eval`` mode, if `model_dir` has no checkpoint; or if none of its
            checkpoints can be restored.
        RunLockedError: if another process trains in `model_dir` (evaluation modes do not
            take the lock).
        Preempted: after SIGTERM or Ctrl-C, once a checkpoint is saved.
        KeyboardInterrupt: instead of `Preempted`, after Ctrl-C in a notebook.
        DivergenceError: (a `FloatingPointError` and a `RuntimeError`) when the loss diverges
            and the recovery policy says to stop.
        StorageError: when the machine fails a write of the run -- at the start, during
            training or at the end, whichever writer meets it (a checkpoint, an export, the
            summaries, the config, the lock): one line naming what failed and the newest good
            checkpoint; nothing half-written is listed, and the same call resumes once the
            cause is gone.
    """
    model_dir, callbacks, train_actions, eval_actions = check_arguments(
        mode, model_dir, callbacks, train_actions, eval_actions, progress_bar,
        allow_config_change, checkpoint)
    show_log_lines()  # to the terminal, unless the user configured logging
    if isinstance(config, str):
        config = load_config(config)
    if not isinstance(config, ExperimentConfig):
        raise TypeError(f"`config` (got {type(config).__name__}) must be an ExperimentConfig "
                        "or an experiment's name ('digits', 'mymodels:my_experiment'): build "
                        "it with cadence.load_config(...).")
    config.validate()
    config.lock()  # as TF Model Garden: nothing changes the config of a running experiment
    adopt_launch_environment()  # under srun: this process's rank, before the lock asks for it
    run = run_directory(config, model_dir)
    trains = mode.startswith("train")
    if checkpoint is not None and mode != "eval":
        raise ConfigError(f"A checkpoint to evaluate ({checkpoint!r}) is for mode 'eval'; "
                          f"{mode!r} evaluates the checkpoints training writes.")
    chosen = chosen_weights(checkpoint, run)
    check_before_writing(config, mode, run, chosen)
    replicas = replica_options(config, mode)
    created = not run.root.exists()
    lock = (run.training_lock(replicas.replica_id if replicas is not None else None)
            if trains and process_rank() == 0 else contextlib.nullcontext())
    try:
        with lock:
            differences = check_saved_config(config, run, allow_config_change) if trains else []
            return _run(config, mode, run, differences, callbacks=callbacks,
                        train_actions=train_actions, eval_actions=eval_actions,
                        progress_bar=progress_bar, chosen=chosen, replicas=replicas)
    except BaseException as error:
        if created and trains and not run.params.exists():
            _remove_unstarted(run)  # a start that failed leaves no run directory behind
        storage = _storage_error(error, run)
        if storage is None or storage is error:
            raise
        raise storage from error


def _storage_error(error: BaseException, run: RunDirectory) -> StorageError | None:
    """`error` as a `StorageError` (`cadence.core.storage`) that names the run's newest good
    checkpoint, when the machine caused it (a full disk met by any writer); else None."""
    storage = storage_error(f"Using the run directory {str(run.root)!r}", error)
    if storage is not None and storage.newest is None:
        latest = None
        with contextlib.suppress(CheckpointError, OSError):
            latest = CheckpointDirectory(run.checkpoints, None).latest()
        name_newest(storage, None if latest is None else (str(latest.path), latest.step))
    return storage


# The engine's errors name the engine's arguments; a Task run sets them through its config.
_CONFIG_KEYS: dict[type[BaseException], str] = {
    DivergenceError: "In the Task config: trainer.optimizer_config.gradient_clip_norm clips the "
                     "gradients, trainer.recovery_max_trials is LossGuard's max_trials and "
                     "trainer.checkpoint_interval the checkpoint interval.",
    CollectiveTimeout: "In the Task config, the process group's timeout is "
                       "runtime.collective_timeout.",
}


def in_config_terms(error: BaseException) -> BaseException:
    """`error`, or for an engine error that names engine arguments a Task config sets, the same
    error with a sentence naming the config keys."""
    keys = _CONFIG_KEYS.get(type(error))
    return error if keys is None else type(error)(f"{error} {keys}")


def _remove_unstarted(run: RunDirectory) -> None:
    """Removes the lock file, the timeline and the empty directories of a run that never
    started."""
    with contextlib.suppress(OSError):
        run.lock_file.unlink()
    for path in (run.timeline.glob("*.jsonl") if run.timeline.is_dir() else ()):
        with contextlib.suppress(OSError):
            path.unlink()
    for path in sorted(run.root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir():
            with contextlib.suppress(OSError):
                path.rmdir()  # only empty ones
    with contextlib.suppress(OSError):
        run.root.rmdir()


def _run(config: ExperimentConfig, mode: str, run: RunDirectory, differences: list[str], *,
         callbacks: Iterable[Callback], train_actions: Iterable[Action],
         eval_actions: Iterable[Action], progress_bar: bool | None,
         chosen: Path | None = None,
         replicas: ReplicaOptions | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """`run_experiment` once its arguments are checked: joins the job (and the replica groups),
    builds the run, restores it, runs `mode`. A training process records its attempt in the
    run's timeline (rank 0 under the run's lock, every rank its own waits) from the moment its
    parts are built and checked -- a mistake refused before then writes nothing -- to how it
    ends. An evaluation job records nothing."""
    trains = mode.startswith("train")
    start_runtime(config)
    agree_on_run(run)
    groups = (ReplicaGroups(replicas, process_rank(), world_size())
              if replicas is not None else None)
    record = (RunRecord(run.root, rank=process_rank(),
                        replica=replicas.replica_id if replicas is not None else None,
                        waits=groups.waits if groups is not None else None)
              if trains else None)
    try:
        parts = _RunParts.build(config, mode, run, record, groups)
        if record is not None:
            record.begin(world_size(),
                         replicas.settings.replica_groups if replicas is not None else None)
            record.timeline.setup_end()
        parts.restore(chosen)
        controller = parts.controller(progress_bar, [*callbacks], train_actions, eval_actions,
                                      chosen)
        if trains:
            parts.start_run_directory(differences)
        logs = parts.run_mode(controller, chosen)
    except BaseException as error:
        if record is not None:
            record.finish(error)
        raise
    finally:
        if groups is not None:
            groups.shutdown()
    if record is not None:
        record.finish(None)
    return parts.trainer.model, logs


@dataclass
class _RunParts:
    """What `run_experiment` builds for a run, and its steps with them."""

    config: ExperimentConfig
    mode: str
    run: RunDirectory
    trainer: Trainer
    manager: CheckpointManager
    state: Any
    """What the manager restores: the trainer, or an evaluation's model, step and EMA."""
    record: RunRecord | None
    groups: ReplicaGroups | None
    summaries: tuple[SummaryManager, SummaryManager] | None = None

    @classmethod
    def build(cls, config: ExperimentConfig, mode: str, run: RunDirectory,
              record: RunRecord | None, groups: ReplicaGroups | None) -> _RunParts:
        """The task (its best metric and callbacks' metrics checked), the exporter, the
        Trainer and the checkpoint manager."""
        trains, evaluates = mode.startswith("train"), mode != "train"
        trainer_config = config.trainer
        task = get_task(config.task, logging_dir=str(run.root))
        names = evaluation_metric_names(task)  # builds the evaluation metrics once, to name them
        if evaluates:
            check_best_metric(config, task, names)
        check_config_callbacks(config, mode, names)
        exporter = maybe_create_best_ckpt_exporter(config, run, groups) if evaluates else None
        trainer = create_trainer(config, task, train=trains, evaluate=evaluates,
                                 checkpoint_exporter=exporter, replicas=groups)
        state: Any = trainer
        if not trains:  # an evaluation reads the weights (and the step) of training's
            state = {"model": trainer.model, "progress": trainer.progress}
            if trainer.ema is not None:
                state["ema"] = trainer.ema_state
        manager = CheckpointManager(
            state, run.checkpoints, max_to_keep=trainer_config.max_to_keep,
            checkpoint_interval=trainer_config.checkpoint_interval, init_fn=trainer.initialize,
            strict=trains, read_only=not trains,
            async_save=trainer_config.async_checkpoints and trains,
            on_commit=record.timeline.commit if record is not None else None,
            writes=_writer_of(groups),
            writer=f"r{groups.options.replica_id}" if groups is not None else "")
        return cls(config, mode, run, trainer, manager, state, record, groups)

    def restore(self, chosen: Path | None) -> None:
        """Checks that the ranks see one checkpoint directory, for the Controller's restore --
        or loads the chosen weights an evaluation asked for."""
        if chosen is None:
            agree_on_checkpoint(self.manager)
        else:  # evaluating chosen weights: the manager restores nothing
            logger.info("Evaluating %s (step %d).", chosen,
                        load_chosen(chosen, self.state, self.trainer))
        self.trainer.coordinator_for_async().add_waitable(self.manager)

    def controller(self, progress_bar: bool | None, callbacks: list[Callback],
                   train_actions: Iterable[Action], eval_actions: Iterable[Action],
                   chosen: Path | None) -> Controller:
        """The Controller of the run, with its summaries and built-in callbacks (the progress
        bar and the loss guard of a training mode, then the config's) before the user's; it
        restores the newest checkpoint as it is made, unless chosen weights are evaluated."""
        config, mode, trainer = self.config, self.mode, self.trainer
        trains, evaluates = mode.startswith("train"), mode != "train"
        trainer_config = config.trainer
        groups = self.groups
        summaries, eval_summaries = self.summaries = create_summaries(
            config, self.run, lambda: trainer.global_step, groups, trains=trains)
        builtin: list[Callback] = [ProgressBar(enabled=progress_bar)] if trains else []
        if trains:
            builtin.append(LossGuard("training_loss", trainer_config.loss_upper_bound,
                                     trainer_config.recovery_begin_steps,
                                     trainer_config.recovery_max_trials))
        builtin.extend(config_callbacks(config, mode))  # summary, early stopping, time, ...
        return Controller(
            trainer=trainer if trains else None,
            evaluator=trainer if evaluates else None,
            steps_per_loop=trainer_config.steps_per_loop if trains else None,
            checkpoint_manager=self.manager if chosen is None else None,
            summary_manager=summaries, summary_interval=trainer_config.summary_interval,
            eval_summary_manager=eval_summaries, callbacks=[*builtin, *callbacks],
            train_actions=train_actions, eval_actions=eval_actions, run_dir=self.run,
            record=self.record, slurm=SlurmOptions(config.runtime.slurm.signal,
                                                   config.runtime.slurm.requeue))

    def start_run_directory(self, differences: list[str]) -> None:
        """The run has started: its config is the directory's from now on (`params.yaml`), and
        the writers that keep hyper-parameters get them. (A continued run says from where as
        it starts training: the Controller records it.)"""
        config = self.config
        assert self.summaries is not None
        save_run_config(config, self.run, differences)
        self.summaries[0].write_hparams(flatten_config(config))  # MLflow params, W&B config

    def run_mode(self, controller: Controller, chosen: Path | None) -> dict[str, Any]:
        """Runs the mode through `controller`; returns its last evaluation's logs. However it
        ends, the background work is joined and the writers closed with the outcome."""
        config, mode, manager = self.config, self.mode, self.manager
        trainer_config = config.trainer
        eval_logs: dict[str, Any] | None = None
        error: BaseException | None = None  # how the run ends: MLflow's status, W&B's code
        try:
            if mode == "train":
                controller.train(trainer_config.train_steps)
            elif mode in ("train_and_eval", "train_and_post_eval"):
                # train_and_post_eval: training, then one evaluation; the final checkpoint is
                # saved after it, so that a finished run run again knows it happened.
                eval_logs = controller.train_and_evaluate(
                    trainer_config.train_steps, trainer_config.validation_steps,
                    trainer_config.validation_interval if mode == "train_and_eval" else None)
            elif mode == "eval":
                if chosen is None and manager.latest_checkpoint is None:
                    logger.warning("No checkpoint in %s: evaluating the weights of "
                                   "task.init_checkpoint.", manager.directory)
                eval_logs = controller.evaluate(trainer_config.validation_steps,
                                                weights=str(chosen) if chosen else None)
            else:
                eval_logs = controller.evaluate_continuously(
                    trainer_config.validation_steps,
                    timeout=trainer_config.continuous_eval_timeout,
                    stop_at_step=trainer_config.train_steps or None)
        except BaseException as raised:
            error = in_config_terms(raised)
            if error is raised:
                raise
            raise error from raised
        finally:
            self._end(controller, error)
            del error  # its traceback holds the trainer's frames
        return dict(eval_logs or {})

    def _end(self, controller: Controller, error: BaseException | None) -> None:
        """Joins the background work, closes the Controller and closes the writers with the
        run's outcome -- each, whatever the others do, so that no file is left open (a full
        disk fails them all). A failure there is raised when the run went well; when it ends
        on its own error, that one is reported and this one logged."""
        assert self.summaries is not None
        try:
            with contextlib.ExitStack() as ending:  # runs the last first
                ending.callback(close_summaries, error, close=list(self.summaries))
                ending.callback(controller.close)
                ending.callback(self.trainer.join)
        except Exception as failed:
            if error is None:
                raise
            logger.warning("Ending the run failed too: %s", failed)
