"""Experiment configuration (seed 002): the typed dataclasses of a run's config.

An `ExperimentConfig` has three parts: `task` (what to train: data, model), `trainer` (how:
optimizer, schedule, steps, intervals, exports) and `runtime` (where: device, precision, seed).
Experiments subclass `TaskConfig` for their own fields (a model size, a dataset option).
`cadence.task.config_files` loads them from experiments, YAML files and overrides, strictly.

>>> config = ExperimentConfig()
>>> config.trainer.steps_per_loop
100
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cadence.core.errors import ConfigError
from cadence.core.summary import DEFAULT_WRITERS
from cadence.task.config_checks import config_problems

C = TypeVar("C", bound="Config")

# ---------------------------------------------------------------------------- locking


class Config:
    """The base of every config dataclass: a config can be locked (TF Model Garden locks the
    config it parsed), after which assigning to any of its fields -- or to those of the configs
    nested in it that derive from `Config` -- raises `ConfigError`. `cadence.run_experiment`
    locks the config it runs, so that nothing changes it under a running experiment.

    Lists and dicts held by a locked config are not frozen; the lock covers assignments.

    >>> config = ExperimentConfig()
    >>> config.lock()
    >>> config.trainer.train_steps = 10
    Traceback (most recent call last):
    ...
    cadence.core.errors.ConfigError: Cannot set trainer.train_steps...: the config is locked...
    """

    def lock(self) -> None:
        """Locks this config and every `Config` nested in it."""
        for value in _nested_configs(self):
            value.lock()
        object.__setattr__(self, "_locked", True)

    @property
    def locked(self) -> bool:
        """Whether assignments are refused."""
        return bool(self.__dict__.get("_locked", False))

    def replace(self: C, **changes: Any) -> C:
        """An unlocked deep copy with `changes` to its top-level fields (Model Garden's `replace`);
        a mapping for a sub-config merges into it (the keys it names change, the others stay).

        Raises:
            ConfigError: for a key that is not a field, naming the valid ones.
        """
        clone = copy.deepcopy(self)
        _unlock(clone)
        fields = {item.name for item in dataclasses.fields(clone)}  # type: ignore[arg-type]
        merged: dict[str, Any] = {name: value for name, value in changes.items() if isinstance(
            value, Mapping) and isinstance(getattr(clone, name, None), Config)}
        merged.update(dict.fromkeys(changes.keys() - fields))  # unknown: merge_config raises
        if merged:  # OmegaConf's merge, as load_config's
            from omegaconf import OmegaConf
            base = OmegaConf.structured(clone)
            clone = OmegaConf.to_object(merge_config(base, merged, "replace"))  # type: ignore[assignment]
        for name in changes.keys() - merged.keys():
            setattr(clone, name, changes[name])
        return clone

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_locked", False):
            path = _PATHS.get(type(self).__name__, type(self).__name__)
            raise ConfigError(
                f"Cannot set {path}.{name} (got {value!r}): the config is locked (run_experiment "
                "locks the config it runs). Change it before running, or make a changed copy "
                f"with config.replace(...).")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if self.__dict__.get("_locked", False):
            raise ConfigError(f"Cannot delete {name!r}: the config is locked.")
        object.__delattr__(self, name)


_PATHS = {"ExperimentConfig": "config", "TrainerConfig": "trainer", "RuntimeConfig": "runtime",
          "OptimizationConfig": "trainer.optimizer_config",
          "OptimizerConfig": "trainer.optimizer_config.optimizer",
          "LearningRateConfig": "trainer.optimizer_config.learning_rate",
          "EMAConfig": "trainer.ema", "MLflowConfig": "runtime.mlflow",
          "WandbConfig": "runtime.wandb", "EarlyStoppingConfig": "trainer.early_stopping",
          "ProfilerConfig": "runtime.profiler",
          "FaultToleranceConfig": "runtime.fault_tolerance"}
"""Where the built-in config classes sit in an `ExperimentConfig`, for error messages."""


def config_error(error: Exception, source: str, base: Any) -> ConfigError:
    """Turns an OmegaConf error into a `ConfigError` that names the key and the valid ones."""
    from omegaconf import OmegaConf, errors
    full_key = str(getattr(error, "full_key", "") or "")
    parent_key, _, leaf = full_key.rpartition(".")
    if isinstance(error, errors.ConfigKeyError) and full_key:
        parent = OmegaConf.select(base, parent_key) if parent_key else base
        valid = [str(k) for k in parent] if hasattr(parent, "keys") else []
        hint = "".join(f" Did you mean {'.'.join(filter(None, [parent_key, close]))!r}?"
                       for close in difflib.get_close_matches(leaf, valid, n=1))
        where = f"'{parent_key}'" if parent_key else "the config"
        return ConfigError(f"{source}: unknown key {full_key!r}.{hint} Valid keys of {where}: "
                           f"{', '.join(valid)}.")
    first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
    return ConfigError(f"{source}: {f'{full_key!r}: ' if full_key else ''}{first_line}.")


def merge_config(base: Any, update: Any, source: str) -> Any:
    """OmegaConf's merge of `update` into `base`, its errors as `ConfigError` (`config_error`)."""
    from omegaconf import OmegaConf, errors
    try:
        return OmegaConf.merge(base, update)
    except errors.OmegaConfBaseException as error:
        raise config_error(error, source, base) from None


def _nested_configs(config: Config) -> Iterable[Config]:
    for item in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, item.name)
        values = value if isinstance(value, (list, tuple)) else (
            value.values() if isinstance(value, dict) else (value,))
        yield from (v for v in values if isinstance(v, Config))


