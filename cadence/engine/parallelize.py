"""How a model is spread over the ranks and wrapped for memory and speed: `parallelize_model`.

A real model is parallelized per **repeated block** -- a transformer's layers, wherever they
are nested (``model.layers`` of a transformers decoder, ``encoder.block`` and ``decoder.block``
of a T5, timm's ``blocks`` and ``stages[i].blocks``; see `find_repeated_blocks`) -- not per
direct child: a block is the unit of FSDP2 (its parameters are gathered just before its
forward and freed after), of activation checkpointing (its activations are recomputed in
backward instead of kept) and of per-block ``torch.compile`` (one graph, reused by every
block). Parameters outside the blocks -- the embeddings, a head tied to them, the final norm --
stay in the root's group, so that tied parameters share one group (FSDP2 refuses a parameter
shared by two groups).

`parallelize_model` applies, in torchtitan's order: activation checkpointing, then per-block
compile, then data parallelism (FSDP2 on each block and the root, or a DDP wrapper). It is the
default of `cadence.Task.parallelize`, the hook through which a task chooses its own way (in
the spirit of torchtitan's ``parallelize_*`` functions and Lightning's ``configure_model``);
any other user calls it, or `cadence.engine.parallelize.prepare_model`, on the model before
training.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cadence.core.rank import process_rank
from cadence.engine.placeholders import is_placeholder
from cadence.engine.strategies import STRATEGIES

logger = logging.getLogger("cadence")

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")
"""What wrappers insert into parameter names (activation checkpointing, ``torch.compile`` of a
module, DDP); `unwrapped_name` removes them."""


@dataclass(frozen=True)
class ParallelOptions:
    """How `parallelize_model` spreads and wraps a model.

    Attributes:
        strategy: ``none``, ``ddp`` or ``fsdp2`` (resolved: not ``auto``).
        activation_checkpointing: recompute each block's activations in backward (memory for
            compute: about one more forward per step).
        compile_blocks: ``torch.compile`` each block in place (its state-dict keys stay).
        compile_mode: the mode of that compile (None: torch's default).
        param_dtype: FSDP2 gathers and computes with the parameters in this dtype (e.g.
            ``torch.bfloat16``); None keeps their own. The sharded parameters and the optimizer
            state keep theirs.
        reduce_dtype: FSDP2 reduces gradients in this dtype (e.g. ``torch.float32`` with bf16
            parameters); None: `param_dtype`.
        reshard_after_forward: FSDP2 frees each block's gathered parameters after its forward
            (and gathers them again for backward): less memory, one more all-gather per block.
    """

    strategy: str = "none"
    activation_checkpointing: bool = False
    compile_blocks: bool = False
    compile_mode: str | None = None
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    reshard_after_forward: bool = True

    @property
    def wraps(self) -> bool:
        """Whether `parallelize_model` changes anything at all."""
        return (self.strategy != "none" or self.activation_checkpointing
                or self.compile_blocks)


def unwrapped_name(name: str) -> str:
    """A parameter's name without what wrappers insert (`WRAPPER_PREFIXES`).

    >>> unwrapped_name("blocks.0._checkpoint_wrapped_module.attn.weight")
    'blocks.0.attn.weight'
    """
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's model inside a ``DistributedDataParallel`` or ``torch.compile`` wrapper (an
    FSDP2 model is its own: ``fully_shard`` works in place).

    >>> inner = nn.Linear(2, 2)
    >>> unwrap_model(torch.compile(inner)) is inner
    True
    """
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            inner = model.module
        elif type(model).__name__ == "OptimizedModule":  # torch.compile(model)
            inner = model._modules.get("_orig_mod")
        else:
            return model
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def author_class(module: nn.Module) -> type:
    """`module`'s class as its author wrote it: FSDP2's ``fully_shard`` swaps the class for a
    subclass named ``FSDP<name>``."""
    cls = type(module)
    if cls.__bases__ and cls.__name__ == f"FSDP{cls.__bases__[-1].__name__}":
        return cls.__bases__[-1]
    return cls


@dataclass(frozen=True)
class RepeatedBlocks:
    """What `find_repeated_blocks` found in a model.

    Attributes:
        blocks: the repeated blocks, in the model's order.
        names: each block's path in the model (``model.layers.0``).
        left_out: ``(path, reason)`` of each module that looked like a repeated block but cannot
            be one (a parameter tied to one outside it): its parameters stay with the root.
    """

    blocks: list[nn.Module]
    names: list[str]
    left_out: list[tuple[str, str]]


def _held_children(container: nn.Module) -> list[nn.Module]:
    """`container`'s children but the placeholders of a pipeline stage's part (blocks that
    another stage holds: `cadence.engine.pipeline_stages`)."""
    return [child for child in container.children() if not is_placeholder(child)]


def _is_repeated(container: nn.Module) -> bool:
    """Whether `container` holds repeated blocks: an ``nn.ModuleList`` whose children are all of
    one class and hold parameters (a transformer's layers, whatever they are), or an
    ``nn.Sequential`` of two or more such children that are blocks rather than layers -- a class
    not of ``torch.nn``, with modules of its own (timm's ``blocks``; never a
    ``Sequential(Linear, Linear)`` or a stem of a convolution and a norm). A pipeline stage's
    placeholders are not its children here."""
    if not isinstance(container, (nn.ModuleList, nn.Sequential)):
        return False
    children = _held_children(container)
    if not children or len({type(child) for child in children}) != 1:
        return False
    if not all(any(True for _ in child.parameters()) for child in children):
        return False
    if isinstance(container, nn.ModuleList):
        return True
    kind = type(children[0])
    return (len(children) >= 2 and not kind.__module__.startswith("torch.nn")
            and all(any(True for _ in child.children()) for child in children))


def _shape(module: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(p.shape)) for name, p in module.named_parameters()]


