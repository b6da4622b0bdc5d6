"""Pipeline parallelism: a model's stages placed on the ranks of the ``pp`` dimension
(`Pipeline`), and a training step run through them by a schedule (`PipelineExecutor`).

A job of ``pp`` pipeline ranks, each holding ``pp_stages_per_rank`` stages, has ``pp *
pp_stages_per_rank`` stages, placed in a loop: stage ``s`` on pipeline rank ``s % pp`` (rank 0
holds stages 0 and ``pp``, ... -- Megatron-LM's interleaved layout). Each stage is a part of
the model that keeps its parameter names (`cadence.engine.pipeline_stages`); its tensor
parallelism and FSDP2 are applied per stage, over the runtime's ``tp`` and data-parallel
sub-meshes, by the Task's own ``parallelize`` (as torchtitan parallelizes each model part).

A step (`PipelineExecutor.run`) is one batch -- this data shard's part of the global batch --
split into ``pp_microbatches`` microbatches that the schedule (torch.distributed.pipelining's
``ScheduleGPipe``, ``Schedule1F1B`` or ``ScheduleInterleaved1F1B``) runs through the stages,
forward and backward; every stage gets each microbatch's features, the first its inputs, the
last its labels and the loss. The gradients are the mean over the microbatches (as one
process's over the batch, for a loss that is a mean), summed between the stages that share a
tied parameter, and left for the caller's update, as `cadence.engine.step_executor` leaves
them. Evaluation (`PipelineExecutor.evaluate`) runs the forward alone.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cadence.core.errors import ConfigError
from cadence.engine.parallelize import ParallelOptions, prepare_model, unwrapped_name
from cadence.engine.pipeline_stages import (
    StageModule,
    StagePart,
    StagePlan,
    check_splittable,
    plan_stages,
    shared_parameters,
    stage_part,
)
from cadence.engine.placeholders import is_placeholder

logger = logging.getLogger("cadence")


@dataclass
class Pipeline:
    """This rank's stages of a model split into a pipeline (see the module docstring).

    Attributes:
        plan: which modules each stage holds.
        parts: this rank's stages' parts, in stage order.
        modules: what the schedule runs of each: `StageModule`\\ s over the parts.
        model: this rank's stages as one module named as the model is -- the part itself when
            the rank holds one stage -- what checkpoints, the optimizer and the EMA see.
        num_stages: the stages of the whole pipeline.
        pp_group: the process group of the pipeline ranks this rank exchanges with.
        shared_groups: the group of each set of pipeline ranks that share a tied parameter.
    """

    plan: StagePlan
    parts: list[StagePart]
    modules: list[StageModule]
    model: nn.Module
    num_stages: int
    pp_group: Any
    shared_groups: dict[tuple[int, ...], Any] = field(default_factory=dict)
    pp: int = 1
    sends_state: bool = True
    """Whether this rank sends its stages' weights for `whole_state` (the first of their
    tensor- and data-parallel peers, who hold the same)."""

    @property
    def has_first(self) -> bool:
        """Whether this rank holds the first stage."""
        return self.parts[0].index == 0

    @property
    def has_last(self) -> bool:
        """Whether this rank holds the last stage (the loss)."""
        return self.parts[-1].index == self.num_stages - 1

    def _shared(self) -> list[tuple[StagePart, torch.Tensor, tuple[int, ...]]]:
        found: list[tuple[StagePart, torch.Tensor, tuple[int, ...]]] = []
        for part in self.parts:
            named: dict[str, torch.Tensor] = {unwrapped_name(name): p
                                              for name, p in part.module.named_parameters()}
            found += [(part, named[name], users) for name, users in part.shared.items()]
        return found

    def sum_shared_gradients(self) -> None:
        """Sums the gradients of each tied parameter between the stages that hold it (an
        all-reduce of its local shard between their ranks), so that every copy takes the
        same update: Megatron-LM's embedding group."""
        for _, parameter, users in self._shared():
            group = self.shared_groups.get(_ranks(users, self.pp))
            if group is None:
                continue
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            grad: Any = parameter.grad
            if hasattr(grad, "to_local"):
                # laid out as the parameter, so that the copies' local shards correspond (an
                # embedding split by rows may leave its gradient replicated)
                if grad.placements != parameter.placements:  # type: ignore[attr-defined]
                    grad = parameter.grad = grad.redistribute(
                        placements=parameter.placements)  # type: ignore[attr-defined]
                local = grad.to_local()
            else:
                local = grad
            dist.all_reduce(local, group=group)

    def whole_state(self) -> dict[str, torch.Tensor]:
        """The whole model's weights by its own names, on the host of rank 0 (an empty dict
        elsewhere): each stage's gathered from its shards, then sent to rank 0. A collective:
        every rank calls it."""
        from cadence.engine.distributed import gather_on_rank_zero
        from cadence.engine.sharded import full_model_state

        state = {name: value.detach().to("cpu", copy=True)
                 for name, value in full_model_state(self.model).items()}
        whole: dict[str, torch.Tensor] = {}
        for sent in gather_on_rank_zero(state if self.sends_state else None,
                                        "gathering the pipeline's weights"):
            whole.update(sent or {})
        return whole

    def counted_elsewhere(self) -> list[torch.Tensor]:
        """This rank's copies of tied parameters that an earlier stage counts: left out of the
        gradient norm and the model summary, so that each parameter counts once."""
        return [parameter for part, parameter, users in self._shared()
                if part.index != users[0]]


