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
from typing import NamedTuple

from torch import nn
from torch.nn.parameter import is_lazy

from cadence.core.callbacks import Callback, RunState
from cadence.core.rank import process_rank
from cadence.engine.parallelize import author_class, unwrap_model

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


def summary_table(model: nn.Module) -> str:
    """The summary of `model`: a line for the whole model and a row per top-level module
    (parameters of the model's own, outside its modules, are the row ``(own)``)."""
    model = unwrap_model(model)
    total = count_parameters(model.parameters())
    lazy = f", and {total.lazy} uninitialized (lazy) parameters" if total.lazy else ""
    head = (f"Model {author_class(model).__name__}: {total.params:,} parameters "
            f"({total.trainable:,} trainable), {_bytes(total.bytes)}{lazy}")
    rows: list[tuple[str, ...]] = [
        (name, author_class(module).__name__, *_columns(count_parameters(module.parameters())))
        for name, module in model.named_children()]
    own = list(model.parameters(recurse=False))
    if own:
        rows.append(("(own)", "", *_columns(count_parameters(own))))
    if not rows:
        return head
    rows.insert(0, ("module", "type", "params", "trainable", "size"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    aligned = [
        "  " + "  ".join(cell.rjust(w) if i in (2, 3) else cell.ljust(w)
                         for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    ]
    return "\n".join([head, *aligned])


def _columns(count: Count) -> tuple[str, str, str]:
    return f"{count.params:,}", f"{count.trainable:,}", _bytes(count.bytes)


class ModelSummary(Callback):
    """Logs `summary_table` of ``state.trainer.model`` once, when training first begins (rank 0
    only; nothing per step)."""

    def __init__(self) -> None:
        self.logged = False

    def on_train_begin(self, state: RunState) -> None:
        model = state.trainer.model if state.trainer is not None else None
        if self.logged or not isinstance(model, nn.Module) or process_rank() != 0:
            return
        self.logged = True
        logger.info("%s", summary_table(model))