def _unlock(config: Config) -> None:
    config.__dict__.pop("_locked", None)
    for value in _nested_configs(config):
        _unlock(value)


# ---------------------------------------------------------------------------- the schema


@dataclass
class DataConfig(Config):
    """One input pipeline (TF Model Garden's ``DataConfig``, for PyTorch data).

    Attributes:
        global_batch_size: examples per step summed over all processes; each process gets
            ``global_batch_size // world_size`` (see `InputContext`).
        is_training: whether this pipeline feeds training (shuffled, repeated by epochs).
            None: decided by where it is used.
        shuffle: shuffle the examples each epoch. None: when training.
        drop_remainder: drop the last incomplete batch.
        num_workers: DataLoader worker processes (0: load in the main process).
        seed: seed of the pipeline's own shuffling generator; None derives it from the
            runtime seed.
        split: which part of the data (e.g. "train", "validation"); its meaning is the task's.
        stateful_loader: `cadence.build_dataloader` returns torchdata's ``StatefulDataLoader``
            (``pip install torchdata``): checkpoints then hold the loader's own state, workers'
            included, instead of cadence's record of the index order (see ``docs/data.md``).
    """

    global_batch_size: int = 32
    is_training: bool | None = None
    shuffle: bool | None = None
    drop_remainder: bool = True
    num_workers: int = 0
    seed: int | None = None
    split: str = ""
    stateful_loader: bool = False


@dataclass
class TokenDataConfig(DataConfig):
    """An input pipeline of token files (`cadence.data.token_loader.build_token_inputs`).

    Attributes:
        input_path: TF Model Garden's key: a token file (nanoGPT's ``train.bin``: ``uint16``
            unless a ``manifest.json`` beside it says otherwise), a glob of them, a folder
            prepared by ``cadence prepare-data``, or several of these separated by commas. ""
            : the task's own data.
        input_weights: a mixture: one weight per comma-separated entry of `input_path`, each
            entry's share of the training samples. Empty: the entries are one source.
        packing: keep the documents of a sequence apart: position ids restart, no loss across
            a boundary, attention inside each document (needs a document index: prepared
            shards).
    """

    input_path: str = ""
    input_weights: list[float] = field(default_factory=list)
    packing: bool = False


