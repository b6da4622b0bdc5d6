"""`Trainer` (seed 002): one object that trains and evaluates a `Task` as the config says.

The Trainer is a `StandardTrainer` and a `StandardEvaluator`, so a `Controller` drives it like any
runner. One training step is::

    inputs = next_train_inputs(iterator)               # x gradient_accumulation_steps micro-batches
    loss = task.build_losses(labels, model(features))  # under autocast; task.process_metrics
    # -- or, where the task overrides train_step: logs = task.train_step(inputs, model,
    #    optimizer, train_metrics); loss = logs[task.loss]
    training_loss.update(loss)
    if loss still needs a gradient:                    # the default: the Trainer updates
        backward (through the fp16 grad scaler), clip the gradient norm, optimizer.step()
    # else the task updated the weights itself; an overridden train_step whose first step
    # updated nothing (no weight, no gradient) is a HookValueError: it would train nothing
    lr_scheduler.step(); ema.update()

One evaluation is `eval_begin` (reset metrics, eval mode; the EMA weights stand in when
enabled), then per step `next_eval_inputs -> (inputs, host_logs)`, ``task.validation_step``
and `eval_reduce` (``task.aggregate_logs`` on the host), and `eval_end`: metric results, the
task's ``reduce_aggregated_logs``, and the best-checkpoint export.

Asynchronous work (seed 002's ``coordinator_for_async``, ``init_async``, ``join``): TF Model
Garden schedules steps on parameter-server workers. cadence's asynchronous work is host-side I/O
that must not stall the loop: best-export writes go to the Trainer's `AsyncCoordinator`, a
background worker (`evaluate` returns once the export it triggered is written, as in TF Model
Garden), and checkpoint writes run in the background when
``trainer.async_checkpoints`` is on (`run_experiment` registers the manager with the
coordinator); `join()` waits for all of it and re-raises its errors.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from cadence.core.errors import ConfigError, StepDiscarded
from cadence.core.hook_checks import check_first_call
from cadence.core.protocols import is_stateful
from cadence.core.rank import process_rank
from cadence.data.device import on_device, to_device
from cadence.data.sharding import InputContext
from cadence.engine.background import AsyncCoordinator
from cadence.engine.clipping import clip_grad_norm_
from cadence.engine.compile import compile_step
from cadence.engine.distributed import gather_objects
from cadence.engine.external_metrics import move_metrics, read_metric, reduce_across_ranks
from cadence.engine.fault_tolerance import ReplicaGroups
from cadence.engine.metrics import Mean, Metric
from cadence.engine.parallelize import ParallelOptions, prepare_model, resolve_strategy
from cadence.engine.pipeline import Pipeline, PipelineExecutor, build_pipeline
from cadence.engine.runner import Output
from cadence.engine.runtime import Runtime, is_distributed, local_device, setup_runtime
from cadence.engine.sharded import full_model_state
from cadence.engine.standard_runner import (
    StandardEvaluator,
    StandardEvaluatorOptions,
    StandardTrainer,
    StandardTrainerOptions,
)
from cadence.engine.step_executor import StepExecutor
from cadence.engine.strategies import stages_per_rank
from cadence.engine.throughput import Throughput
from cadence.task import build_checks, step_checks
from cadence.task.config_checks import DTYPES
from cadence.task.optimization import ExponentialMovingAverage, create_lr_schedule
from cadence.task.task import Task, accepts_argument, default_train_loss, split_inputs, task_loss

logger = logging.getLogger("cadence")

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype of a config's dtype name (`cadence.task.config.DTYPES`), or None."""
    return getattr(torch, DTYPES[name]) if name else None


def parallel_options(config: Any) -> ParallelOptions:
    """What an `ExperimentConfig` asks of `Task.parallelize` (the strategy still unresolved:
    `prepare_model` resolves it)."""
    runtime, trainer = config.runtime, config.trainer
    fsdp = runtime.fsdp
    return ParallelOptions(
        strategy="none", activation_checkpointing=runtime.activation_checkpointing,
        compile_blocks=trainer.compile_blocks, compile_mode=trainer.compile_mode,
        param_dtype=_dtype(fsdp.param_dtype), reduce_dtype=_dtype(fsdp.reduce_dtype),
        reshard_after_forward=fsdp.reshard_after_forward)


def config_runtime(config: Any) -> Runtime:
    """This process's `Runtime` for an `ExperimentConfig`: its device, ``runtime.strategy`` and
    ``runtime.parallelism`` (`cadence.engine.runtime.setup_runtime`; the same runtime when the
    run set it up already).

    Raises:
        ValueError: for a device that is not one, or not here.
        ConfigError: for degrees that do not make the job's world size, or a layout that
            cannot work.
    """
    runtime, degrees = config.runtime, config.runtime.parallelism
    return setup_runtime(local_device(runtime.device, "runtime.device"), strategy=runtime.strategy,
                         dp_replicate=degrees.dp_replicate, dp_shard=degrees.dp_shard,
                         tp=degrees.tp, pp=degrees.pp, cp=degrees.cp,
                         timeout=runtime.collective_timeout, setting="runtime.parallelism",
                         timeout_setting="runtime.collective_timeout")


