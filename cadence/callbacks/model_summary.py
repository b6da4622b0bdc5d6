"""`ModelSummary`: the model's parameters, once, at the start of training (Lightning's
``ModelSummary``): how many, how many trainable, their bytes, and the same for each top-level
module, as one compact table on the ``cadence`` logger.

>>> from torch import nn
>>> print(summary_table(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))))
Model Sequential: 58 parameters (58 trainable), 232 B
  module  type    params  trainable  size
  0       Linear      40         40  160 B
  1       ReLU         0          0  0 B
  2       Linear      18         18  72 B
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, NamedTuple

from torch import nn
from torch.nn.parameter import is_lazy

from cadence.core.callbacks import Callback, RunState
from cadence.core.rank import process_rank
from cadence.engine.parallelize import author_class, unwrap_model
from cadence.engine.pipeline import pipeline_of
from cadence.engine.placeholders import is_placeholder

logger = logging.getLogger("cadence")


class Count(NamedTuple):
    """The parameters of a module (each shared one once)."""

    params: int
    trainable: int
    bytes: int
    lazy: int
    """Parameters not yet initialized (``nn.LazyLinear`` before its first call): not counted."""


def count_parameters(parameters: Iterable[nn.Parameter]) -> Count:
    """How many `parameters` hold, how many are trainable, and their bytes."""
    params = trainable = size = lazy = 0
    for p in parameters:
        if is_lazy(p):
            lazy += 1
            continue
        n = p.numel()
        params += n
        trainable += n if p.requires_grad else 0
        size += n * p.element_size()
    return Count(params, trainable, size, lazy)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError  # unreachable


Rows = list[tuple[str, str, Count]]
"""A summary's rows: each top-level module's name, class and parameters; ``(own)`` last."""


def _rows(model: nn.Module, skipped: set[int]) -> Rows:
    """Each top-level module's parameters (and the model's own), leaving out `skipped`."""
    def counted(parameters: Iterable[nn.Parameter]) -> Count:
        return count_parameters(p for p in parameters if id(p) not in skipped)

    rows: Rows = [(name, "" if is_placeholder(module) else author_class(module).__name__,
                   counted(module.parameters())) for name, module in model.named_children()]
    own = list(model.parameters(recurse=False))
    if own:
        rows.append(("(own)", "", counted(own)))
    return rows


def _merged(stages: list[Rows]) -> Rows:
    """One summary of a pipeline's stages: each row's parameters summed over them, its class
    the stage's that holds it."""
    merged: dict[str, tuple[str, Count]] = {}
    for rows in stages:
        for name, kind, count in rows:
            before = merged.get(name, ("", Count(0, 0, 0, 0)))
            merged[name] = (before[0] or kind, Count(*map(sum, zip(before[1], count))))
    return [(name, kind, count) for name, (kind, count) in merged.items()]


def summary_table(model: nn.Module, pipeline: Any = None) -> str:
    """The summary of `model`: a line for the whole model and a row per top-level module
    (parameters of the model's own, outside its modules, are the row ``(own)``).

    With a `pipeline` (`cadence.engine.pipeline.Pipeline`; `model` is this rank's stages) it
    is the whole model's, its stages' counts sent to rank 0 -- a collective: every rank calls
    it, and the table is rank 0's -- and a tied parameter that two stages hold counts once (in
    the first stage's row)."""
    model = unwrap_model(model)
    skipped = {id(p) for p in pipeline.counted_elsewhere()} if pipeline is not None else set()
    rows = _rows(model, skipped)
    total = count_parameters(p for p in model.parameters() if id(p) not in skipped)
    if pipeline is not None:
        from cadence.engine.distributed import gather_on_rank_zero

        stages = [sent for sent in gather_on_rank_zero(
            (total, rows) if pipeline.sends_state else None, "summing the stages' parameters")
            if sent]
        rows = _merged([stage_rows for _, stage_rows in stages])
        total = Count(*map(sum, zip(Count(0, 0, 0, 0), *(count for count, _ in stages))))
    lazy = f", and {total.lazy} uninitialized (lazy) parameters" if total.lazy else ""
    head = (f"Model {author_class(model).__name__}: {total.params:,} parameters "
            f"({total.trainable:,} trainable), {_bytes(total.bytes)}{lazy}")
    if not rows:
        return head
    table: list[tuple[str, ...]] = [(name, kind, *_columns(count)) for name, kind, count in rows]
    table.insert(0, ("module", "type", "params", "trainable", "size"))
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    aligned = [
        "  " + "  ".join(cell.rjust(w) if i in (2, 3) else cell.ljust(w)
                         for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
        for row in table
    ]
    return "\n".join([head, *aligned])


def _columns(count: Count) -> tuple[str, str, str]:
    return f"{count.params:,}", f"{count.trainable:,}", _bytes(count.bytes)


class ModelSummary(Callback):
    """Logs `summary_table` of ``state.trainer.model`` once, when training first begins (rank 0
    only -- a pipeline's stages count theirs on every rank; nothing per step)."""

    def __init__(self) -> None:
        self.logged = False

    def on_train_begin(self, state: RunState) -> None:
        model = state.trainer.model if state.trainer is not None else None
        pipeline = pipeline_of(model)  # its stages count on every rank
        if self.logged or not isinstance(model, nn.Module) or (
                pipeline is None and process_rank() != 0):
            return
        self.logged = True
        table = summary_table(model, pipeline)
        if process_rank() == 0:
            logger.info("%s", table)