def _holds_repeated(module: nn.Module) -> bool:
    return any(_is_repeated(sub) for sub in module.modules() if sub is not module)


def find_repeated_blocks(model: nn.Module) -> RepeatedBlocks:
    """The model's repeated blocks, wherever they are nested, and what could not be one.

    A container of repeated blocks is an ``nn.ModuleList`` of one class (``model.layers`` of a
    transformers decoder, ``encoder.block`` and ``decoder.block`` of a T5) or an
    ``nn.Sequential`` of two or more composite modules of one class that ``torch.nn`` does not
    define (timm's ``blocks``). The outermost one on each path is taken -- the blocks of a
    mixture of experts, not its experts -- unless its children differ in shape and hold
    containers of their own: then those are looked into (timm ConvNeXt's ``stages``, four
    stages of four widths, each with its ``blocks``). A block whose parameters are also used
    outside it (tied) cannot be a unit of its own: it is in `RepeatedBlocks.left_out` and its
    parameters stay with the root.

    >>> layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    >>> found = find_repeated_blocks(nn.ModuleDict({"layers": layers, "head": nn.Linear(2, 1)}))
    >>> found.names
    ['layers.0', 'layers.1', 'layers.2']
    """
    names = {id(module): name for name, module in model.named_modules()}
    found: list[nn.Module] = []
    pending = [model]
    while pending:
        module = pending.pop()
        if _is_repeated(module):
            children = _held_children(module)
            shapes = {repr(_shape(child)) for child in children}
            if len(shapes) == 1 or not any(_holds_repeated(child) for child in children):
                found.extend(children)
                continue
        pending.extend(reversed(list(module.children())))
    blocks, left_out = [], []
    for block in found:
        if _shares_parameters(block, model):
            left_out.append((names[id(block)], "a parameter tied to one outside it"))
        else:
            blocks.append(block)
    return RepeatedBlocks(blocks, [names[id(block)] for block in blocks], left_out)


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (`find_repeated_blocks`): the children of each outermost
    ``nn.ModuleList`` of one class, or ``nn.Sequential`` of composite modules of one class,
    wherever it is nested. A block whose parameters are also used outside it (tied) is left to
    the root's group.

    >>> layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    >>> len(repeated_blocks(nn.ModuleDict({"layers": layers, "head": nn.Linear(2, 1)})))
    3
    """
    return find_repeated_blocks(model).blocks


def _shares_parameters(block: nn.Module, model: nn.Module) -> bool:
    """Whether a parameter of `block` is also reachable from `model` outside `block`."""
    own = {id(p) for p in block.parameters()}
    inside = {id(m) for m in block.modules()}
    for module in model.modules():
        if id(module) in inside:
            continue
        if any(id(p) in own for p in module.parameters(recurse=False)):
            return True
    return False


def name_pattern(names: Sequence[str]) -> str:
    """Paths of modules, those of one container's consecutive children as one range.

    >>> name_pattern(["model.layers.0", "model.layers.1", "model.layers.2", "head"])
    'model.layers.0-2, head'
    >>> name_pattern(["blocks.0", "blocks.2", "stages.1.blocks.0"])
    'blocks.0, blocks.2, stages.1.blocks.0'
    """
    parts: list[str] = []
    run: list[int] = []
    prefix: str | None = None

    def close() -> None:
        if run:
            span = str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
            parts.append(f"{prefix}{span}")
            run.clear()

    for name in names:
        head, _, last = name.rpartition(".")
        here = f"{head}." if head else ""
        if last.isdigit() and here == prefix and run and int(last) == run[-1] + 1:
            run.append(int(last))
            continue
        close()
        if last.isdigit():
            prefix, run[:] = here, [int(last)]
        else:
            prefix = None
            parts.append(name)
    close()
    return ", ".join(parts)


def describe_blocks(names: Sequence[str], blocks: Sequence[nn.Module]) -> str:
    """`name_pattern` of the blocks, each run of one class followed by the class's name:
    ``model.layers.0-3 (LlamaDecoderLayer)``."""
    groups: list[tuple[str, list[str]]] = []
    for name, block in zip(names, blocks):
        kind = author_class(block).__name__
        if groups and groups[-1][0] == kind:
            groups[-1][1].append(name)
        else:
            groups.append((kind, [name]))
    return ", ".join(f"{name_pattern(group)} ({kind})" for kind, group in groups)


def _parents(model: nn.Module) -> dict[int, tuple[nn.Module, str]]:
    """Each submodule's parent and its name there, by the submodule's id."""
    return {id(child): (parent, name) for parent in model.modules()
            for name, child in parent.named_children()}


def apply_activation_checkpointing(model: nn.Module, blocks: Sequence[nn.Module]
                                   ) -> list[nn.Module]:
    """Wraps each of `blocks` in torch's non-reentrant checkpoint wrapper, in place in its
    parent; returns the wrappers. State-dict keys stay as they were (the wrapper removes its
    prefix)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    parents = _parents(model)
    wrapped = []
    for block in blocks:
        parent, name = parents[id(block)]
        wrapper = checkpoint_wrapper(block, preserve_rng_state=True)
        parent.register_module(name, wrapper)
        wrapped.append(wrapper)
    return wrapped


