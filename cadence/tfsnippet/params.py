"""What a `TrainLoop` trains (``param_vars``): modules and loose tensors, by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from cadence.engine.external_metrics import MetricState
from cadence.engine.module import Module


class NamedTensors:
    """Loose tensors (not owned by a module) saved and restored by name."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = dict(tensors)

    def state_dict(self) -> dict[str, Any]:
        return {name: t.detach() for name, t in self.tensors.items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, tensor in self.tensors.items():
            tensor.copy_(state[name])


def _walk(param_vars: Any) -> list[tuple[str, nn.Module | torch.Tensor]]:
    """The modules and loose tensors of `param_vars`, by name, in the order given."""
    found: list[tuple[str, nn.Module | torch.Tensor]] = []

    def add(name: str, value: Any) -> None:
        if isinstance(value, nn.Module):
            found.append((name or "model", value))
        elif isinstance(value, Module):
            for path, obj in value.checkpoint_items().items():
                if isinstance(obj, MetricState):  # a torchmetrics metric: saved with its states
                    obj = obj.metric
                if isinstance(obj, nn.Module):
                    found.append((f"{name}.{path}" if name else path, obj))
        elif isinstance(value, torch.Tensor):
            found.append((name or "param", value))
        else:
            raise TypeError(
                f"param_vars holds a {type(value).__name__} at {name or 'the top level'!r}; "
                "pass parameters, nn.Modules or a cadence.Module (or a list/dict of them)."
            )

    if isinstance(param_vars, Mapping):
        for key, value in param_vars.items():
            add(str(key), value)
    elif isinstance(param_vars, (list, tuple)):
        for index, value in enumerate(param_vars):
            add(str(index), value)
    else:
        add("", param_vars)
    return found


def flatten_param_vars(param_vars: Any) -> tuple[dict[str, nn.Module], dict[str, torch.Tensor]]:
    """Modules and loose tensors of `param_vars`, by name.

    Raises:
        TypeError: for anything but parameters, ``nn.Module`` objects and cadence Modules (or
            lists and dicts of them).
    """
    found = _walk(param_vars)
    modules = {name: obj for name, obj in found if isinstance(obj, nn.Module)}
    tensors = {name: obj for name, obj in found if isinstance(obj, torch.Tensor)}
    return modules, tensors


class TrainedParameters:
    """The parameters of a `TrainLoop`'s ``param_vars`` by name, and snapshots of them (early
    stopping's best parameters) that can be put back.

    Raises:
        TypeError: as `flatten_param_vars`.
    """

    def __init__(self, param_vars: Any) -> None:
        self.modules, self.tensors = flatten_param_vars(param_vars)
        self._order = [name for name, _ in _walk(param_vars)]

    def named(self) -> dict[str, torch.Tensor]:
        """Every parameter, by ``<module>.<parameter>`` (loose tensors by their own name), in
        the order of ``param_vars`` and, inside a module, of its parameters."""
        named: dict[str, torch.Tensor] = {}
        for name in self._order:
            module = self.modules.get(name)
            if module is None:
                named[name] = self.tensors[name]
            else:
                named.update((f"{name}.{n}", p) for n, p in module.named_parameters())
        return named

    def stateful(self) -> dict[str, Any]:
        """What a checkpoint saves of them: the modules, and the loose tensors as ``params``."""
        objects: dict[str, Any] = dict(self.modules)
        if self.tensors:
            objects["params"] = NamedTensors(self.tensors)
        return objects

    def snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of every parameter, in host memory."""
        return {name: p.detach().to("cpu", copy=True) for name, p in self.named().items()}

    @torch.no_grad()
    def restore(self, snapshot: Mapping[str, torch.Tensor]) -> None:
        """Copies a snapshot back into the parameters."""
        for name, tensor in self.named().items():
            if name in snapshot:
                tensor.copy_(snapshot[name])
