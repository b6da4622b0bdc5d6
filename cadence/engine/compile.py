"""Compiled steps: ``torch.compile`` of a runner's step, optionally captured in CUDA graphs.

A compiled step must not recompile per step: Dynamo guards on the Python values a step reads,
and two things in cadence change every step. Both are kept out of the graph:

- **Metric updates**: inside a compiled step they add to their accumulators in place and keep
  no Python-side counters or lists (see `cadence.engine.metrics`). The first step creates the
  accumulators, so the second compiles once more; after that, nothing changes.
- **The data iterator**: a runner's step calls ``next(iterator)``; the iterator counts batches
  in Python ints. `feed_from_outside` hands a compiled step an iterator whose ``next`` runs
  outside the graph.

(The first step is compiled too, not run eagerly: Dynamo makes an optimizer stepped inside a
compiled step CUDA-graph-capturable only while its state does not exist yet.)

torch is imported when a step is compiled or the options are checked, not with this module, so
that a config can name the compile modes without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
    from cadence.engine.runtime import graphs_available

    if cuda_graphs and not graphs_available():
        raise ValueError("cuda_graphs=True needs a CUDA device: CUDA graphs replay recorded GPU "
                         "kernels. On a CPU use compile_step=True alone.")


def compile_step(fn: Callable[..., Any], compile_mode: str | None = None,
                 cuda_graphs: bool = False) -> Callable[..., Any]:
    """``torch.compile(fn)`` (see the module docstring).

    With `cuda_graphs`, the step is compiled in the mode that captures it in CUDA graphs
    (``reduce-overhead``): one launch per graph instead of one per kernel. Its tensor outputs
    are cloned, so that keeping them across steps (a metric, a list of losses) is safe when the
    next replay overwrites the graph's own outputs.

    Args:
        fn: the step.
        compile_mode: the ``torch.compile`` mode (None: torch's default).
        cuda_graphs: capture the compiled step in CUDA graphs.

    Raises:
        ValueError: for an unknown mode, or CUDA graphs without a CUDA device.
        RuntimeError: from a call of the step, when `cuda_graphs` is on and the step cannot be
            captured (a host sync, CPU tensors, dynamic shapes, a mutated input): it would
            otherwise run uncaptured without a word.
    """
    import torch

    check_compile_options(compile_mode, cuda_graphs)
    mode = "reduce-overhead" if cuda_graphs else compile_mode
    compiled = torch.compile(fn, mode=mode)
    return _captured_or_error(compiled) if cuda_graphs else compiled


def _captured_or_error(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """`compiled`, which raises when Inductor skips a CUDA graph, and clones its outputs."""
    import torch
    from torch._dynamo.utils import counters

    from cadence.data.device import map_tensors

    def step(*args: Any, **kwargs: Any) -> Any:
        skipped = counters["inductor"]["cudagraph_skips"]
        try:
            outputs = compiled(*args, **kwargs)
        except Exception as error:
            if counters["inductor"]["cudagraph_skips"] == skipped:
                raise
            raise _not_captured(str(error)) from error
        if counters["inductor"]["cudagraph_skips"] != skipped:
            raise _not_captured("run with TORCH_LOGS=perf_hints,cudagraphs for the reason")
        return map_tensors(outputs, torch.clone)

    return step


def _not_captured(reason: str) -> RuntimeError:
    return RuntimeError(
        f"cuda_graphs=True, but the step cannot be captured in a CUDA graph ({reason}). "
        "A captured step must not read values on the host (.item(), float(tensor), printing), "
        "use CPU tensors, change its input shapes, or mutate inputs other than parameters and "
        "buffers. Fix the step, or set cuda_graphs=False (compile_step=True alone).")


def feed_from_outside(step: Callable[[Iterator[Any]], Any]) -> Callable[[Iterator[Any]], Any]:
    """`step` (a compiled ``step(iterator)``) given an iterator whose ``next`` runs outside the
    compiled graph: Dynamo would otherwise trace into the data iterator and guard on its
    position (a Python int that changes every step)."""
    import torch

    class FromOutside:
        """Forwards ``next`` to the runner's iterator, outside the graph."""

        __slots__ = ("inner",)

        def __init__(self) -> None:
            self.inner: Iterator[Any] | None = None

        def __iter__(self) -> FromOutside:
            return self

        @torch.compiler.disable
        def __next__(self) -> Any:
            assert self.inner is not None
            return next(self.inner)

    feeder = FromOutside()  # one object for every call: Dynamo guards on its identity

    def fed(iterator: Iterator[Any]) -> Any:
        if not hasattr(iterator, "__next__"):  # a nest of iterators: the step takes it as is
            return step(iterator)
        feeder.inner = iterator
        return step(feeder)

    return fed