def compile_blocks(blocks: Sequence[nn.Module], mode: str | None = None) -> None:
    """``torch.compile`` of each block, in place (``nn.Module.compile``: its parameters and
    state-dict keys stay). Blocks of one class share their compiled code."""
    for block in blocks:
        block.compile(mode=mode)


def shard_model(model: nn.Module, mesh: Any, blocks: Sequence[nn.Module],
                options: ParallelOptions) -> None:
    """FSDP2 in place: ``fully_shard`` on each block, then on the root (which keeps every
    parameter outside the blocks: tied ones stay together). Over a 2-D mesh (``dp_replicate``
    x ``dp_shard``) it is HSDP: sharded within a replica, replicated across them."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=options.param_dtype,
                                  reduce_dtype=options.reduce_dtype)
    for index, block in enumerate(blocks):
        # The last block's parameters are needed again at once by backward: keep them.
        last = index == len(blocks) - 1
        fully_shard(block, mesh=mesh, mp_policy=policy,
                    reshard_after_forward=options.reshard_after_forward and not last)
    fully_shard(model, mesh=mesh, mp_policy=policy,
                reshard_after_forward=options.reshard_after_forward)


def parallelize_model(model: nn.Module, runtime: Any, options: ParallelOptions,
                      blocks: Sequence[nn.Module] | None = None,
                      tp_plan: Mapping[str, Any] | None = None) -> nn.Module:
    """Applies `options` to `model` over the mesh of `runtime`; returns the module to train.

    In torchtitan's order: tensor parallelism over the mesh's ``tp`` dimension (the model's
    plan, or `tp_plan`: `cadence.engine.tensor_parallel`), activation checkpointing of each
    block, per-block compile, then the data-parallel strategy -- ``fsdp2``: each block and the
    root sharded in place over ``dp_shard`` (HSDP over ``dp_replicate`` x ``dp_shard``; the
    returned module is `model`); ``ddp``: a ``DistributedDataParallel`` wrapper over
    ``dp_replicate`` (checkpoints hold `model`); ``none``: `model`. When it changes anything,
    rank 0 logs one line of what it made of the model: its FSDP2 units, checkpointed and
    compiled blocks by path (``model.layers.0-3 (LlamaDecoderLayer)``), the tensor-parallel
    split, and the modules that looked repeated but could not be units (tied parameters).

    Args:
        model: the model, on its device.
        runtime: the process's `cadence.engine.runtime.Runtime` -- its mesh's dimensions by
            name. (A one-dimensional ``DeviceMesh`` of the data-parallel ranks, or None
            without a process group, is taken too, as before the runtime: the data-parallel
            dimension alone.)
        options: what to apply.
        blocks: the repeated blocks; default `find_repeated_blocks(model)`. Without any, FSDP2
            shards the whole model as one group.
        tp_plan: module-name patterns to torch's parallel styles, for a model without a plan
            of its own (`cadence.engine.tensor_parallel.tensor_parallel_plan`).

    Raises:
        ValueError: for an unknown strategy, or DDP/FSDP2 without a mesh.
        ConfigError: when tensor parallelism cannot split the model (no plan, or sizes that
            are not multiples of the degree), before anything changes.
    """
    if options.strategy not in ("none", "ddp", "fsdp2"):
        raise ValueError(f"options.strategy (got {options.strategy!r}) must be 'none', 'ddp' "
                         "or 'fsdp2' (resolve 'auto' with resolve_strategy first).")
    data_mesh, tp_mesh = _meshes(runtime, options.strategy)
    if options.strategy != "none" and data_mesh is None:
        raise ValueError(f"strategy {options.strategy!r} needs a device mesh: call "
                         "cadence.prepare_model, which makes one.")
    if blocks is None:
        found = find_repeated_blocks(model)
    else:
        paths = {id(module): name for name, module in model.named_modules()}
        found = RepeatedBlocks(list(blocks), [paths.get(id(b), "?") for b in blocks], [])
    blocks = found.blocks
    plan = None
    if tp_mesh is not None:
        from cadence.engine.tensor_parallel import apply_tensor_parallel, tensor_parallel_plan

        plan = tensor_parallel_plan(model, tp_plan)
        apply_tensor_parallel(model, tp_mesh, plan)
    if options.activation_checkpointing:
        blocks = apply_activation_checkpointing(model, blocks)
    if options.compile_blocks:
        compile_blocks(blocks, options.compile_mode)
    if (options.wraps or plan is not None) and process_rank() == 0:
        logger.info("%s", plan_line(model, found, options, plan, tp_mesh))
    if options.strategy == "fsdp2":
        shard_model(model, data_mesh, blocks, options)
    elif options.strategy == "ddp":
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        return nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type != "cpu" else None,
            process_group=data_mesh.get_group())
    return model


def _meshes(runtime: Any, strategy: str) -> tuple[Any, Any]:
    """The data-parallel mesh the strategy spreads the model over (FSDP2's ``dp_shard``, with
    ``dp_replicate`` for HSDP; DDP's ``dp_replicate``) and the ``tp`` mesh (None: no tensor
    parallelism), from a runtime -- or a one-dimensional mesh (or None) given as before it."""
    mesh_of = getattr(runtime, "mesh_of", None)
    if mesh_of is None:  # a DeviceMesh of the data-parallel ranks, or None
        return runtime, None
    data = (mesh_of("dp_replicate", "dp_shard") if strategy == "fsdp2"
            else mesh_of("dp_replicate") if strategy == "ddp" else None)
    return data, mesh_of("tp")


def plan_line(model: nn.Module, found: RepeatedBlocks, options: ParallelOptions,
              tp_plan: Mapping[str, Any] | None = None, tp_mesh: Any = None) -> str:
    """The one line `parallelize_model` logs: what it makes of `model` with `options`."""
    root = author_class(model).__name__
    described = describe_blocks(found.names, found.blocks) if found.blocks else ""
    tensor = ""
    if tp_plan is not None and tp_mesh is not None:
        tensor = (f"tensor parallel over {tp_mesh.size()} ranks ("
                  + ", ".join(f"{pattern} {type(style).__name__.replace('Parallel', '')}"
                              for pattern, style in tp_plan.items()) + "); ")
    if options.strategy == "fsdp2":
        units = (f"FSDP2 units {described} and the root {root} (the rest)" if described else
                 f"FSDP2 unit the root {root} alone (no repeated blocks found)")
    elif options.strategy == "ddp":
        units = f"DDP over the whole {root}"
    else:
        units = f"no data parallelism for {root}"
    parts = [f"Parallelized ({options.strategy}): {tensor}{units}"]
    for asked, what in ((options.activation_checkpointing, "activation checkpointing"),
                        (options.compile_blocks, "compiled")):
        if asked:
            parts.append(f"{what} {name_pattern(found.names) or 'nothing (no blocks)'}")
    if found.left_out:
        parts.append("not units, left to the root: " + ", ".join(
            f"{name} ({reason})" for name, reason in found.left_out))
    return "; ".join(parts) + "."


def resolve_strategy(strategy: str, model: nn.Module, runtime: Any = None) -> str:
    """The strategy `auto` stands for here: the runtime's (FSDP2 over data shards, DDP over
    replicas of several processes), none for a model with nothing to train (DDP refuses it).

    Raises:
        ValueError: for an unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"`strategy` (got {strategy!r}) must be one of "
                         f"{', '.join(STRATEGIES)}.")
    if strategy != "auto":
        return strategy
    from cadence.engine.runtime import current_runtime

    chosen = (runtime or current_runtime()).strategy
    trains = any(p.requires_grad for p in model.parameters())
    return chosen if trains or chosen != "ddp" else "none"


