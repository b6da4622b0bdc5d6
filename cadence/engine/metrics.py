"""Metrics accumulated on the device: no host-device synchronization until they are read.

``update`` only does tensor arithmetic in place; ``result`` returns a tensor. The Controller
moves loop logs to the host once per loop, so a metric updated every step costs no sync.
`Mean`, the metric of losses, does even less per step: a 0-d value is only remembered, and the
remembered values are summed by one kernel when read (or every 1,024 updates) -- one kernel
launch per loop instead of one per step.

Inside a compiled step (``torch.compile``) an update takes a plain in-place path instead: it adds
to the accumulators with tensor ops and touches no Python-side counter or list, so that Dynamo
has nothing per-step to guard on: the step compiles once more after the first update created the
accumulators, and never again.

Accumulators live on the device of the values: created there on the first update, and moved
there when they were restored from a checkpoint (which loads on the CPU) or created on the CPU
from Python numbers before the first tensor arrived.

>>> import torch
>>> loss = Mean()
>>> for value in (1.0, 2.0, torch.tensor(6.0)):
...     loss.update(value)
>>> float(loss.result())
3.0
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.compiler import is_compiling as _compiling

from cadence.engine.runtime import current_runtime, is_distributed


def _static(acc: torch.Tensor) -> torch.Tensor:
    """`acc`, marked as a buffer at a fixed address (``torch._dynamo.mark_static_address``):
    CUDA graphs may mutate such an input, where a mutated ordinary input makes them skip the
    graph. Only once Dynamo is imported (by torch.compile, or the first backward): importing it
    takes seconds. Never called inside a compiled region."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.mark_static_address(acc)
    return acc