def _check_arguments(config: Any, optimizer: Any, train: tuple[bool, Any],
                     evaluate: tuple[bool, Any], replicas: Any) -> None:
    """Refuses a `Trainer` that could not run (see its Raises)."""
    for part in ("task", "trainer", "runtime"):
        if not hasattr(config, part):
            raise ValueError(f"`config` (got {type(config).__name__}) has no {part!r}; pass "
                             "a cadence.ExperimentConfig.")
    for (flag, dataset), key in ((train, "train_data"), (evaluate, "validation_data")):
        if flag and dataset is None and getattr(config.task, key, None) is None:
            raise ValueError(f"config.task.{key} is not set and no dataset was given: set "
                             f"it, or pass the dataset to Trainer().")
    if replicas is not None and optimizer is None:
        raise ValueError("Replica groups need the Trainer to update the weights (it averages "
                         "the gradients over the groups first): pass an optimizer.")


class Trainer(StandardTrainer, StandardEvaluator):
    """Trains and evaluates `task` (seed 002's ``base_trainer.Trainer``).

    Args:
        config: an `ExperimentConfig` (its ``task``, ``trainer`` and ``runtime`` are read).
        task: the `Task`.
        model: the model, usually ``task.build_model()``; moved to ``runtime.device``.
        optimizer: a `torch.optim` optimizer over the model's parameters (see
            `cadence.task.optimization.create_optimizer`); None when the task updates itself.
        train: build what training needs (the training data and metrics).
        evaluate: build what evaluation needs (the validation data and metrics).
        train_dataset: the training data; default ``task.build_inputs(task.train_data)``
            through `distribute_dataset`.
        validation_dataset: the validation data; default from ``task.validation_data``.
        checkpoint_exporter: a `BestCheckpointExporter` called at the end of each evaluation.
        replicas: this process's part in fault-tolerant replica groups
            (`cadence.engine.fault_tolerance.ReplicaGroups`), or None: every step's gradients
            are then averaged over the live groups, a step no group commits is discarded, the
            data is this group's share, and a joining group heals from a live one.

    Raises:
        ValueError: if the config lacks ``task`` or ``trainer``, or the task config lacks the
            data config for a dataset that is not given; if `validation_dataset` holds no batch.
        HookError: if what ``task.build_metrics`` or ``task.build_inputs`` returns cannot be
            used (`cadence.task.build_checks`); its steps are checked at their first call.
    """

    _TRACKING_IGNORED = frozenset(
        {"_config", "_checkpoint_exporter", "_coordinator", "_device", "_autocast_dtype",
         "_eval_model", "_train_model", "_task_train_step", "_task_validation_step",
         "_full_copy", "_last_loss", "_executor", "runtime", "_throughput", "pipeline",
         "_evaluated_pipeline", "_flops_per_token", "_clip_options"}
    )

    def __init__(
        self,
        config: Any,
        task: Task,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        train: bool = True,
        evaluate: bool = True,
        train_dataset: Any = None,
        validation_dataset: Any = None,
        checkpoint_exporter: Any = None,
        replicas: ReplicaGroups | None = None,
    ) -> None:
        _check_arguments(config, optimizer, (train, train_dataset),
                         (evaluate, validation_dataset), replicas)
        self._config = config
        self.runtime = config_runtime(config)
        """Where this process sits in the job: its device, its mesh, its data coordinate."""
        self._device = self.runtime.device
        self._autocast_dtype = _AUTOCAST_DTYPES.get(config.runtime.mixed_precision or "")
        self._coordinator = AsyncCoordinator()
        self._checkpoint_exporter = checkpoint_exporter
        self._replicas = replicas
        self.task = task
        self.optimizer = optimizer
        self._place_model(model, evaluate)
        self._build_update()
        self._build_metrics(train, evaluate)
        train_dataset, validation_dataset = build_checks.trainer_data(  # checked, before step 0
            task, config.task, self.distribute_dataset, (train, train_dataset),
            (evaluate, validation_dataset))
        self._build_steps()
        self._throughput = self._build_throughput()
        # On CUDA the next batch is copied while the step computes (side stream, pinned memory)
        # -- not from a loader that keeps its own state (a StatefulDataLoader), whose state
        # would then be a batch ahead of training: the step copies each batch itself.
        prefetch = (self._device if self._device.type != "cpu"
                    and not is_stateful(train_dataset) else None)
        StandardTrainer.__init__(self, train_dataset if train else [],
                                 StandardTrainerOptions(prefetch_to_device=prefetch),
                                 name=task.name)
        self._moves_batches = prefetch is None and self._device.type != "cpu"
        """Whether the step copies its batches to the device itself (nothing prefetched them)."""
        StandardEvaluator.__init__(self, validation_dataset, StandardEvaluatorOptions(),
                                   name=task.name)
        self.init_async()
        if replicas is not None:
            self._register_for_healing(replicas)

    def _place_model(self, model: nn.Module, evaluate: bool) -> None:
        """The model on its device, its EMA average and evaluation copy, and the module that
        trains: as the task spreads it over the ranks (default: per repeated block). DDP wraps
        it (checkpoints and exports hold the plain one); FSDP2 shards it in place. Either way
        gradients are averaged across processes during backward.

        With an EMA and a sharded model, the average is sharded as the model is: each rank
        averages its own shards, and an evaluation gathers the average's.
        """
        config, optimizer = self._config, self.optimizer
        ema = config.trainer.ema
        self._flops_per_token = self.task.flops_per_token(model)
        """The whole model's training FLOPs per token (`Task.flops_per_token`), before it is
        spread over the ranks."""
        self.runtime = self.runtime.with_strategy(
            resolve_strategy(self.runtime.strategy, model, self.runtime))
        self.pipeline: Pipeline | None = None
        """This rank's stages of the model, under pipeline parallelism (else None)."""
        self._clip_options: dict[str, Any] = {}
        """What clipping needs besides the parameters: a pipeline's group and shared copies."""
        if self.runtime.dims.pp > 1:
            self._place_pipeline(model)
            return
        self.model = model.to(self._device)
        sharded = self.runtime.strategy == "fsdp2" or self.runtime.dims.tp > 1
        # A sharded model evaluates (and exports) a full copy of the weights, gathered at each
        # evaluation -- of the EMA's when there is one. It and the EMA average are copies of
        # the plain model, taken before it is spread over the ranks.
        self._full_copy = copy.deepcopy(self.model) if sharded and evaluate else None
        average = copy.deepcopy(self.model) if ema.enabled else None
        options = parallel_options(config)
        self._train_model: nn.Module = prepare_model(
            self.model, self.runtime.strategy, self._device, runtime=self.runtime,
            optimizers=[optimizer] if optimizer is not None else [],
            options=options, parallelize=self.task.parallelize)
        if average is not None and sharded:  # sharded as the model is: each rank its shards
            prepare_model(average, self.runtime.strategy, self._device, runtime=self.runtime,
                          options=options, parallelize=self.task.parallelize)
        self.ema = (ExponentialMovingAverage(self.model, ema.decay, ema.dynamic_decay,
                                             ema.start_step, average=average)
                    if average is not None else None)
        self._eval_model: nn.Module = self.model

    def _place_pipeline(self, model: nn.Module) -> None:
        """This rank's stages of the model (`cadence.engine.pipeline.build_pipeline`), each
        spread over the rank's tensor- and data-parallel peers as the task spreads a model;
        `model` is the stages as one module named as the model. The optimizer is pointed at
        this rank's parameters. An EMA averages the same stages of its own, which evaluations
        (through the pipeline) and exports use."""
        config, optimizer = self._config, self.optimizer
        degrees = config.runtime.parallelism
        how: dict[str, Any] = {
            "stages_per_rank": stages_per_rank(degrees.pp_schedule, degrees.pp_stages_per_rank),
            "stage_modules": degrees.pp_stage_modules, "parallelize": self.task.parallelize,
            "autocast": self._autocast_dtype}
        options = parallel_options(config)
        pipeline = self.pipeline = build_pipeline(
            model, self.runtime, options, optimizers=[optimizer] if optimizer is not None else [],
            **how)
        self.model = self._train_model = pipeline.model
        if process_rank() == 0:
            logger.info("Pipeline of %d stages over pp=%d (%s): %s.", pipeline.num_stages,
                        self.runtime.dims.pp, degrees.pp_schedule, pipeline.plan.describe())
        ema = config.trainer.ema
        average = build_pipeline(model, self.runtime, options, **how) if ema.enabled else None
        self._evaluated_pipeline = average or pipeline
        self.ema = (ExponentialMovingAverage(self.model, ema.decay, ema.dynamic_decay,
                                             ema.start_step, average=average.model)
                    if average is not None else None)
        self._full_copy = None
        self._eval_model = self.model
        self._clip_options = {"pp_group": pipeline.pp_group,
                              "not_counted": pipeline.counted_elsewhere()}

    def _build_update(self) -> None:
        """What each update does besides the optimizer's step: the learning-rate schedule
        (none for a constant rate: no work per step that changes nothing), fp16's gradient
        scaler, gradient accumulation and clipping."""
        config, optimizer = self._config, self.optimizer
        trainer_config = config.trainer
        schedule = trainer_config.optimizer_config.learning_rate
        self.lr_scheduler = (
            create_lr_schedule(schedule, optimizer, trainer_config.train_steps)
            if optimizer is not None and (schedule.schedule != "constant"
                                          or schedule.warmup_steps > 0) else None
        )
        self.grad_scaler = (
            torch.amp.GradScaler(self._device.type)
            if config.runtime.mixed_precision == "fp16" and optimizer is not None else None
        )
        optimization = trainer_config.optimizer_config
        self._accumulation = optimization.gradient_accumulation_steps
        self._clip_norm = optimization.gradient_clip_norm
        self._last_loss: torch.Tensor | None = None
        """The last step's loss, kept until the next one's (see `train_step`)."""

    def _build_metrics(self, train: bool, evaluate: bool) -> None:
        """The losses' means and the task's metrics (checked as built), on the model's device."""
        task = self.task
        self.training_loss = Mean()
        self.validation_loss = Mean()
        self.gradient_norm = Mean()
        self.train_metrics: dict[str, Any] = (
            build_checks.built_metrics(task, training=True) if train else {})
        self.validation_metrics: dict[str, Any] = (
            build_checks.built_metrics(task, training=False) if evaluate else {})
        # torchmetrics' metrics hold their states as tensors: on the model's device, as
        # cadence's own accumulators are (those are created where the first update's values are).
        move_metrics([*self.train_metrics.values(), *self.validation_metrics.values()],
                     self._device)
        self._extra_train_logs: dict[str, Mean] = {}
        self._validation_loss_seen = False

    def _build_steps(self) -> None:
        """The task's steps as the Trainer calls them -- compiled with ``compile_step``: the
        task's forward and loss are compiled and backward runs through the compiled graph, the
        update stays eager (a graph break there gains nothing) -- and the checks of their first
        calls (the compiled ones', when compiled)."""
        task, trainer_config = self.task, self._config.trainer
        self._default_train_step = type(task).train_step is Task.train_step
        """Whether the task keeps the default `Task.train_step`: the Trainer then runs that
        forward itself (`_train_forward`), and ``build_losses``' loss goes straight to
        ``training_loss`` with no logs dict on its way."""
        self._unchecked_override = not self._default_train_step
        """Whether the task overrides `Task.train_step` and no step has shown yet that it
        trains something (see `refuse_a_step_that_trained_nothing`)."""
        self._updates_train_metrics = bool(self.train_metrics) or (
            type(task).process_metrics is not Task.process_metrics)
        """Whether the default forward calls ``task.process_metrics``: not for a task with no
        training metrics that keeps the default one (it would loop over nothing)."""
        self._task_validation_step: Callable[..., Any] | None = None
        if self.pipeline is not None:
            self._build_pipeline_steps()
            return
        train_step = self._default_forward if self._default_train_step else task.train_step
        compiled = trainer_config.compile_step or trainer_config.cuda_graphs
        if compiled:
            how = (trainer_config.compile_mode, trainer_config.cuda_graphs)
            train_step = compile_step(train_step, *how)
            self._task_validation_step = compile_step(task.validation_step, *how)
        self._task_train_step: Callable[..., Any] = train_step
        """What a micro-batch runs: the task's default forward (returns the loss) or its own
        ``train_step`` (returns logs), compiled when the config says so."""
        # The first call of each step checks what it returned (`step_checks`).
        check_first_call(self, "_task_train_step",
                         step_checks.train_step_check(task, self._default_train_step))
        if compiled:
            check_first_call(self, "_task_validation_step", step_checks.validation_check(task))
        else:
            step_checks.check_task_hooks(task)
        self._executor: StepExecutor | PipelineExecutor = StepExecutor(
            self._train_model, self._microbatch_loss, self._accumulation, self._autocast_dtype,
            self.grad_scaler)
        """The step's forward, loss and backward over its microbatches."""

    def _build_pipeline_steps(self) -> None:
        """The steps of a pipeline: the task's default forward and loss, run through the stages
        by the schedule (`cadence.engine.pipeline.PipelineExecutor`); evaluation too, forward
        only. The loss and the metrics are the last stage's.

        Raises:
            ConfigError: for a task that overrides ``train_step``, ``validation_step`` or
                ``inference_step``: a pipeline runs the model's forward in pieces on several
                ranks, which a step of one's own cannot do.
        """
        task, degrees = self.task, self._config.runtime.parallelism
        own = [name for name in ("train_step", "validation_step", "inference_step")
               if getattr(type(task), name) is not getattr(Task, name)]
        if own:
            raise ConfigError(
                f"runtime.parallelism.pp={degrees.pp} runs the Task's default steps through the "
                f"pipeline's stages, and {type(task).__name__} overrides {', '.join(own)}: "
                "compute the loss in build_losses and the metrics in process_metrics (which the "
                "last stage runs), or train it with pp=1.")
        step_checks.check_task_hooks(task)
        stages = self.pipeline.num_stages  # type: ignore[union-attr]
        self._executor = PipelineExecutor(
            self.pipeline, split_inputs, self._pipeline_loss,  # type: ignore[arg-type]
            degrees.pp_schedule, degrees.pp_microbatches or stages,
            record=self._record_training, keep_outputs=self._updates_train_metrics,
            evaluated=self._evaluated_pipeline)
        self._task_validation_step = self._pipeline_validation_step

    def _pipeline_loss(self, labels: Any, outputs: Any) -> torch.Tensor:
        """A microbatch's loss on a pipeline's last stage (its metrics follow in
        `_record_training`, once the schedule has run every microbatch)."""
        last = self._executor.pipeline.parts[-1].module  # type: ignore[union-attr]
        return task_loss(self.task, labels, outputs, last, None, update_metrics=False)

    def _record_training(self, labels: Any, outputs: Any, loss: torch.Tensor) -> None:
        """A training microbatch's loss and metrics, on a pipeline's last stage."""
        self.training_loss.update(loss)
        if outputs is not None:
            self.task.process_metrics(self.train_metrics, labels, outputs)

    def _record_validation(self, labels: Any, outputs: Any, loss: torch.Tensor) -> None:
        """An evaluation microbatch's metrics, on a pipeline's last stage."""
        self.task.process_metrics(self.validation_metrics, labels, outputs)

    def _pipeline_validation_step(self, inputs: Any, model: nn.Module,
                                  metrics: Mapping[str, Any]) -> dict[str, Any]:
        """An evaluation step through the pipeline: the metrics are counted on the last stage
        (`_record_validation`), the loss reported by every stage (the same value: the
        reductions then read it once per stage, and means stay what they are)."""
        return {self.task.loss: self._executor.evaluate(  # type: ignore[union-attr]
            inputs, self._record_validation)}

    def _register_for_healing(self, replicas: ReplicaGroups) -> None:
        """What a joining replica group takes from a live one: everything a checkpoint holds
        but this group's own data position and random state, and the loop's metrics. The step
        counters go through the clock, the one writer of the run's progress."""
        for name, part in self.checkpoint_items().items():
            if name not in ("progress", "train_data"):
                replicas.register(name, part)
        replicas.register("progress", self._progress, load=lambda counters: self.clock.adopt(
            counters), save=lambda: self.clock.counters())
        metrics = {"training_loss": self.training_loss, "gradient_norm": self.gradient_norm,
                   **{name: metric for name, metric in self.train_metrics.items()
                      if isinstance(metric, Metric)}}
        for name, metric in metrics.items():
            replicas.register(f"metrics.{name}", metric)

    def checkpoint_items(self) -> dict[str, Any]:
        """What a checkpoint of the Trainer holds: the model, the optimizer, the learning-rate
        schedule, the fp16 grad scaler, the EMA weights, the task's own stateful parts, the step
        counter and the data position. Metrics (cadence's and torchmetrics') are not saved:
        they cover one loop or one evaluation, checkpoints are taken between loops, and the
        next loop starts by resetting them."""
        parts: dict[str, Any] = {"model": self.model, "optimizer": self.optimizer,
                                 "lr_scheduler": self.lr_scheduler,
                                 "grad_scaler": self.grad_scaler, "ema": self.ema_state}
        items = {name: part for name, part in parts.items() if part is not None}
        items.update({f"task.{path}": part for path, part in self.task.checkpoint_items().items()
                      if all(part is not other for other in items.values())})
        items.update({"progress": self._progress, "train_data": self._train_data})
        return items

    # ------------------------------------------------------------------ properties

    @property
    def ema_state(self) -> Any:
        """What a checkpoint holds of the EMA (None without one): the EMA itself, or -- sharded,
        or a pipeline's stages -- its average, a module that checkpoints save and load through
        DCP."""
        ema = self.ema
        return (ema.average if ema is not None and (ema.sharded or self.pipeline is not None)
                else ema)

    @property
    def config(self) -> Any:
        """The experiment config."""
        return self._config

    @property
    def device(self) -> torch.device:
        """Where the model and the inputs live."""
        return self._device

    @property
    def checkpoint_exporter(self) -> Any:
        """The best-checkpoint exporter, if any."""
        return self._checkpoint_exporter

    @property
    def eval_model(self) -> nn.Module:
        """The weights evaluations and exports use: the EMA average when enabled; for a sharded
        model (FSDP2, tensor parallelism), a full copy of them -- the model's or the average's
        -- gathered from every rank when an evaluation begins."""
        if self._full_copy is not None:  # sharded: a gathered copy (of the EMA's, with one)
            return self._full_copy
        return self.ema.average if self.ema is not None else self.model

    # ------------------------------------------------------------------ seed 002 utilities

    def initialize(self) -> None:
        """Runs when the model directory has no checkpoint (the manager's ``init_fn``):
        ``task.initialize(model)``, e.g. to load pretrained weights.

        The weights stay on the Trainer's device: a task that moved them (loaded onto the CPU)
        has them moved back, and the EMA follows the moved tensors.

        Raises:
            RuntimeError: if ``task.initialize`` replaced parameters (e.g.
                ``load_state_dict(assign=True)``): the optimizer would go on updating the old
                ones.
        """
        before = [id(p) for p in self.model.parameters()]
        self.task.initialize(self.model)
        if [id(p) for p in self.model.parameters()] != before:
            raise RuntimeError(
                f"{type(self.task).__name__}.initialize() replaced parameters of the model, so "
                "the optimizer (built on the old ones) would not train it. Copy weights into "
                "the model instead: model.load_state_dict(weights) without assign=True.")
        if not on_device([*self.model.parameters(), *self.model.buffers()], self._device):
            self.model.to(self._device)  # in place: the optimizer's parameters stay the same
            if self.ema is not None:  # it holds the tensors the parameters had
                ema = self.ema
                self.ema = ExponentialMovingAverage(self.model, ema.decay, ema.dynamic_decay,
                                                    ema.start_step)
        if self.ema is not None:
            self.ema.reset()  # the average starts from the initialized weights

    def distribute_dataset(self, dataset_or_fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Builds this process's share of a dataset.

        A dataset is returned as it is. A function is called with `args` and `kwargs`, plus an
        `InputContext` (world size, this rank) as ``input_context`` when it takes one. With
        replica groups, the training data (a first argument whose ``is_training`` is true, or
        none) is this rank's share of every group's data; the validation data is shared by the
        ranks of the group only: every group evaluates the whole validation set, with the same
        weights, and gets the same figures (the group that writes checkpoints writes them).
        """
        if not callable(dataset_or_fn) or hasattr(dataset_or_fn, "__iter__"):
            return dataset_or_fn
        if accepts_argument(dataset_or_fn, "input_context"):
            training = getattr(args[0] if args else None, "is_training", True)
            if self._replicas is not None and training:  # this group's share of every group's
                kwargs["input_context"] = self._replicas.input_context()  # training data
                return dataset_or_fn(*args, **kwargs)
            runtime = self.runtime  # the data coordinate: tensor-parallel peers read one shard
            kwargs["input_context"] = InputContext(runtime.dp_size, runtime.dp_rank,
                                                   runtime.dp_size)
        return dataset_or_fn(*args, **kwargs)

    def init_async(self) -> None:
        """Prepares asynchronous work: waits for anything pending, then starts afresh (keeping
        what `join` waits for)."""
        self._coordinator.join()
        self._coordinator = self._coordinator.renewed()

    def coordinator_for_async(self) -> AsyncCoordinator:
        """The `AsyncCoordinator` that runs this Trainer's background work."""
        return self._coordinator

    def join(self) -> None:
        """Waits for all background work (export writes, checkpoint writes) to finish."""
        self._coordinator.join()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self._device.type, dtype=self._autocast_dtype)

    # ------------------------------------------------------------------ training

    def train_loop_begin(self) -> None:
        """Resets the training metrics (before the iterator exists on the first loop)."""
        if not all(module.training for module in self.model.modules()):
            self.model.train()  # after an evaluation; setting it walks and sets every module
        for metric in (self.training_loss, self.gradient_norm, *self.train_metrics.values(),
                       *self._extra_train_logs.values()):
            metric.reset()

    def next_train_inputs(self, iterator: Iterator[Any]) -> Any:
        """The next training batch; override to control what is fed to the model."""
        return next(iterator)

    def train_step(self, iterator: Iterator[Any]) -> None:
        """One step: ``gradient_accumulation_steps`` micro-batches, then one update.

        Raises:
            HookError: if what the task's step returned cannot be used (at its first call: see
                `cadence.task.step_checks`), or with the default one a loss has no gradient, or
                an overridden ``train_step``'s first step returned a loss without a gradient
                and updated no weight itself (it would train nothing).
        """
        # All micro-batches are fetched first: a pass that ends mid-step leaves no half step.
        accumulation = self._accumulation
        batches = ([self.next_train_inputs(iterator)] if accumulation == 1 else
                   [self.next_train_inputs(iterator) for _ in range(accumulation)])
        if self._moves_batches:
            batches = [to_device(inputs, self._device) for inputs in batches]
        if self._replicas is not None:
            self._replicas.begin_step()  # the quorum forms while the forward runs
        # Only until an overridden train_step has shown that it trains: host-side counters, read
        # once, no sync; the default train_step never pays for it.
        marks = (step_checks.update_marks(self._trainables()) if self._unchecked_override
                 else None)
        loss, updated = self._executor.run(batches)
        if not updated and self._default_train_step:
            raise step_checks.no_gradient_error(self.task, loss)
        # Kept until the next step's loss replaces it: its graph (its tensors freed by backward)
        # holds each parameter's gradient accumulator, which the next forward then reuses
        # instead of building anew -- as in a hand-written loop, whose `loss` outlives its step.
        # ~5,000 instructions per step on the overhead benchmark's MLP (0.2%; callgrind).
        self._last_loss = loss
        if marks is not None:
            self._unchecked_override = False  # later steps are not checked
            step_checks.refuse_a_step_that_trained_nothing(self.task, marks, self._trainables(),
                                                           updated)
        if updated:
            self._apply_gradients()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        if self.ema is not None:
            self.ema.update(self.global_step + 1)

    def _microbatch_loss(self, inputs: Any) -> torch.Tensor:
        """One micro-batch's loss, for the executor: the task's step run, its loss counted in
        ``training_loss`` (and the other scalars its own ``train_step`` returned, by name)."""
        out = self._task_train_step(inputs, self._train_model, self.optimizer,
                                    self.train_metrics)
        if self._default_train_step:
            loss = out
        else:
            loss = self._loss_of(out)
            if len(out) > 1:
                self._record_extra(out)
        self.training_loss.update(loss)
        return loss

    def _default_forward(self, inputs: Any, model: nn.Module,
                         optimizer: torch.optim.Optimizer | None,
                         metrics: Mapping[str, Any]) -> torch.Tensor:
        """The default `Task.train_step`, as the Trainer runs it: its loss itself, not in a
        logs dict (`default_train_loss`)."""
        return default_train_loss(self.task, inputs, model, metrics, self._updates_train_metrics)

    def _trainables(self) -> list[torch.Tensor]:
        """The trainable tensors of the model and the task, each once."""
        tensors: dict[int, torch.Tensor] = {
            id(p): p for p in self.model.parameters() if p.requires_grad}
        tensors.update((id(v), v) for v in self.task.trainable_variables)
        return list(tensors.values())

    def _loss_of(self, logs: Any) -> torch.Tensor:
        if not (type(logs) is dict or isinstance(logs, Mapping)) or self.task.loss not in logs:
            raise step_checks.logs_error(self.task, logs)
        loss = logs[self.task.loss]
        return loss if isinstance(loss, torch.Tensor) else torch.as_tensor(loss)

    def _record_extra(self, logs: Mapping[str, Any]) -> None:
        for key, value in logs.items():
            if key == self.task.loss or not isinstance(value, torch.Tensor) or value.numel() != 1:
                continue
            metric = self._extra_train_logs.get(key)
            if metric is None:
                metric = self._extra_train_logs[key] = Mean()
            metric.update(value.detach())

    def _apply_gradients(self) -> None:
        optimizer = self.optimizer
        if optimizer is None:
            raise RuntimeError(
                "The training loss needs a gradient but the Trainer has no optimizer: pass one, "
                "or update the weights in Task.train_step and return detached values."
            )
        scaler = self.grad_scaler
        replicas = self._replicas
        if replicas is not None:  # the live groups' mean gradient, before clipping
            replicas.reduce_gradients(p for group in optimizer.param_groups
                                      for p in group["params"])
        if self._clip_norm is not None:
            if scaler is not None:
                scaler.unscale_(optimizer)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            # the total over every shard, mesh dimension and pipeline stage
            # (`cadence.engine.clipping`)
            self.gradient_norm.update(clip_grad_norm_(params, self._clip_norm,
                                                      **self._clip_options))
        if replicas is not None and not replicas.commit():
            optimizer.zero_grad(set_to_none=True)  # a group died during the step: no update
            raise StepDiscarded("a replica group died during the step")
        if scaler is not None:
            scaler.step(optimizer)  # reads the inf check on the host: fp16 costs a sync
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def loop_rates(self, steps_per_second: float) -> Mapping[str, float]:
        """Tokens per second (the job's, and per device), TFLOPS per device, MFU and the
        device's peak memory of the loop, where the task says what an example costs
        (`Task.tokens_per_example`, `Task.flops_per_token`; `cadence.engine.throughput`)."""
        return self._throughput.loop_rates(steps_per_second) if self._throughput else {}

    def _build_throughput(self) -> Throughput | None:
        """What a step costs, for `loop_rates`: None for a task that does not say."""
        tokens = self.task.tokens_per_example()
        if not tokens:
            return None
        config = self._config
        precision = config.runtime.mixed_precision or config.runtime.fsdp.param_dtype or "fp32"
        step = config.task.train_data.global_batch_size * self._accumulation
        return Throughput(step * tokens, self._flops_per_token, self._device,
                          self.runtime.world_size, precision)

    def train_loop_end(self) -> Output:
        """The loop's means: ``training_loss``, the task's metrics, other scalars the task's
        ``train_step`` returned, ``learning_rate`` and, with clipping, ``gradient_norm``."""
        self._coordinator.join(retention=False)  # old checkpoints are deleted in the background
        own = (self.training_loss, self.gradient_norm, *self._extra_train_logs.values())
        for mean in own:
            mean.all_reduce()  # a no-op in one process
        for metric in self.train_metrics.values():
            reduce_across_ranks(metric)  # cadence's all-reduce; torchmetrics' gather in compute
        logs: dict[str, Any] = {"training_loss": self.training_loss.result()}
        # torchmetrics' compute() gathers the ranks' states: every rank reads every metric.
        logs.update({name: read_metric(metric) for name, metric in self.train_metrics.items()})
        logs.update({name: metric.result() for name, metric in self._extra_train_logs.items()})
        if self._clip_norm is not None:
            logs["gradient_norm"] = self.gradient_norm.result()
        if self.optimizer is not None:
            logs["learning_rate"] = float(self.optimizer.param_groups[0]["lr"])
        return logs

    # ------------------------------------------------------------------ evaluation

    def eval_begin(self) -> Any:
        """Resets the evaluation metrics and puts the evaluated model in eval mode."""
        for metric in (self.validation_loss, *self.validation_metrics.values()):
            metric.reset()
        self._validation_loss_seen = False
        if self._full_copy is not None:  # a collective: every rank gathers the shards
            evaluated = self.ema.average if self.ema is not None else self.model
            self._full_copy.load_state_dict(full_model_state(evaluated))
        self._eval_model = self.eval_model
        self._eval_model.eval()
        return None

    def next_eval_inputs(self, iterator: Iterator[Any]) -> tuple[Any, dict[str, Any]]:
        """The next evaluation batch and host-side logs.

        The logs stay on the host (strings, ids, anything the device cannot hold) and are
        merged with the step's outputs for ``task.aggregate_logs``; override to return some.
        """
        return next(iterator), {}

    def eval_step(self, iterator: Iterator[Any]) -> dict[str, Any]:
        """One evaluation step: ``task.validation_step`` merged with the host logs (the
        model's outputs win on a name clash)."""
        inputs, host_logs = self.next_eval_inputs(iterator)
        inputs = to_device(inputs, self._device)
        with self._autocast():
            logs = (self._task_validation_step or self.task.validation_step)(
                inputs, self._eval_model, self.validation_metrics)
        logs = dict(logs or {})
        if self.task.loss in logs:
            self.validation_loss.update(logs[self.task.loss])
            self._validation_loss_seen = True
        for key in host_logs:
            if key in logs:
                logger.warning("next_eval_inputs() returned %r, which validation_step() also "
                               "returned; the model's value is kept.", key)
        return {**host_logs, **logs}

    def eval_reduce(self, state: Any = None, step_outputs: Any = None) -> Any:
        """``task.aggregate_logs(state, step_outputs)``."""
        return self.task.aggregate_logs(state, step_outputs)

    def eval_end(self, aggregated_logs: Any = None) -> Output:
        """Metric results, ``validation_loss``, the task's reduced aggregates, and the export:
        when the exporter keeps these weights, ``best_<metric>`` is added."""
        self._coordinator.join(retention=False)
        for metric in (self.validation_loss, *self.validation_metrics.values()):
            reduce_across_ranks(metric)
        logs: dict[str, Any] = {name: read_metric(metric)
                                for name, metric in self.validation_metrics.items()}
        if self._validation_loss_seen:
            logs["validation_loss"] = self.validation_loss.result()
        if is_distributed():  # each rank aggregated its shard: the reduction sees them all
            shards = [s for s in gather_objects(aggregated_logs) if s is not None]
            aggregated_logs = self.task.merge_aggregated_logs(shards) if shards else None
        if aggregated_logs is not None:
            logs.update(self.task.reduce_aggregated_logs(aggregated_logs,
                                                         global_step=self.global_step))
        exporter = self._checkpoint_exporter
        if exporter is not None:
            from cadence.core.summary import to_host

            logs = to_host(logs)
            exporter.maybe_export_checkpoint(
                self._eval_model, logs, self.global_step, coordinator=self._coordinator,
                kind="ema" if self.ema is not None else "model",
                weights=None if self.pipeline is None else self._evaluated_pipeline.whole_state)
            # As in TF Model Garden, evaluate() returns with its export on disk (checkpoint
            # writes, which the coordinator also waits for in join(), go on in the background).
            self._coordinator.join(waitables=False)
            best = exporter.best_value
            if best is not None:
                logs[f"best_{exporter.metric_key}"] = best
        self.model.train()
        return logs
