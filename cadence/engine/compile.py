"""Compiled steps: ``torch.compile`` of a runner's step, optionally captured in CUDA graphs.

torch is imported when a step is compiled or the options are checked, not with this module, so
that a config can name the compile modes without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune",
                 "max-autotune-no-cudagraphs")
"""The ``torch.compile`` modes a step may be compiled with (None: torch's default)."""


def check_compile_options(compile_mode: str | None, cuda_graphs: bool) -> None:
    """Validates how a step is compiled.

    Raises:
        ValueError: for an unknown mode, or CUDA graphs without a CUDA device.
    """
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"`compile_mode` (got {compile_mode!r}) must be one of "
                         f"{', '.join(str(m) for m in COMPILE_MODES)}.")
    import torch

    if cuda_graphs and not torch.cuda.is_available():
        raise ValueError("cuda_graphs=True needs a CUDA device: CUDA graphs replay recorded GPU "
                         "kernels. On a CPU use compile_step=True alone.")


def compile_step(fn: Callable[..., Any], compile_mode: str | None = None,
                 cuda_graphs: bool = False) -> Callable[..., Any]:
    """``torch.compile(fn)``; with `cuda_graphs`, in the mode that captures the compiled step
    in CUDA graphs (``reduce-overhead``): one launch per step instead of one per kernel. A
    step that cannot be captured (host syncs, dynamic shapes, CPU tensors) runs compiled but
    uncaptured; ``TORCH_LOGS=perf_hints`` says why."""
    import torch

    check_compile_options(compile_mode, cuda_graphs)
    mode = "reduce-overhead" if cuda_graphs else compile_mode
    return torch.compile(fn, mode=mode)