class Metric:
    """Base class: holds its accumulators as tensors on the device of the values it is updated
    with (`device`, or the first tensor update's device)."""

    _SUMMED: tuple[str, ...] = ()
    """Accumulators that add up across processes (see `all_reduce`)."""
    _FOLD_EVERY = 1024
    """Remembered 0-d values are summed at least this often (bounds the memory they hold)."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._device = torch.device(device) if device is not None else None
        self._state: dict[str, torch.Tensor] = {}
        self._remembered: dict[str, list[torch.Tensor]] = {}
        self._host_count = 0
        """Elements counted on the host, added to the ``count`` accumulator when it is read:
        one kernel per update instead of two."""

    def _count(self) -> torch.Tensor:
        """``count`` plus what was counted on the host (a new tensor)."""
        return self._state["count"] + self._host_count

    def _remember(self, name: str, value: torch.Tensor) -> None:
        """Adds the 0-d `value` to accumulator `name` later, with the other remembered values in
        one kernel: the hot path of an update launches nothing."""
        values = self._remembered.setdefault(name, [])
        values.append(value)
        if len(values) >= self._FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """Brings the accumulators up to date (before they are read, reduced or saved)."""
        for name, values in self._remembered.items():
            if values:
                total = self._state[name]
                total.add_(torch.stack(values).sum(dtype=total.dtype))
        self._remembered = {}
        self._fold_host_count()

    def _fold_host_count(self) -> None:
        if self._host_count and "count" in self._state:
            self._state["count"].add_(self._host_count)
            self._host_count = 0

    def _tensor(self, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            if self._device is None:
                self._place(value.device)
            elif value.device == self._device and not value.requires_grad:
                return value  # the hot path: nothing to detach or move
            return value.detach().to(self._device, non_blocking=True)
        return torch.as_tensor(value, dtype=torch.float32, device=self._device or "cpu")

    def _place(self, device: torch.device) -> None:
        """Makes `device` the accumulators' device, moving those that exist: restored from a
        checkpoint (loaded on the CPU) or made from Python numbers before the first tensor."""
        self._device = device
        if any(acc.device != device for acc in self._state.values()):
            self._state = {name: self._new(acc.to(device)) for name, acc in self._state.items()}

    def _new(self, acc: torch.Tensor) -> torch.Tensor:
        """A new accumulator (marked static for CUDA graphs outside a compiled region)."""
        return acc if _compiling() else _static(acc)

    def _accumulator(self, name: str, like: torch.Tensor) -> torch.Tensor:
        acc = self._state.get(name)
        if acc is None:
            dtype = torch.promote_types(like.dtype, torch.float32)
            acc = self._state[name] = self._new(torch.zeros((), dtype=dtype, device=like.device))
        return acc

    # ------------------------------------------------------------------ inside a compiled step

    def _graph_value(self, value: Any) -> torch.Tensor:
        """`value` as a detached tensor (not yet moved), inside a compiled step."""
        if isinstance(value, torch.Tensor):
            return value.detach()
        return torch.as_tensor(value, dtype=torch.float32, device=self._device or "cpu")

    def _graph_state(self, like: torch.Tensor, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The accumulators `names` inside a compiled step, placed on `like`'s device and
        created if this is the metric's first update."""
        if self._device is None:
            self._place(like.device)
        for name in names:
            self._accumulator(name, like)
        return self._state

    def update(self, value: Any, weight: Any = 1.0) -> None:
        raise NotImplementedError

    def result(self) -> torch.Tensor:
        raise NotImplementedError

    @property
    def updated(self) -> bool:
        """Whether `update` was ever called (`reset` zeroes the accumulators but keeps them).
        Reads no tensor: no host-device synchronization."""
        return bool(self._state)

    def reset(self) -> None:
        """Zeroes the accumulators in place (no new allocation, no sync)."""
        for acc in self._state.values():
            acc.zero_()
        self._remembered = {}
        self._host_count = 0

    def all_reduce(self) -> None:
        """Sums the accumulators over the processes of a distributed job, so that `result` is
        the metric of all their data; a no-op in a single process. Every process must call it.
        """
        self._fold()
        if not self._SUMMED or not is_distributed():
            return
        # Over the data-parallel ranks and the pipeline's stages (the last holds the sums, the
        # others zeros); tensor-parallel peers hold the same sums
        group = current_runtime().metric_group
        for name in self._SUMMED:  # a process that saw no data still takes part, with zeros
            if name not in self._state:
                self._state[name] = torch.zeros((), device=self._device or "cpu")
            all_reduce_anywhere(self._state[name], group)

    def state_dict(self) -> dict[str, Any]:
        self._fold()
        return {name: acc.clone() for name, acc in self._state.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the accumulators onto this metric's device -- the one given to the
        constructor or seen in updates; when none is known yet, the first update's (a
        checkpoint loads on the CPU, the values of a resumed run may live elsewhere)."""
        device = self._device
        self._state = {name: self._new(value.to(device, copy=True) if device is not None
                                       else value.clone()) for name, value in state_dict.items()}
        self._remembered = {}
        self._host_count = 0


def all_reduce_anywhere(tensor: torch.Tensor, group: Any = None) -> None:
    """``dist.all_reduce`` (a sum) of `tensor` in place over `group` (None: every rank),
    wherever it lives: an accelerator's backend (NCCL) reduces only its own device's tensors,
    so a host tensor in such a job (a metric that never saw a value, one kept on the CPU) goes
    through this rank's device and back."""
    device = current_runtime().device
    if tensor.device.type == "cpu" and device.type != "cpu":
        on_device = tensor.to(device)
        dist.all_reduce(on_device, group=group)
        tensor.copy_(on_device)  # a host read of the result: the collective's end
        return
    dist.all_reduce(tensor, group=group)


class Mean(Metric):
    """The (weighted) mean of every value seen since the last reset; a tensor value counts each
    of its elements."""

    _SUMMED: tuple[str, ...] = ("total", "count")

    def update(self, value: Any, weight: Any = 1.0) -> None:
        plain = isinstance(weight, (int, float)) and weight == 1.0
        if _compiling():  # in-place tensor ops only: nothing for Dynamo to guard on per step
            value = self._graph_value(value)
            state = self._graph_state(value, ("total", "count"))
            value = value.to(self._device)
            if plain:
                state["total"].add_(value.sum())
                state["count"].add_(value.numel())
            else:
                self._add_weighted(value, self._graph_value(weight).to(self._device))
            return
        if plain:
            if (isinstance(value, torch.Tensor) and value.dim() == 0 and "total" in self._state
                    and value.device == self._device):  # the hot path: remember it
                values = self._remembered.setdefault("total", [])  # _remember, inlined
                values.append(value.detach())
                if len(values) >= self._FOLD_EVERY:
                    self._fold()
                self._host_count += 1
                return
            value = self._tensor(value)
            self._accumulator("total", value).add_(value.sum())
            self._accumulator("count", value)
            self._host_count += value.numel()
            return
        value = self._tensor(value)
        self._accumulator("total", value)
        self._accumulator("count", value)
        self._add_weighted(value, self._tensor(weight))

    def _add_weighted(self, value: torch.Tensor, weight: torch.Tensor) -> None:
        self._state["total"].add_((value * weight).sum())
        self._state["count"].add_(weight.expand_as(value).sum() if weight.dim()
                                  else weight * value.numel())

    def result(self) -> torch.Tensor:
        """The mean as a 0-d tensor (NaN before any update)."""
        if not self._state:
            return torch.tensor(float("nan"))
        self._fold()
        return self._state["total"] / self._count()


