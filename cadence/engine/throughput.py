"""How well a run uses its hardware: tokens per second per device, TFLOPS and MFU.

A task that says what a step costs -- tokens in an example and training FLOPs per token
(`cadence.Task.tokens_per_example`, `cadence.Task.flops_per_token`: for a decoder, ``6 N + 12 L H
Q T`` as torchtitan and nanoGPT count it: N parameters, L layers, H heads, Q their width, T
tokens of context) -- gets, at every loop's end, beside ``steps_per_second``:

- ``tokens_per_second``: the whole job's;
- ``tokens_per_second_per_device``: the job's over its processes (every device, tensor- and
  pipeline-parallel ones too: torchtitan's "tps");
- ``tflops_per_device``: the training FLOPs each device did per second, in 10^12;
- ``mfu_percent``: model FLOPs utilization, that against the device's peak (`peak_flops`: a
  table of datasheet figures, dense, by device name and precision); none on a device whose peak
  is not known -- a CPU -- rather than a made-up one;
- ``peak_memory_gib``: the device allocator's peak over the loop, where the device counts it.

Nothing here runs per step: `Throughput.loop_rates` runs once per loop, from the loop's step
rate, and reads the device's memory counter then.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from cadence.engine.runtime import device_module, device_name

PEAK_TFLOPS: Mapping[str, Mapping[str, float]] = {
    # name in the device's name: {precision: dense TFLOPS}, from the vendors' datasheets
    "B200": {"bf16": 2250.0, "fp32": 80.0},
    "H200": {"bf16": 989.5, "fp32": 66.9},
    "H100 NVL": {"bf16": 835.0, "fp32": 60.0},
    "H100 PCIe": {"bf16": 756.0, "fp32": 51.2},
    "H100": {"bf16": 989.5, "fp32": 66.9},  # SXM
    "A100": {"bf16": 312.0, "fp32": 19.5},
    "MI300X": {"bf16": 1307.4, "fp32": 163.4},
    "MI325X": {"bf16": 1307.4, "fp32": 163.4},
}
"""Peak dense TFLOPS by device name (the first name found in the device's, in this order) and
precision (``bf16`` also stands for fp16): what MFU divides by."""


def peak_flops(name: str, precision: str) -> float | None:
    """The peak FLOPS of the device called `name` in `precision` (``bf16``, ``fp16``,
    ``fp32``), None when the table does not know it (a CPU)."""
    for key, peaks in PEAK_TFLOPS.items():
        if key in name:
            return peaks["fp32" if precision == "fp32" else "bf16"] * 1e12
    return None


@dataclass
class Throughput:
    """The rates of a loop of a task that says its cost (see the module docstring).

    Args:
        tokens_per_step: the job's tokens in one step (its global batch's examples times the
            tokens of one).
        flops_per_token: training FLOPs per token (forward and backward), or None.
        device: this process's device.
        processes: the job's processes (devices).
        precision: what the matrices are multiplied in: ``bf16``, ``fp16`` or ``fp32``.
    """

    tokens_per_step: int
    flops_per_token: float | None
    device: torch.device
    processes: int
    precision: str = "fp32"

    def __post_init__(self) -> None:
        self.peak = peak_flops(device_name(self.device), self.precision)
        module = device_module(self.device)
        self._memory = module if hasattr(module, "max_memory_allocated") else None

    def loop_rates(self, steps_per_second: float) -> dict[str, float]:
        """The loop's rates from its steps per second; starts counting the next loop's peak
        memory."""
        tokens = steps_per_second * self.tokens_per_step
        per_device = tokens / self.processes
        rates = {"tokens_per_second": tokens, "tokens_per_second_per_device": per_device}
        if self.flops_per_token is not None:
            flops = per_device * self.flops_per_token
            rates["tflops_per_device"] = flops / 1e12
            if self.peak is not None:
                rates["mfu_percent"] = 100.0 * flops / self.peak
        if self._memory is not None:
            rates["peak_memory_gib"] = self._memory.max_memory_allocated(self.device) / 2**30
            self._memory.reset_peak_memory_stats(self.device)
        return rates
