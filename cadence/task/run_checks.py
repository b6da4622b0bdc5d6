"""What is checked of a run before anything is written: the kinds of `run_experiment`'s
arguments, its mode, its directory, its device and the weights it starts from, its best metric
against what its task reports, and its place among replica groups. A mistake here is one
`ConfigError` (or `CheckpointError`, or a `TypeError` for an argument of the wrong kind) and
leaves the run directory as it was; what the config's values alone decide is
`cadence.task.config_checks`'.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from cadence.core.arguments import check_bool, check_path, check_run_hooks, check_str
from cadence.core.callbacks import Callback
from cadence.core.checkpoint_dir import CheckpointDirectory
from cadence.core.controller import Action
from cadence.core.errors import CheckpointError, ConfigError
from cadence.core.rank import world_size
from cadence.core.run_dir import PARAMS_FILE, RunDirectory
from cadence.engine.fault_tolerance import LIGHTHOUSE_HINT, ReplicaOptions
from cadence.engine.parallel_dims import resolve_layout
from cadence.engine.runtime import graphs_available, local_device
from cadence.engine.strategies import stages_per_rank
from cadence.task.build_checks import built_metrics
from cadence.task.config import ExperimentConfig
from cadence.task.config_checks import MODES, replica_id_problem
from cadence.task.task import Task

logger = logging.getLogger("cadence")


def check_mode(mode: str) -> str:
    """Returns `mode` if it is one of `MODES`.

    Raises:
        ValueError: naming the valid modes.
    """
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}; valid: {', '.join(MODES)}.")
    return mode


def check_arguments(mode: Any, model_dir: Any, callbacks: Any, train_actions: Any,
                    eval_actions: Any, progress_bar: Any, allow_config_change: Any,
                    checkpoint: Any) -> tuple[Path, list[Callback], list[Action], list[Action]]:
    """`run_experiment`'s arguments of the wrong kind, refused before anything is made (each
    names the argument and what it must be); returns `model_dir` as a path, and the callbacks
    and actions as lists (a generator is read once, here).

    Raises:
        TypeError: for an argument of the wrong kind.
        ValueError: for an unknown mode.
    """
    owner = "run_experiment"
    check_str(owner, "mode", mode, "e.g. run_experiment(config, 'train_and_eval', 'runs/mine')")
    check_mode(mode)
    path = check_path(owner, "model_dir", model_dir,
                      "the run's directory, e.g. run_experiment(config, mode, 'runs/mine')")
    checked, train, evaluation = check_run_hooks(owner, callbacks, train_actions,
                                                 eval_actions)
    check_bool(owner, "progress_bar", progress_bar,
               "e.g. progress_bar=False (None: when stderr is a terminal)", none_ok=True)
    check_bool(owner, "allow_config_change", allow_config_change,
               "e.g. allow_config_change=True")
    check_path(owner, "checkpoint", checkpoint,
               "e.g. checkpoint='best', 'latest' or the path of a checkpoint", none_ok=True)
    assert path is not None
    return path, checked, train, evaluation


def check_before_writing(config: ExperimentConfig, mode: str, run: RunDirectory,
                          chosen: Path | None = None) -> None:
    """What can be known wrong before anything is built or written, as `ConfigError`s."""
    trainer = config.trainer
    if mode.startswith("train") and trainer.train_steps <= 0:
        raise ConfigError("trainer.train_steps is 0: set it, e.g. --set "
                          "trainer.train_steps=1000.")
    problem = run.layout_problem(training=mode.startswith("train"))
    if problem is not None:
        raise ConfigError(problem)
    try:
        device = local_device(config.runtime.device, "runtime.device")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    degrees = config.runtime.parallelism  # the launcher's world size, before the ranks meet
    dims, _ = resolve_layout(world_size(), config.runtime.strategy,
                             dp_replicate=degrees.dp_replicate, dp_shard=degrees.dp_shard,
                             tp=degrees.tp, pp=degrees.pp, cp=degrees.cp)
    if dims.pp > 1 and mode.startswith("train"):
        check_microbatches(config, dims.dp_size)
    if trainer.cuda_graphs and (device.type == "cpu" or not graphs_available()):
        raise ConfigError(f"trainer.cuda_graphs is true but the device is {device}: CUDA graphs "
                          "replay recorded GPU kernels. Set trainer.cuda_graphs=false (and "
                          "trainer.compile_step=true to compile), or run on a GPU.")
    init = Path(config.task.init_checkpoint) if config.task.init_checkpoint else None
    if init is not None and not init.exists():
        raise ConfigError(f"task.init_checkpoint {str(init)!r} does not exist: pass a "
                          ".safetensors file, a best-export directory, a checkpoint "
                          "(ckpt-<step>) or a directory of checkpoints.")
    if init is not None and init.is_file() and init.suffix != ".safetensors":
        raise ConfigError(f"task.init_checkpoint {str(init)!r} is a file but not a "
                          ".safetensors file: pass a .safetensors file, a best-export "
                          "directory, a checkpoint (ckpt-<step>) or a directory of checkpoints.")
    if mode == "eval" and chosen is None and not config.task.init_checkpoint and (
            CheckpointDirectory(run.checkpoints, None).latest() is None):
        runs = sorted(str(p.parent) for p in run.root.glob(f"*/{PARAMS_FILE}"))
        hint = (f" It holds run directories ({', '.join(runs[:3])}"
                f"{', ...' if len(runs) > 3 else ''}): pass one of them." if runs else
                " Train first (cadence train), or pass the directory of a trained run.")
        raise CheckpointError(f"{str(run.root)!r} has no checkpoint to evaluate (nothing "
                              f"complete in {str(run.checkpoints)!r}).{hint}")


def check_microbatches(config: ExperimentConfig, data_shards: int) -> None:
    """Refuses pipeline microbatches that do not divide each data shard's batch.

    Raises:
        ConfigError: naming the batch, the data shards and the microbatches.
    """
    degrees = config.runtime.parallelism
    batch = config.task.train_data.global_batch_size
    microbatches = degrees.pp_microbatches or degrees.pp * stages_per_rank(
        degrees.pp_schedule, degrees.pp_stages_per_rank)
    if batch % data_shards == 0 and (batch // data_shards) % microbatches == 0:
        return
    raise ConfigError(
        f"runtime.parallelism.pp_microbatches={microbatches} must divide each data shard's "
        f"batch (task.train_data.global_batch_size={batch} over {data_shards} data "
        f"shard{'s' if data_shards > 1 else ''}): choose a global batch size that is a multiple "
        f"of {data_shards * microbatches}, or other microbatches.")


def evaluation_metric_names(task: Task) -> set[str] | None:
    """The names an evaluation of `task` reports, or None when they cannot be known before
    it runs (the task reduces aggregated logs of its own)."""
    if type(task).reduce_aggregated_logs is not Task.reduce_aggregated_logs:
        return None
    return {"validation_loss", *built_metrics(task, training=False)}


def check_best_metric(config: ExperimentConfig, task: Task, names: set[str] | None) -> None:
    """Checks ``trainer.best_checkpoint_eval_metric`` against the metrics `task` reports
    (`names`, from `evaluation_metric_names`; None: unknown before it runs), before training,
    rather than at the first evaluation (which would lose the checkpoint due then).

    Raises:
        ConfigError: naming the metrics there are.
    """
    metric = config.trainer.best_checkpoint_eval_metric.replace("|", "/")
    if not metric or not config.trainer.best_checkpoint_export_subdir:
        return
    # A metric whose result is a dict reports "<name>/<key>" for each of its keys.
    if names is not None and not any(metric == n or metric.startswith(f"{n}/") for n in names):
        raise ConfigError(
            f"trainer.best_checkpoint_eval_metric (got {metric!r}) is not a metric "
            f"{type(task).__name__} reports; it reports: {', '.join(sorted(names))}. Set it to "
            "one of them, or to '' to export no best weights."
        )


def replica_options(config: ExperimentConfig, mode: str) -> ReplicaOptions | None:
    """Where this process's replica group stands, when ``runtime.fault_tolerance`` is enabled
    and `mode` trains (its id and the lighthouse from the config, else from
    ``REPLICA_GROUP_ID`` and ``TORCHFT_LIGHTHOUSE``); None otherwise: the evaluation modes
    (``eval``, ``continuous_eval``) of a run trained by replica groups evaluate it as one job.

    Raises:
        ConfigError: for an id or a lighthouse that is missing or does not fit.
    """
    ft = config.runtime.fault_tolerance
    if not ft.enabled:
        return None
    key = "runtime.fault_tolerance"
    if not mode.startswith("train"):  # the mode is for training: one job evaluates the run
        logger.info("%s.enabled is for training: %s evaluates as one job.", key, mode)
        return None
    replica_id = ft.replica_id
    if replica_id is None:
        text = os.environ.get("REPLICA_GROUP_ID", "")
        if not text.isdigit():
            raise ConfigError(f"{key}.replica_id is not set and REPLICA_GROUP_ID is "
                              f"{text or 'not set'}: set one to this group's number, e.g. "
                              f"--set {key}.replica_id=0.")
        replica_id = int(text)
    problem = replica_id_problem(replica_id, ft.replica_groups)  # REPLICA_GROUP_ID's here
    if problem is not None:
        raise ConfigError(problem)
    lighthouse = ft.lighthouse or os.environ.get("TORCHFT_LIGHTHOUSE", "")
    if not lighthouse:
        raise ConfigError(f"{key}.lighthouse is not set and TORCHFT_LIGHTHOUSE is not set: "
                          f"{LIGHTHOUSE_HINT}.")
    return ReplicaOptions(replica_id, lighthouse, ft)