class Moments(Mean):
    """The (weighted) mean, variance and standard deviation of every value seen since the last
    reset -- the statistics `TrainLoop` prints as ``mean (±std)``.

    Tensors stay on their device as for `Mean` (a 0-d value is only remembered; the others add
    three sums), numbers are summed on the host, and both meet when a statistic is read. Sums are
    kept in float64: a variance computed from sums of squares loses too much in float32.
    """

    _SUMMED: tuple[str, ...] = ("total", "square", "count")

    def __init__(self, device: torch.device | str | None = None) -> None:
        super().__init__(device)
        self._host_sums = [0.0, 0.0, 0.0]  # total, square, count of host numbers

    def _accumulator(self, name: str, like: torch.Tensor) -> torch.Tensor:
        acc = self._state.get(name)
        if acc is None:
            acc = self._state[name] = self._new(
                torch.zeros((), dtype=torch.float64, device=like.device))
        return acc

    def update(self, value: Any, weight: Any = 1.0) -> None:
        names = ("total", "square", "count")
        if _compiling():  # in-place tensor ops only: no host sums, nothing remembered
            value = self._graph_value(value)
            self._graph_state(value, names)
            value = value.to(self._device).double()
            if not isinstance(weight, (int, float)):
                weight = self._graph_value(weight).to(self._device).double()
            self._add_moments(value, weight)
            return
        if isinstance(value, (int, float)) and isinstance(weight, (int, float)):
            sums = self._host_sums
            sums[0] += value * weight
            sums[1] += value * value * weight
            sums[2] += weight
            return
        if (isinstance(value, torch.Tensor) and value.dim() == 0 and "square" in self._state
                and isinstance(weight, (int, float)) and weight == 1.0
                and value.device == self._device):
            self._remember("total", value.detach())  # the hot path: squared when folded
            self._host_count += 1
            return
        value = self._tensor(value).double()
        weight = self._tensor(weight).double() if not isinstance(weight, (int, float)) else weight
        for name in names:
            self._accumulator(name, value)
        self._add_moments(value, weight)

    def _add_moments(self, value: torch.Tensor, weight: Any) -> None:
        weighted = value * weight
        self._state["total"].add_(weighted.sum())
        self._state["square"].add_((weighted * value).sum())
        counts = (weight.expand_as(value).sum() if isinstance(weight, torch.Tensor)
                  and weight.dim() else weight * value.numel())
        self._state["count"].add_(counts)

    def _fold(self) -> None:
        remembered = self._remembered.get("total")
        if remembered:
            values = torch.stack(remembered).double()
            self._state["square"].add_((values * values).sum())
        super()._fold()

    def reset(self) -> None:
        super().reset()
        self._host_sums = [0.0, 0.0, 0.0]

    def merge(self, other: Moments) -> None:
        """Adds every value `other` saw to this one's statistics, as if each had been updated
        here too (`other` keeps them): its host sums on the host, its device sums with one
        kernel each. No host-device sync."""
        sums = self._host_sums
        for index, value in enumerate(other._host_sums):
            sums[index] += value
        if not (other._state or other._remembered):
            return
        other._fold()
        if self._device is None and other._device is not None:
            self._place(other._device)
        for name in self._SUMMED:
            acc = other._state.get(name)
            if acc is not None:
                self._accumulator(name, acc).add_(acc.to(self._device or acc.device))

    def _sums(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(total, square, count): the device sums plus the host ones (new tensors)."""
        total, square, count = self._host_sums
        if not self._state:
            return (torch.tensor(total, dtype=torch.float64), torch.tensor(square,
                    dtype=torch.float64), torch.tensor(count, dtype=torch.float64))
        self._fold()
        return (self._state["total"] + total, self._state["square"] + square,
                self._state["count"] + count)

    def result(self) -> torch.Tensor:
        """The mean as a 0-d float64 tensor (NaN before any update); no host sync."""
        total, _, count = self._sums()
        return total / count

    def variance(self) -> torch.Tensor:
        """The population variance (NaN before any update; never negative); no host sync."""
        total, square, count = self._sums()
        mean = total / count
        return (square / count - mean * mean).clamp_min(0.0)

    def stddev(self) -> torch.Tensor:
        """The population standard deviation."""
        return self.variance().sqrt()

    def weight(self) -> float:
        """The total weight seen: elements times their weights (a host read)."""
        return float(self._sums()[2])

    def all_reduce(self) -> None:
        """Adds the host sums to the device sums first, so that they are summed too."""
        total, square, count = self._host_sums
        if count and self._state:
            self._fold()
            for name, value in zip(("total", "square", "count"), (total, square, count)):
                self._state[name].add_(value)
            self._host_sums = [0.0, 0.0, 0.0]
        super().all_reduce()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["host"] = torch.tensor(self._host_sums, dtype=torch.float64)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        host = state.pop("host", None)
        super().load_state_dict(state)
        self._host_sums = host.tolist() if host is not None else [0.0, 0.0, 0.0]


class Sum(Metric):
    """The sum of every value seen since the last reset."""

    _SUMMED = ("total",)

    def update(self, value: Any, weight: Any = 1.0) -> None:
        plain = isinstance(weight, (int, float)) and weight == 1.0
        if _compiling():
            value = self._graph_value(value)
            total = self._graph_state(value, ("total",))["total"]
            value = value.to(self._device)
            total.add_(value.sum() if plain
                       else (value * self._graph_value(weight).to(self._device)).sum())
            return
        value = self._tensor(value)
        total = self._accumulator("total", value)
        total.add_(value.sum() if plain else (value * self._tensor(weight)).sum())

    def result(self) -> torch.Tensor:
        """The sum as a 0-d tensor (0 before any update)."""
        if not self._state:
            return torch.tensor(0.0)
        return self._state["total"].clone()


class Last(Metric):
    """The last value seen."""

    def update(self, value: Any, weight: Any = 1.0) -> None:
        value = self._tensor(value)
        last = self._state.get("last")
        if last is None or last.shape != value.shape:
            self._state["last"] = value.clone()
        else:
            last.copy_(value)

    def result(self) -> torch.Tensor:
        """The last value (NaN before any update)."""
        return self._state["last"].clone() if self._state else torch.tensor(float("nan"))

    def reset(self) -> None:
        self._state.clear()


class Accuracy(Metric):
    """The fraction of examples whose highest-scoring class is the label, since the last reset.

    `update_state` takes ``(labels, outputs)`` as a `Task`'s metrics do: integer labels of
    shape ``[N, ...]`` and scores of shape ``[N, ..., classes]``.

    >>> accuracy = Accuracy()
    >>> accuracy.update_state(torch.tensor([0, 1]), torch.tensor([[2.0, 1.0], [3.0, 0.0]]))
    >>> float(accuracy.result())
    0.5
    """

    _SUMMED = ("correct", "count")

    def update_state(self, labels: torch.Tensor, outputs: torch.Tensor) -> None:
        if _compiling():  # no Python-side list or counter for Dynamo to guard on
            labels = self._graph_value(labels)
            state = self._graph_state(labels, ("correct", "count"))
            labels = labels.to(self._device)
            state["correct"].add_((outputs.detach().argmax(dim=-1) == labels).sum())
            state["count"].add_(labels.numel())
            return
        labels = self._tensor(labels)
        correct = (outputs.detach().argmax(dim=-1) == labels).sum()
        if "correct" not in self._state:
            self._accumulator("correct", correct)
            self._accumulator("count", correct)
        self._remember("correct", correct)
        self._host_count += labels.numel()

    def update(self, value: Any, weight: Any = 1.0) -> None:
        """`update_state` with (labels, outputs)."""
        self.update_state(value, weight)

    def result(self) -> torch.Tensor:
        """The accuracy as a 0-d tensor (NaN before any update)."""
        if not self._state:
            return torch.tensor(float("nan"))
        self._fold()
        return self._state["correct"] / self._count()
