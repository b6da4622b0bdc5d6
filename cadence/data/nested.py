"""Nested datasets: a mapping of datasets becomes a matching mapping of iterators (Orbit's
``tf.nest`` structures of datasets, as a multi-task trainer takes them).

`StandardTrainer` and `StandardEvaluator` accept a dict (possibly of dicts) of datasets and hand
their step the same structure of iterators::

    trainer = MultiTask({"images": image_loader, "text": {"en": en_batches, "de": de_batches}})

    def train_step(self, iterator):
        images = next(iterator["images"])
        english = next(iterator["text"]["en"])

Only mappings are structures: a list or a tuple is one dataset (a list of batches).

For training, each dataset repeats on its own (it starts its next pass when it runs out, as
Orbit's datasets repeat), and each one's position is checkpointed (see
`cadence.data.iterator.DataIterator`). There is no pass over "all the data", so an epoch is
``steps_per_epoch`` steps when that is set, and never ends otherwise. For evaluation, each
iterator goes through its dataset once: a step's ``next`` raises ``StopIteration`` when its
dataset is exhausted, which ends an ``evaluate(-1)``.

>>> iterators = NestedIterators({"a": [1, 2], "b": {"c": [10, 20, 30]}})
>>> [(next(iterators["a"]), next(iterators["b"]["c"])) for _ in range(4)]
[(1, 10), (2, 20), (1, 30), (2, 10)]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from cadence.data.iterator import DataIterator


def is_nested(dataset: Any) -> bool:
    """Whether `dataset` is a structure of datasets (a mapping) rather than one dataset."""
    return isinstance(dataset, Mapping)


def iterate_nested(dataset: Any) -> Any:
    """``iter(dataset)``, or for a mapping of datasets the same mapping of iterators."""
    if is_nested(dataset):
        return {key: iterate_nested(value) for key, value in dataset.items()}
    return iter(dataset)


class RepeatingIterator:
    """Iterates a `DataIterator` pass after pass: a pass that runs out starts the next one.

    Raises:
        ValueError: from ``next`` when a pass yields no batch at all.
    """

    def __init__(self, data: DataIterator) -> None:
        self.data = data

    def __iter__(self) -> RepeatingIterator:
        return self

    def __next__(self) -> Any:
        data = self.data
        try:
            batch = next(data)
        except StopIteration:
            batch = data.next_in_pass()  # a new pass; ValueError if it is empty
        data.end_pass_at_last_batch()
        return batch


class NestedIterators(dict):
    """A dict of iterators over a mapping of datasets (nested mappings give nested dicts), each
    repeating on its own; what a `StandardTrainer` with nested datasets hands its step.

    It also answers what the trainer asks of its data (as a `DataIterator` does): its position
    for checkpoints is each dataset's position. It never ends a pass of its own.

    Args:
        source: a mapping of datasets (DataLoaders, lists of batches, ...).
        prefetch_to: move each dataset's batches to this device one batch ahead.

    Raises:
        ValueError: for an empty mapping.
    """

    pass_length: int | None = None
    batches_left: int | None = None
    batches = 0
    at_pass_start = True
    batch_size: int | None = None
    kind = "nested"
    rank_local = True
    """Each rank of a distributed job has its own positions (see `cadence.engine.rank_state`)."""

    def __init__(self, source: Mapping[str, Any],
                 prefetch_to: torch.device | str | None = None) -> None:
        super().__init__()
        if not source:
            raise ValueError("A mapping of datasets must hold at least one dataset.")
        self.source = source
        self.prefetch_to = torch.device(prefetch_to) if prefetch_to is not None else None
        for key, dataset in source.items():
            self[key] = (NestedIterators(dataset, prefetch_to) if is_nested(dataset)
                         else RepeatingIterator(DataIterator(dataset, prefetch_to)))

    def __repr__(self) -> str:
        return f"NestedIterators({sorted(self)})"

    def _parts(self) -> Iterator[tuple[str, Any]]:
        for key, value in self.items():
            yield key, value if isinstance(value, NestedIterators) else value.data

    @property
    def wait_s(self) -> float:
        """Seconds spent waiting for batches so far, over every dataset."""
        return sum(part.wait_s for _, part in self._parts())

    def end_pass(self) -> None:
        """Nothing to do: each dataset starts its next pass when it runs out."""

    def end_pass_at_last_batch(self) -> bool:
        """False: each dataset ends its own passes (a `RepeatingIterator`)."""
        return False

    def next_in_pass(self) -> Any:
        raise TypeError("Nested datasets are read by the step, one iterator at a time "
                        "(next(iterator['name'])), not as one batch.")

    def state_dict(self) -> dict[str, Any]:
        """Each dataset's position, by key."""
        return {"kind": self.kind,
                "parts": {key: part.state_dict() for key, part in self._parts()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues each dataset from its saved position.

        Raises:
            ValueError: if the checkpoint's datasets are not these (other keys, or a single
                dataset).
        """
        parts = state.get("parts") if state.get("kind") == self.kind else None
        if not isinstance(parts, dict) or set(parts) != set(self):
            saved = sorted(parts) if isinstance(parts, dict) else f"a {state.get('kind')!r} source"
            raise ValueError(f"The checkpoint's data position is for datasets {saved}, but the "
                             f"training data has {sorted(self)}. Resume with the same datasets.")
        for key, part in self._parts():
            part.load_state_dict(parts[key])