def prepare_model(model: nn.Module, strategy: str, device: torch.device,
                  optimizers: Any = (), options: ParallelOptions | None = None,
                  parallelize: Callable[[nn.Module, Any, ParallelOptions], nn.Module]
                  | None = None, runtime: Any = None) -> nn.Module:
    """The module to train: `model` spread over the ranks as `strategy` says, by `parallelize`
    (default `parallelize_model`: tensor parallelism by the model's plan where the runtime has
    a ``tp`` dimension, per-block activation checkpointing and compile as `options` say, then
    ``none``: `model` itself; ``ddp``: a DDP wrapper, while checkpoints hold `model`;
    ``fsdp2``: `model` sharded in place per repeated block, its parameters DTensors that
    checkpoints save and load sharded). DDP and FSDP2 in a process without a group get a
    group of one.

    Sharding replaces the parameters: the `optimizers` built over the old ones are pointed at
    the new ones, by name.

    Args:
        model: the model, on `device`.
        strategy: ``auto``, ``none``, ``ddp`` or ``fsdp2`` (`resolve_strategy`).
        device: its device.
        optimizers: the optimizers built over its parameters.
        options: activation checkpointing, compile, FSDP2's precision.
        parallelize: what spreads it (``parallelize(model, runtime, options)``: a Task's own
            ``parallelize``); default `parallelize_model`.
        runtime: where this process sits (`cadence.engine.runtime`); default the process's
            (`current_runtime`), laid out for `strategy` when it has data parallelism alone.

    Raises:
        ValueError: for an unknown strategy.
        ConfigError: for a strategy the runtime's layout cannot take (DDP with tensor
            parallelism), or tensor parallelism that cannot split the model.
        RuntimeError: if `parallelize` left an optimizer with parameters the trained module
            does not have (it would update nothing that trains).
    """
    from cadence.engine.runtime import current_runtime

    runtime = runtime if runtime is not None else current_runtime()
    strategy = resolve_strategy(strategy, model, runtime)
    runtime = runtime.with_strategy(strategy)
    options = dataclasses.replace(options or ParallelOptions(), strategy=strategy)
    if not options.wraps and parallelize is None and runtime.dims.tp == 1:
        return model
    names = {id(param): unwrapped_name(name) for name, param in model.named_parameters()}
    trained = (parallelize or parallelize_model)(model, runtime, options)
    now = {unwrapped_name(name): param for name, param in model.named_parameters()}
    live = {id(param) for param in trained.parameters()}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            before = [id(p) in names for p in group["params"]]
            group["params"] = [now.get(names.get(id(p), ""), p) for p in group["params"]]
            if any(was and id(p) not in live for was, p in zip(before, group["params"])):
                raise RuntimeError(
                    "After parallelizing the model, the optimizer holds parameters the trained "
                    "model does not have: it would not train it. A custom Task.parallelize must "
                    "change the model in place (fully_shard, wrappers registered in its "
                    "parents), not build a new one.")
    return trained
