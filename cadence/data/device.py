"""Moving batches to a device: `to_device`, and `DeviceCopier`, which starts a copy of the next
batch while the current one is used (on CUDA: from pinned memory, on a side stream, with an event
that the consuming stream waits for only when the batch is used).

A batch already on the device is handed on as it is: no copy, no stream, no event. Nothing here
waits for the device on the host: the consuming stream waits for a copy's event on the device
(``cudaStreamWaitEvent``), never the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`value` (a batch: tensors in tuples, named tuples, lists, mappings) with `fn` applied to
    each of its tensors; other leaves as they are."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        return {key: map_tensors(item, fn) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        mapped = [map_tensors(item, fn) for item in value]
        return type(value)(*mapped) if hasattr(value, "_fields") else type(value)(mapped)
    return value


def to_device(value: Any, device: torch.device) -> Any:
    """`value` (a batch: tensors in tuples, lists, mappings) with its tensors moved to `device`
    without waiting for the copy (pinned memory -- ``DataLoader(pin_memory=True)`` -- makes a
    copy from the host truly asynchronous); `value` itself when they are all there already."""
    if on_device(value, device):
        return value
    return map_tensors(value, lambda tensor: tensor.to(device, non_blocking=True))


def on_device(value: Any, device: torch.device) -> bool:
    """Whether every tensor of `value` (a batch) is on `device`. A device without an index
    (``cuda``) stands for the current one, as ``tensor.to("cuda")`` does; in a process that
    uses one device of a type, any index of that type matches."""
    for tensor in _tensors(value):
        actual = tensor.device
        if actual.type != device.type or (device.index is not None
                                          and actual.index != device.index):
            return False
    return True


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a batch."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


class DeviceCopier:
    """Starts copies of batches to `device` without waiting for them. On CUDA each copy runs on
    a side stream of its own and comes with the event that marks its end; `use` makes the
    current stream wait for that event only when the batch is used. Elsewhere a copy is a plain
    move and there is no event.

    Args:
        device: where batches go.
        pin: copy host tensors into pinned memory first (when the source does not pin them,
            e.g. in a background thread), so that the copy to the GPU is truly asynchronous.
    """

    def __init__(self, device: torch.device, pin: bool = False) -> None:
        self.device = device
        self.pin = pin
        self.stream: Any = None

    def start(self, batch: Any) -> tuple[Any, Any]:
        """``(batch on the device, the CUDA event of the copy or None)``: None when nothing was
        copied (not CUDA, or the batch was on the device already)."""
        module = _streams(self.device)
        if module is None or on_device(batch, self.device):
            return to_device(batch, self.device), None
        if self.stream is None:
            self.stream = module.Stream(self.device)
        with module.stream(self.stream):
            moved = to_device(_pinned(batch) if self.pin else batch, self.device)
            ready = module.Event()
            ready.record(self.stream)
        return moved, ready

    def use(self, batch: Any, ready: Any) -> Any:
        """`batch`, once the current stream waits for its copy and owns its memory. The wait is
        on the device (the stream waits for the event); the host goes on at once."""
        if ready is not None:
            stream = torch.get_device_module(self.device).current_stream(self.device)
            stream.wait_event(ready)
            for tensor in _tensors(batch):
                tensor.record_stream(stream)
        return batch


def _streams(device: torch.device) -> Any:
    """The module of `device`'s type when it copies on streams of its own (``torch.cuda``,
    ``torch.xpu``), else None (the CPU, or an accelerator without streams)."""
    if device.type == "cpu":
        return None
    try:
        module = torch.get_device_module(device)
    except RuntimeError:  # a device type of no module (meta)
        return None
    return module if hasattr(module, "Stream") and hasattr(module, "Event") else None


def _pinned(value: Any) -> Any:
    """`value` with its host tensors in pinned memory."""
    return map_tensors(value, lambda tensor: tensor if tensor.is_cuda or tensor.is_pinned()
                        else tensor.pin_memory())