def _ranks(users: Sequence[int], pp: int) -> tuple[int, ...]:
    """The pipeline ranks of stages `users`."""
    return tuple(sorted({stage % pp for stage in users}))


def build_pipeline(model: nn.Module, runtime: Any, options: ParallelOptions, *,
                   stages_per_rank: int = 1, stage_modules: Sequence[Sequence[str]] = (),
                   parallelize: Callable[[nn.Module, Any, ParallelOptions], nn.Module]
                   | None = None, autocast: torch.dtype | None = None,
                   optimizers: Sequence[torch.optim.Optimizer] = ()) -> Pipeline:
    """Splits `model` into ``runtime.dims.pp * stages_per_rank`` stages and builds this rank's:
    each a part that keeps the model's names (`cadence.engine.pipeline_stages.stage_part`),
    on the runtime's device, spread over its ``tp`` and data-parallel sub-meshes by
    `parallelize` (default `cadence.parallelize_model`; FSDP2 keeps each stage's parameters
    gathered between its microbatches, as torchtitan does under pipeline parallelism). The
    `optimizers`, built over `model`'s parameters, are pointed at this rank's (the others'
    left out).

    Raises:
        ConfigError: for a model that cannot be split so (`plan_stages`, `check_splittable`),
            or tensor parallelism that cannot split a stage.
    """
    pp = runtime.dims.pp
    stages = pp * stages_per_rank
    check_splittable(model)
    plan = plan_stages(model, stages, stage_modules or None)
    rank = runtime.coordinates["pp"]
    names = {id(p): unwrapped_name(name) for name, p in model.named_parameters()}
    local = [rank + index * pp for index in range(stages_per_rank)]
    parts = [stage_part(model, plan, index) for index in local]
    merged = parts[0].module if len(parts) == 1 else _merged(parts, plan)
    options = dataclasses.replace(options, reshard_after_forward=False)
    modules = []
    for part in parts:
        part.module.to(runtime.device)
        prepare_model(part.module, runtime.strategy, runtime.device, options=options,
                      parallelize=parallelize, runtime=runtime)
        module = StageModule(part.module, first=part.index == 0,
                             last=part.index == stages - 1, autocast=autocast)
        if runtime.strategy == "fsdp2":  # the root FSDP2 unit that pipelining's schedule drives
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            fully_shard(module, mesh=runtime.mesh_of("dp_replicate", "dp_shard"),
                        reshard_after_forward=False, mp_policy=MixedPrecisionPolicy(
                            param_dtype=options.param_dtype, reduce_dtype=options.reduce_dtype))
        modules.append(module)
    now = {unwrapped_name(name): p for name, p in merged.named_parameters()}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["params"] = [now[names[id(p)]] if id(p) in names else p
                               for p in group["params"]
                               if id(p) not in names or names[id(p)] in now]
    groups = _shared_groups(model, plan, runtime)
    sends = all(value == 0 for name, value in runtime.coordinates.items() if name != "pp")
    pipeline = Pipeline(plan, parts, modules, merged, stages,
                        runtime.mesh_of("pp").get_group(), groups, pp, sends)
    _PIPELINES[pipeline.model] = pipeline
    return pipeline


_PIPELINES: weakref.WeakKeyDictionary[nn.Module, Pipeline] = weakref.WeakKeyDictionary()
"""Each pipeline built in this process, by its `Pipeline.model` (`pipeline_of`)."""


def pipeline_of(model: Any) -> Pipeline | None:
    """The pipeline whose stages on this rank `model` is (`build_pipeline`'s
    ``Pipeline.model``), or None: how a callback that reads the trained model (the model
    summary) learns that it holds only some of the stages."""
    return _PIPELINES.get(model) if isinstance(model, nn.Module) else None


