"""How a model is spread over the ranks and wrapped for memory and speed: `parallelize_model`.

A real model is parallelized per **repeated block** -- a transformer's layers -- not per
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
any other user calls it, or `cadence.engine.distributed.prepare_model`, on the model before
training.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

logger = logging.getLogger("cadence")

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")
"""What wrappers insert into parameter names (activation checkpointing, ``torch.compile`` of a
module, DDP); `plain_name` removes them."""


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


def plain_name(name: str) -> str:
    """A parameter's name without what wrappers insert (`WRAPPER_PREFIXES`).

    >>> plain_name("blocks.0._checkpoint_wrapped_module.attn.weight")
    'blocks.0.attn.weight'
    """
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the children of each outermost ``nn.ModuleList`` whose
    children are all of one class and hold parameters (a transformer's layers). A block whose
    parameters are also used outside it (tied) is left to the root's group.

    >>> layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    >>> len(repeated_blocks(nn.ModuleDict({"layers": layers, "head": nn.Linear(2, 1)})))
    3
    """
    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for _, module in model.named_modules():
        if id(module) in inside or not isinstance(module, nn.ModuleList):
            continue
        children = list(module.children())
        if not children or len({type(child) for child in children}) != 1:
            continue
        if not all(any(True for _ in child.parameters()) for child in children):
            continue
        blocks.extend(children)
        inside.update(id(sub) for child in children for sub in child.modules())
    return [block for block in blocks if not _shares_parameters(block, model)]


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
    parameter outside the blocks: tied ones stay together)."""
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


def parallelize_model(model: nn.Module, mesh: Any, options: ParallelOptions,
                      blocks: Sequence[nn.Module] | None = None) -> nn.Module:
    """Applies `options` to `model`; returns the module to train.

    In this order: activation checkpointing of each block, per-block compile, then the
    strategy -- ``fsdp2``: each block and the root sharded in place over `mesh` (the returned
    module is `model`); ``ddp``: a ``DistributedDataParallel`` wrapper (checkpoints hold
    `model`); ``none``: `model`.

    Args:
        model: the model, on its device.
        mesh: the device mesh of the data-parallel ranks (None without a process group).
        options: what to apply.
        blocks: the repeated blocks; default `repeated_blocks(model)`. Without any, FSDP2
            shards the whole model as one group.

    Raises:
        ValueError: for an unknown strategy, or DDP/FSDP2 without a mesh.
    """
    if options.strategy not in ("none", "ddp", "fsdp2"):
        raise ValueError(f"options.strategy (got {options.strategy!r}) must be 'none', 'ddp' "
                         "or 'fsdp2' (resolve 'auto' with resolve_strategy first).")
    if options.strategy != "none" and mesh is None:
        raise ValueError(f"strategy {options.strategy!r} needs a device mesh: call "
                         "cadence.engine.distributed.prepare_model, which makes one.")
    blocks = list(repeated_blocks(model) if blocks is None else blocks)
    if options.activation_checkpointing:
        blocks = apply_activation_checkpointing(model, blocks)
    if options.compile_blocks:
        compile_blocks(blocks, options.compile_mode)
    if options.strategy == "fsdp2":
        shard_model(model, mesh, blocks, options)
    elif options.strategy == "ddp":
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        return nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if blocks:
        logger.debug("Parallelized %d blocks of %s (%s).", len(blocks), type(model).__name__,
                     options)
    return model
