"""Gradient clipping by the total norm of every gradient, wherever its shards live.

torch's ``clip_grad_norm_`` computes one norm over its gradients as one kind of tensor: plain
tensors, or DTensors of one mesh. A model spread over an N-D mesh holds several kinds at once --
tensor parallelism's split weights are DTensors on the ``tp`` mesh (with FSDP2, on ``dp_shard``
x ``tp``) while the norms and the rest are plain tensors (with FSDP2, DTensors of ``dp_shard``
alone) -- and the stock function then fails ("got mixed torch.Tensor and DTensor", "All operands
... must have the same mesh"). Under pipeline parallelism each stage holds a part of the model
and the stock norm is silently that stage's alone.

`clip_grad_norm_` groups the gradients by kind (their mesh, or plain), takes each group's norm
with ``torch.nn.utils.get_total_norm`` -- a DTensor group's is reduced across its mesh, whole --
sums their p-th powers (the maximum, for the infinity norm), adds the other pipeline stages'
over `pp_group`, and scales every group by the one coefficient (``clip_grads_with_norm_``), as
torchtitan's ``dist_utils.clip_grad_norm_`` does for its own two kinds. A replicated gradient
(a norm's weight under tensor parallelism: the same on every rank of the group) counts once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist


def _mesh_of(tensor: torch.Tensor) -> Any:
    """The mesh of a DTensor (its group's key), None for a plain tensor."""
    return getattr(tensor, "device_mesh", None)


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float,
                    norm_type: float = 2.0, pp_group: Any = None,
                    not_counted: Iterable[torch.Tensor] = ()) -> torch.Tensor:
    """Scales the gradients of `parameters` so that their total norm is at most `max_norm`;
    returns the total norm before clipping, a plain tensor, the same on every rank.

    Args:
        parameters: the trained parameters (plain tensors or DTensors of any meshes).
        max_norm: the largest total norm kept.
        norm_type: p of the p-norm (``math.inf``: the largest element).
        pp_group: the pipeline's process group, whose other stages hold the rest of the
            gradients (None: one stage).
        not_counted: parameters among `parameters` that are clipped but not counted, because
            another stage counts them (a tied embedding's copy on a pipeline's last stage).
    """
    groups: dict[int, list[torch.Tensor]] = {}  # parameters, by the mesh of their gradient
    meshes: dict[int, Any] = {}
    for parameter in parameters:
        if parameter.grad is None:
            continue
        mesh = _mesh_of(parameter.grad)
        key = id(mesh) if mesh is not None else 0
        groups.setdefault(key, []).append(parameter)
        meshes[key] = mesh
    skipped = {id(p) for p in not_counted}
    norms = []
    for key, members in groups.items():
        grads = [p.grad for p in members if p.grad is not None and id(p) not in skipped]
        if not grads:
            continue
        norm = torch.nn.utils.get_total_norm(grads, norm_type, foreach=True)
        if meshes[key] is not None:
            norm = norm.full_tensor()  # type: ignore[attr-defined]  # whole: across its mesh
        norms.append(norm)
    if not norms:
        return torch.zeros(())
    device = norms[0].device
    stacked = torch.stack([n.to(device) for n in norms])
    if math.isinf(norm_type):
        total = stacked.max()
        if pp_group is not None:
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=pp_group)
    else:
        total = stacked.pow(norm_type).sum()
        if pp_group is not None:
            dist.all_reduce(total, group=pp_group)
        total = total.pow(1.0 / norm_type)
    for members in groups.values():
        torch.nn.utils.clip_grads_with_norm_(members, max_norm, total, foreach=True)
    return total