def _merged(parts: list[StagePart], plan: StagePlan) -> nn.Module:
    """One module of this rank's stages, named as the model: a structural copy of the first
    part in which each module a local stage holds is that stage's own (shared, not copied)."""
    import copy

    owner = plan.owner()
    held: dict[str, nn.Module] = {}
    for part in parts:
        for name in owner:
            module = part.module.get_submodule(name)
            if owner[name] == part.index or not is_placeholder(module):
                held.setdefault(name, module)
    memo: dict[int, Any] = {}
    for module in held.values():
        memo[id(module)] = module
    merged = copy.deepcopy(parts[0].module, memo)
    for name in sorted(held, key=lambda n: (n.count("."), n)):
        parent, _, attribute = name.rpartition(".")
        setattr(merged.get_submodule(parent) if parent else merged, attribute, held[name])
    return merged




def _shared_groups(model: nn.Module, plan: StagePlan, runtime: Any) -> dict[tuple[int, ...], Any]:
    """A group per set of pipeline ranks that share a tied parameter, each of the ranks that
    differ only in their pipeline coordinate (a collective: every rank makes every group)."""
    pp, dims = runtime.dims.pp, runtime.dims
    wanted = sorted({_ranks(users, pp) for users in shared_parameters(model, plan).values()})
    groups: dict[tuple[int, ...], Any] = {}
    for ranks in wanted:
        if len(ranks) < 2:
            continue
        members: dict[tuple[int, ...], list[int]] = {}
        for rank in range(dims.world_size):
            coordinates = dims.coordinates(rank)
            if coordinates["pp"] in ranks:
                others = tuple(value for name, value in coordinates.items() if name != "pp")
                members.setdefault(others, []).append(rank)
        from cadence.engine.runtime import signals_to_the_main_thread

        with signals_to_the_main_thread():
            mine, _ = dist.new_subgroups_by_enumeration(list(members.values()))
        groups[ranks] = mine
    return groups


# ---------------------------------------------------------------------------- the executor


_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
              "interleaved_1f1b": "ScheduleInterleaved1F1B"}