@dataclass
class OptimizerConfig(Config):
    """A `torch.optim` optimizer.

    Attributes:
        name: one of ``sgd``, ``adam``, ``adamw``, ``rmsprop``, ``adagrad``.
        learning_rate: the peak learning rate (after warmup).
        weight_decay: L2 penalty (decoupled for ``adamw``).
        momentum: for ``sgd`` and ``rmsprop``.
        nesterov: Nesterov momentum for ``sgd``.
        betas: for ``adam`` and ``adamw``.
        eps: for ``adam``, ``adamw``, ``rmsprop``, ``adagrad``.
        kwargs: any other constructor argument of the optimizer class (e.g. ``fused: true``).
    """

    name: str = "adamw"
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.0
    nesterov: bool = False
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class LearningRateConfig(Config):
    """The learning-rate schedule: a linear warmup, then a decay, as a multiplier of the peak.

    Attributes:
        schedule: ``constant``, ``cosine``, ``linear``, ``step`` or ``exponential``.
        warmup_steps: steps of linear warmup from ``warmup_init_factor`` x the peak.
        warmup_init_factor: where warmup starts, as a fraction of the peak.
        decay_steps: steps of decay after warmup (cosine, linear); None: until
            ``trainer.train_steps``.
        end_factor: the final multiplier of cosine and linear decay.
        step_size: ``step``: multiply by ``gamma`` every this many steps.
        gamma: ``step`` and ``exponential`` (per step) decay factor.
    """

    schedule: str = "constant"
    warmup_steps: int = 0
    warmup_init_factor: float = 0.0
    decay_steps: int | None = None
    end_factor: float = 0.0
    step_size: int = 1000
    gamma: float = 0.1


@dataclass
class OptimizationConfig(Config):
    """The optimizer, its schedule, and what happens to gradients before the update.

    Attributes:
        gradient_clip_norm: clip the global gradient norm to this value; None: no clipping.
        gradient_accumulation_steps: micro-batches whose gradients add up to one update (one
            step); the loss of each is divided by this number.
    """

    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    learning_rate: LearningRateConfig = field(default_factory=LearningRateConfig)
    gradient_clip_norm: float | None = None
    gradient_accumulation_steps: int = 1


@dataclass
class EMAConfig(Config):
    """Exponential moving average of the weights, used for evaluation and exports. For a
    sharded model (FSDP2, tensor parallelism) the average is sharded as the model is: each rank
    averages its own shards; an evaluation gathers them.

    Attributes:
        enabled: keep the average.
        decay: the average's decay per step.
        dynamic_decay: ramp the decay up as ``min(decay, (1 + t) / (10 + t))`` so that early
            averages are not dominated by the random initialization.
        start_step: start averaging at this step (before it, the average copies the weights).
    """

    enabled: bool = False
    decay: float = 0.999
    dynamic_decay: bool = True
    start_step: int = 0


@dataclass
class EarlyStoppingConfig(Config):
    """Stops ``train_and_eval`` when an evaluation metric stops improving
    (`cadence.callbacks.EarlyStopping`, checked after every evaluation).

    Attributes:
        monitor: the evaluation metric (``accuracy``, ``validation_loss``; "a/b" or "a|b" for
            nested logs); "" disables early stopping.
        mode: ``min`` or ``max``; null infers it from the name (``accuracy``: max).
        patience: evaluations without improvement before training stops.
        min_delta: the smallest change that counts as an improvement.
        restore_best: when training ends, put the best weights back into the model that
            `run_experiment` returns (checkpoints keep the latest, so a resumed run goes on;
            ``trainer.best_checkpoint_*`` exports the best to disk).

    Its state is checkpointed: a run stopped early and run again resumes, and stops at its next
    evaluation unless the metric improves there.
    """

    monitor: str = ""
    mode: str | None = None
    patience: int = 3
    min_delta: float = 0.0
    restore_best: bool = False