class PipelineExecutor:
    """Runs a step's forward, loss and backward through a pipeline's stages (see the module
    docstring): the same seam as `cadence.engine.step_executor.StepExecutor`, with stages and a
    schedule.

    Args:
        pipeline: this rank's stages.
        split: a batch's ``(features, labels)`` (the Task's `split_inputs`).
        loss_fn: a microbatch's loss from its labels and the model's outputs, on the last
            stage (no metric updates: see `record`).
        schedule: ``gpipe``, ``1f1b`` or ``interleaved_1f1b``.
        microbatches: microbatches a batch is split into.
        record: called on the last stage after each training step with each microbatch's
            labels, outputs (None unless `keep_outputs`) and loss: the loss and metrics'
            updates.
        keep_outputs: whether `record` needs the model's outputs (the metrics do): the last
            stage then keeps every microbatch's until the step ends.
        evaluated: the stages evaluations run (an EMA average's), default `pipeline`.

    Raises:
        ConfigError: for a schedule or microbatches the schedule cannot take (1F1B needs at
            least as many microbatches as stages).
    """

    def __init__(self, pipeline: Pipeline, split: Callable[[Any], tuple[Any, Any]],
                 loss_fn: Callable[[Any, Any], torch.Tensor], schedule: str,
                 microbatches: int,
                 record: Callable[[Any, Any, torch.Tensor], None] | None = None,
                 keep_outputs: bool = False, evaluated: Pipeline | None = None) -> None:
        self.pipeline = pipeline
        self.split = split
        self.loss_fn = loss_fn
        self.schedule_name = schedule
        self.microbatches = microbatches
        self.record = record
        self.keep_outputs = keep_outputs
        self._labels: list[Any] = []
        self.evaluated = evaluated or pipeline
        """The stages evaluations run: the EMA average's, where there is one."""
        self._running = pipeline
        """The stages running now (the loss reads the model's outputs from its last)."""
        self._schedule = self._build(schedule, microbatches, pipeline)
        self._evaluations: dict[Any, Any] = {}
        self._zero = torch.zeros(())

    def _loss(self, outputs: Any, target: torch.Tensor) -> torch.Tensor:
        """The schedule's loss function: `target` is the microbatch's number, which picks its
        labels (pipelining splits a tensor target alone; labels may be anything)."""
        labels = self._labels[int(target.reshape(-1)[0])]  # a host tensor: no device sync
        return self.loss_fn(labels, self._running.modules[-1].outputs(outputs))

    def _build(self, name: str, microbatches: int, pipeline: Pipeline) -> Any:
        from torch.distributed import pipelining

        modules = pipeline.modules
        stages = [pipelining.PipelineStage(module, part.index, pipeline.num_stages,
                                           next(iter(part.module.parameters())).device,
                                           group=pipeline.pp_group)
                  for module, part in zip(modules, pipeline.parts)]
        kind = getattr(pipelining, _SCHEDULES[name])
        try:
            if len(stages) == 1 and name != "interleaved_1f1b":
                return kind(stages[0], microbatches, loss_fn=self._loss)
            return kind(stages, microbatches, loss_fn=self._loss)
        except ValueError as error:
            raise ConfigError(f"runtime.parallelism.pp_schedule={name} with "
                              f"pp_microbatches={microbatches}: {error}") from None

    def _inputs(self, batch: Any, microbatches: int) -> tuple[dict[str, Any], torch.Tensor]:
        """The schedule's keyword inputs for `batch` (its features), with the labels of each
        of its microbatches kept for the loss; and the target: the microbatches' numbers."""
        from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

        features, labels = self.split(batch)
        self._labels = [chunk[0] for chunk in
                        split_args_kwargs_into_chunks((labels,), None, microbatches)[0]]
        return (self.pipeline.modules[0].feature_arguments(features),
                torch.arange(microbatches))

    def run(self, batches: Sequence[Any]) -> tuple[torch.Tensor, bool]:
        """Runs the step's forward, loss and backward over `batches` (one: the pipeline's
        microbatches are its accumulation).

        Returns:
            The last microbatch's loss on the last stage (zero elsewhere), and True: backward
            ran on every stage.
        """
        pipeline = self._running = self.pipeline
        kwargs, target = self._inputs(batches[0], self.microbatches)
        losses: list[torch.Tensor] | None = [] if pipeline.has_last else None
        self._schedule.step(target=target, losses=losses,
                            return_outputs=self.keep_outputs, **kwargs)
        pipeline.sum_shared_gradients()
        if losses is None:
            return self._zero, True
        self._report(self._schedule, pipeline.modules, losses, self.record, self.keep_outputs)
        return losses[-1].detach(), True

    def _report(self, schedule: Any, modules: list[StageModule], losses: list[torch.Tensor],
                record: Callable[[Any, Any, torch.Tensor], None] | None,
                outputs: bool) -> None:
        """`record` of each microbatch's labels, outputs (where kept) and loss."""
        if record is None:
            return
        chunks = (list(self._last_stage(schedule).output_chunks) if outputs
                  else [None] * len(losses))
        for labels, output, loss in zip(self._labels, chunks, losses):
            record(labels, None if output is None else modules[-1].outputs(output),
                   loss.detach())

    @staticmethod
    def _last_stage(schedule: Any) -> Any:
        stages = getattr(schedule, "_stages", None) or [schedule._stage]
        return stages[-1]

    def evaluate(self, batch: Any,
                 record: Callable[[Any, Any, torch.Tensor], None] | None = None
                 ) -> torch.Tensor:
        """Runs the forward of `batch` through the stages (no gradients), and on the last stage
        `record` with each microbatch's labels, outputs and loss. A batch is split into the
        most microbatches up to ``pp_microbatches`` that divide it evenly (an evaluation's last
        batch may be smaller); each shape is set up once.

        Returns:
            The batch's mean loss, on every stage (sent from the last).
        """
        size = _batch_size(batch)
        microbatches = max(m for m in range(1, self.microbatches + 1) if size % m == 0)
        kwargs, target = self._inputs(batch, microbatches)
        key = (microbatches, tuple((name, tuple(value.shape)) for name, value in kwargs.items()
                                   if isinstance(value, torch.Tensor)))
        evaluated = self._running = self.evaluated
        schedule = self._evaluations.get(key)
        if schedule is None:
            name = "gpipe" if len(evaluated.parts) == 1 else "interleaved_1f1b"
            schedule = self._evaluations[key] = self._build(name, microbatches, evaluated)
        losses: list[torch.Tensor] | None = [] if evaluated.has_last else None
        with torch.no_grad():
            schedule.eval(target=target, losses=losses, **kwargs)
            if losses:
                self._report(schedule, evaluated.modules, losses, record, True)
                mean = torch.stack(losses).float().mean()
            else:
                mean = torch.zeros((), device=self._device(evaluated))
            dist.broadcast(mean, group=evaluated.pp_group, group_src=evaluated.pp - 1)
        return mean

    @staticmethod
    def _device(pipeline: Pipeline) -> torch.device:
        return next(iter(pipeline.parts[0].module.parameters())).device


def _batch_size(batch: Any) -> int:
    """The first dimension of the first tensor in `batch`."""
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(batch):
        if isinstance(leaf, torch.Tensor):
            return int(leaf.shape[0])
    raise TypeError(f"A batch of no tensor cannot go through a pipeline (got "
                    f"{type(batch).__name__}).")