@dataclass
class TrainerConfig(Config):
    """How to train: steps, intervals, checkpoints, exports, and recovery from bad losses.

    Attributes:
        train_steps: the global step to train to (an absolute target).
        steps_per_loop: steps per inner loop; train metrics are means over one loop.
        summary_interval: record in-step summaries every this many steps (None: every step).
        checkpoint_interval: save every this many steps (None: only at the end).
        max_to_keep: checkpoints to keep.
        validation_steps: steps per evaluation; -1 evaluates the whole validation set.
        validation_interval: evaluate every this many steps in ``train_and_eval``.
        continuous_eval_timeout: ``continuous_eval`` gives up after this many seconds without
            a new checkpoint; None waits until the checkpoint of ``train_steps`` appears.
        validation_summary_subdir: where evaluation summaries go under the model directory.
        best_checkpoint_export_subdir: where the best weights are exported; "" disables.
        best_checkpoint_eval_metric: the evaluation metric that decides "best" ("a/b" or
            "a|b" for nested logs); "" disables the export.
        best_checkpoint_metric_comp: ``higher`` or ``lower`` is better.
        best_checkpoint_max_to_keep: how many of the best to keep (top-K).
        loss_upper_bound: a loop whose mean training loss is above this (or not finite) is a
            blow-up.
        recovery_begin_steps: the upper bound is enforced from this step on (NaN always).
        recovery_max_trials: what a blow-up does: -1 ignores it; 0 stops training with an
            error; k > 0 restores the latest checkpoint (weights and optimizer; the data goes on,
            so the offending batches are skipped), up to k times in a row.
        ema: moving average of the weights.
        compile_step: ``torch.compile`` the train and eval steps.
        compile_blocks: ``torch.compile`` each repeated block of the model (a transformer's
            layers) instead of the whole step: one graph reused by every block, and the way to
            compile under FSDP2 (see `cadence.engine.parallelize`).
        compile_mode: the ``torch.compile`` mode of either (null: torch's default).
        cuda_graphs: capture the compiled steps in CUDA graphs (needs CUDA).
        async_checkpoints: write checkpoints in a background thread; training waits only for
            the copy of the state into host memory.
        optimizer_config: the optimizer and learning-rate schedule.
        early_stopping: stop when an evaluation metric stops improving.
        time_limit: stop cleanly, with a checkpoint, after this much training time in this
            process: seconds, or ``"HH:MM:SS"`` / ``"DD:HH:MM:SS"``; null: no limit. Running
            the same command again continues the run.
    """

    train_steps: int = 0
    steps_per_loop: int = 100
    summary_interval: int | None = None
    checkpoint_interval: int | None = 500
    max_to_keep: int = 5
    validation_steps: int = -1
    validation_interval: int = 500
    continuous_eval_timeout: float | None = None
    validation_summary_subdir: str = "eval"
    best_checkpoint_export_subdir: str = "best"
    best_checkpoint_eval_metric: str = ""
    best_checkpoint_metric_comp: str = "higher"
    best_checkpoint_max_to_keep: int = 1
    loss_upper_bound: float = 1e6
    recovery_begin_steps: int = 0
    recovery_max_trials: int = 0
    ema: EMAConfig = field(default_factory=EMAConfig)
    compile_step: bool = False
    compile_blocks: bool = False
    compile_mode: str | None = None
    cuda_graphs: bool = False
    async_checkpoints: bool = True
    optimizer_config: OptimizationConfig = field(default_factory=OptimizationConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    time_limit: int | float | str | None = None


@dataclass
class MLflowConfig(Config):
    """Where the ``mlflow`` writer logs (`cadence.writers.mlflow.MLflowWriter`).

    Attributes:
        tracking_uri: the MLflow store or server; null: ``MLFLOW_TRACKING_URI``, else a file
            store next to the model directory, shared by the runs of its folder
            (``file:<model_dir>/../mlruns``).
        experiment_name: null: ``MLFLOW_EXPERIMENT_NAME``, else the config's `experiment`
            (e.g. ``digits``), else MLflow's ``Default``.
        run_name: null: the model directory's name.
    """

    tracking_uri: str | None = None
    experiment_name: str | None = None
    run_name: str | None = None


@dataclass
class WandbConfig(Config):
    """Where the ``wandb`` writer logs (`cadence.writers.wandb.WandbWriter`).

    Attributes:
        project: null: ``WANDB_PROJECT``, else the config's `experiment`, else wandb's default.
        entity: the W&B user or team; null: wandb's default (``WANDB_ENTITY``, your login).
        mode: ``online``, ``offline``, ``disabled`` (or ``shared``); null: wandb's default
            (``WANDB_MODE``, else online).
        dir: where wandb writes its files; null: ``WANDB_DIR``, else the model directory.
        name: the W&B run's name; null: the model directory's name.
    """

    project: str | None = None
    entity: str | None = None
    mode: str | None = None
    dir: str | None = None
    name: str | None = None


@dataclass
class FSDPConfig(Config):
    """FSDP2's settings (``runtime.strategy=fsdp2``).

    Attributes:
        param_dtype: the dtype parameters are gathered and computed in: null (their own),
            ``bf16``, ``fp16`` or ``fp32``. The sharded parameters and the optimizer state keep
            their own dtype (fp32 master weights).
        reduce_dtype: the dtype gradients are reduced in: null (``param_dtype``), ``fp32``,
            ``bf16`` or ``fp16``. bf16 parameters with fp32 reduction is the usual choice.
        reshard_after_forward: free each block's gathered parameters after its forward and
            gather them again for backward (less memory, more communication).
    """

    param_dtype: str | None = None
    reduce_dtype: str | None = None
    reshard_after_forward: bool = True


@dataclass
class ParallelismConfig(Config):
    """How the job's processes split the work: the degrees of a named N-D mesh (torchtitan's
    ``ParallelDims``; `cadence.engine.runtime`), whose product is the world size.
    ``docs/parallelism.md`` says what each costs and how to choose them.

    Attributes:
        dp_replicate: data-parallel replicas: whole copies of the model (DDP), or with
            ``dp_shard`` > 1 HSDP's replicas of a sharded one.
        dp_shard: data-parallel shards (FSDP2: parameters, gradients and optimizer state split
            over them); -1: what the other degrees leave of the world size.
        tp: tensor parallelism: each layer's matrices split over this many ranks (neighbours:
            one machine's GPUs), by the model's plan (``tp_plan``).
        pp: pipeline parallelism: the layer stack split over this many ranks (across machines,
            where tensor parallelism's traffic would be too slow), its stages passing
            activations on (`cadence.engine.pipeline`).
        cp: context parallelism (not yet: 1; it trains on GPUs only).
        tp_plan: ``auto``: the model's own tensor-parallel plan -- a ``tensor_parallel_plan()``
            method (the ``gpt`` experiment's), or what a transformers model's config declares
            (Llama, Mistral, Qwen2, ...). Another plan goes through ``Task.parallelize``.
        pp_schedule: how the pipeline's microbatches run through its stages: ``gpipe`` (every
            forward, then every backward: activations of all microbatches held), ``1f1b``
            (one forward, one backward: at most ``pp`` microbatches' held) or
            ``interleaved_1f1b`` (1F1B over several stages per rank, a smaller bubble).
        pp_microbatches: microbatches each data shard's batch is split into (they must divide
            it); null: as many as the pipeline has stages. More shrink the bubble: a share
            ``(stages - 1) / (microbatches + stages - 1)`` of a step is idle.
        pp_stages_per_rank: stages each pipeline rank holds; null: 2 for
            ``interleaved_1f1b``, 1 for the others.
        pp_stage_modules: the modules of each stage (their names in the model, in the order the
            forward runs them), one list per stage; empty: the repeated blocks split evenly,
            the modules before them with the first stage, those after with the last.
    """

    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    tp_plan: str = "auto"
    pp_schedule: str = "1f1b"
    pp_microbatches: int | None = None
    pp_stages_per_rank: int | None = None
    pp_stage_modules: list[list[str]] = field(default_factory=list)


@dataclass
class FaultToleranceConfig(Config):
    """Replica groups that train on when one dies (torchft; ``pip install 'cadence[ft]'``):
    one ``torchrun`` per replica group, each group DDP or FSDP2 inside, the groups averaging
    their gradients at every step through torchft's Manager and a lighthouse. A group that dies
    is dropped at the next step (the step it was in is discarded by every group); one that comes
    back takes a live group's state and trains on in step. ``docs/reliability.md`` says how to
    launch it and what it does to the data.

    These are the settings' one definition: the engine reads them
    (`cadence.engine.fault_tolerance.ReplicaSettings`).

    Attributes:
        enabled: train as one of several replica groups (the training modes; ``eval`` and
            ``continuous_eval`` of such a run evaluate it as one job).
        replica_id: this group's number, from 0; null: the environment's ``REPLICA_GROUP_ID``.
        replica_groups: how many groups the job has (the data is sharded over all of them).
        min_live_groups: the fewest groups that may train on (torchft's ``min_replica_size``).
        lighthouse: the torchft lighthouse's address (``http://host:29510``); null: the
            environment's ``TORCHFT_LIGHTHOUSE``.
        timeout: seconds a cross-group collective, a commit or a heal may take.
        quorum_timeout: seconds a step waits for its quorum of groups.
        connect_timeout: seconds to reach the lighthouse and the other groups' managers.
    """

    enabled: bool = False
    replica_id: int | None = None
    replica_groups: int = 2
    min_live_groups: int = 1
    lighthouse: str | None = None
    timeout: float = 60.0
    quorum_timeout: float = 60.0
    connect_timeout: float = 10.0


@dataclass
class SlurmConfig(Config):
    """What a run does under Slurm (`cadence.core.slurm`; ``docs/slurm.md``). Where it runs
    needs no setting: a process that ``srun`` started learns its place in the job from Slurm.

    Attributes:
        signal: the signal, besides SIGTERM, that stops the run with a checkpoint: what
            ``sbatch --signal=USR1@120`` sends before the time limit (``SIGUSR1``; ``USR1``
            works too); null: SIGTERM alone.
        requeue: once that checkpoint is saved, requeue the job (``scontrol requeue``) when
            Slurm lets it (``Requeue=1``: ``sbatch --requeue``, or the cluster's default) and
            the job is still running, so that the next allocation resumes the run.
    """

    signal: str | None = "SIGUSR1"
    requeue: bool = True


@dataclass
class ProfilerConfig(Config):
    """A ``torch.profiler`` trace of some training steps (`cadence.callbacks.Profiler` on
    ``torch.profiler.schedule``), written by its TensorBoard trace handler as
    ``<model_dir>/profile/*.pt.trace.json`` (TensorBoard's PyTorch profiler plugin, Perfetto or
    ``chrome://tracing`` open them). Steps count from the first one this process trains.

    Attributes:
        enabled: profile.
        wait: steps left alone at the start of each cycle.
        warmup: steps profiled but not recorded (the profiler's start-up stays out of the trace).
        active: steps recorded in each cycle's trace.
        repeat: cycles; 0 repeats them until training ends.
    """

    enabled: bool = False
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1


@dataclass
class RuntimeConfig(Config):
    """Where and how precisely to run.

    Attributes:
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:1``, ...
            Under torchrun ``cuda`` (and ``auto`` on a GPU machine) is ``cuda:<LOCAL_RANK>``:
            every rank of a machine takes its own GPU, and the config stays the same on all.
        mixed_precision: None, ``bf16`` or ``fp16`` (``torch.autocast``; fp16 adds a gradient
            scaler).
        seed: seeds Python, NumPy and torch at the start of a fresh run (a resumed run restores
            its random state from the checkpoint instead); None: unseeded.
        deterministic: ``torch.use_deterministic_algorithms(True)``.
        num_threads: ``torch.set_num_threads``; None leaves torch's default.
        strategy: how the model is spread over the ranks of a torchrun job: ``auto`` (DDP with
            several ranks, else none), ``none``, ``ddp``, ``fsdp2`` (parameters, gradients and
            optimizer state sharded with ``fully_shard``; checkpoints through
            ``torch.distributed.checkpoint``). DDP and FSDP2 also run in one process (a group
            of one), so a run of either continues there.
        parallelism: the degrees of the job's mesh -- data replicas and shards, tensor
            parallelism -- whose product is the world size. ``strategy`` says how the
            data-parallel ones hold the model: ``auto`` is FSDP2 over data shards (HSDP with
            replicas too), DDP over replicas alone; tensor parallelism composes with FSDP2,
            not DDP.
        fsdp: FSDP2's mixed precision and resharding.
        activation_checkpointing: recompute each repeated block's activations in backward
            instead of keeping them (less memory, about one more forward per step).
        collective_timeout: seconds a collective waits for the other ranks: a dead or stuck rank
            ends the job after this long, with a message that says so.
        writers: where summaries go (rank 0 only): ``tensorboard``, ``jsonl``, ``csv``,
            ``mlflow``, ``wandb`` (see ``docs/writers.md``). MLflow and W&B need their extra
            (``pip install 'cadence[mlflow]'``) and get the config as hyper-parameters.
        mlflow: where the ``mlflow`` writer logs.
        wandb: where the ``wandb`` writer logs.
        profiler: a ``torch.profiler`` trace of some training steps.
        fault_tolerance: replica groups that train on when one dies (torchft).
        slurm: the signal that stops a Slurm job before its time limit, and its requeue.
    """

    device: str = "auto"
    mixed_precision: str | None = None
    seed: int | None = None
    deterministic: bool = False
    num_threads: int | None = None
    strategy: str = "auto"
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    activation_checkpointing: bool = False
    collective_timeout: float = 600.0
    writers: list[str] = field(default_factory=lambda: list(DEFAULT_WRITERS))
    mlflow: MLflowConfig = field(default_factory=MLflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    fault_tolerance: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


@dataclass
class TaskConfig(Config):
    """What to train. Experiments subclass it to add their model and data options.

    Attributes:
        init_checkpoint: weights to start from when the model directory has no checkpoint: a
            cadence checkpoint directory, a directory of them (the newest is used), or a
            ``.safetensors`` file (e.g. a best export).
        train_data: the training input pipeline.
        validation_data: the evaluation input pipeline.
        name: the task's name (used as its module name).
    """

    init_checkpoint: str = ""
    train_data: DataConfig = field(default_factory=lambda: DataConfig(is_training=True))
    validation_data: DataConfig = field(
        default_factory=lambda: DataConfig(is_training=False, drop_remainder=False)
    )
    name: str | None = None

    def problems(self) -> Iterable[str]:
        """What is wrong with this task's own fields, one ``"task.<key>: ..."`` phrase each;
        `ExperimentConfig.validate` reports them with the rest, before anything is created.

        A subclass with fields of its own checks them here (with
        `cadence.task.config_checks.range_problem`) and yields from ``super().problems()``.
        """
        return ()


@dataclass
class ExperimentConfig(Config):
    """The whole configuration of a run.

    Attributes:
        experiment: the registered experiment these defaults came from ("" if built by hand);
            saved with the config so that a saved file reloads into the right classes.
        experiment_module: where `experiment` was found when it is a module of one's own
            (``cadence train -e mymodels:my_experiment``): the module (``mymodels``) or the
            ``.py`` file (``path/to/mymodels.py``) as it was named; "" for an experiment the
            registry finds by itself (built-in, or an installed package's entry point). A run
            reloads its ``params.yaml`` through it (`cadence.task.module_experiments`).
    """

    experiment: str = ""
    experiment_module: str = ""
    task: TaskConfig = field(default_factory=TaskConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def validate(self) -> None:
        """Checks values that types alone do not constrain.

        Raises:
            ConfigError: listing every problem with its key path, on one line.
        """
        problems = list(config_problems(self))
        if problems:  # one line, however many: the command line's error is one line
            raise ConfigError("Invalid config: " + " ".join(problems))
