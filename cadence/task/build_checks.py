"""What a `Task`'s ``build_model``, ``build_inputs`` and ``build_metrics`` return, checked when
the `Trainer` is built -- before anything is written or trained, and never again.

Unchecked, each fails far from the hook that caused it: a ``build_inputs`` that returns None in
"This runner has no training data (train_dataset=None)", a ``build_metrics`` that returns
``{"accuracy": 0.5}`` in "'float' object has no attribute 'reset'", and validation data of no
batch in evaluations that report ``nan`` and say nothing. Each is one line here naming the hook,
what it returned and what it must return (`cadence.core.hook_checks`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import nn
from torch.utils.data import DataLoader

from cadence.core.errors import HookTypeError, HookValueError
from cadence.core.hook_checks import describe, hook_error
from cadence.data.nested import is_nested
from cadence.engine.external_metrics import is_torchmetric
from cadence.engine.runtime import is_distributed
from cadence.task.task import Task

logger = logging.getLogger("cadence")

_METRIC = ("each with update_state(labels, outputs), result(), reset() and all_reduce() (a "
           "cadence.Metric such as cadence.Accuracy()), or a torchmetrics Metric")


def built_model(task: Task) -> nn.Module:
    """``task.build_model()``, checked.

    Raises:
        HookTypeError: if it is not an ``nn.Module``.
    """
    model = task.build_model()
    if not isinstance(model, nn.Module):
        raise hook_error(HookTypeError, task, "build_model()", describe(model),
                         "a torch.nn.Module (the model to train)")
    return model


def built_metrics(task: Task, training: bool) -> dict[str, Any]:
    """``task.build_metrics(training=training)`` as a dict, checked: a mapping (or a torchmetrics
    ``MetricCollection``) of metrics the `Trainer` can reset, read and reduce across ranks --
    and, where the task keeps the default ``process_metrics``, update.

    Raises:
        HookTypeError: for anything else, naming the metric that is not one.
    """
    hook = f"build_metrics(training={training})"
    metrics = task.build_metrics(training=training)
    collection = is_torchmetric(metrics) and callable(getattr(metrics, "keys", None))
    if not (isinstance(metrics, Mapping) or collection):
        raise hook_error(HookTypeError, task, hook, describe(metrics),
                         f"a mapping of metrics by name, {_METRIC}",
                         "E.g. return {'accuracy': cadence.Accuracy()}, or {} for none.")
    metrics = dict(metrics)
    needed = ["result", "reset", "all_reduce"]
    if type(task).process_metrics is Task.process_metrics:  # the default updates them so
        needed.insert(0, "update_state")
    for name, metric in metrics.items():
        if is_torchmetric(metric):
            continue
        missing = [method for method in needed if not callable(getattr(metric, method, None))]
        if missing:
            what = (describe(metric) if len(missing) == len(needed)
                    else f"{describe(metric)}, which has no {', '.join(missing)}()")
            raise hook_error(HookTypeError, task, hook, f"{name!r}: {what}",
                             f"metrics, {_METRIC}")
    return metrics


def trainer_data(task: Task, task_config: Any, distribute: Callable[..., Any],
                 train: tuple[bool, Any], evaluate: tuple[bool, Any]) -> tuple[Any, Any]:
    """The `Trainer`'s training and validation data, checked before step 0.

    Args:
        task: the task.
        task_config: the config whose ``train_data`` and ``validation_data`` are built.
        distribute: ``Trainer.distribute_dataset``: builds this process's share with a function.
        train: whether the Trainer trains, and the training data it was given (None: build it
            with ``task.build_inputs``).
        evaluate: the same for the validation data.

    Returns:
        ``(train_data, validation_data)``: what was given, or what ``task.build_inputs`` built
        (`checked_inputs`); None for what is not needed. A Trainer that trains without
        validation says so once (an INFO line).

    Raises:
        HookTypeError: for what ``task.build_inputs`` built that cannot be iterated.
        HookValueError: for what it built that holds no batch (`checked_inputs`).
        ValueError: for validation data given that holds no batch.
    """
    (trains, train_data), (evaluates, validation_data) = train, evaluate
    if trains and train_data is None:
        train_data = checked_inputs(task, "train_data", distribute(task.build_inputs,
                                                                    task_config.train_data))
    if evaluates and validation_data is None:
        validation_data = checked_inputs(task, "validation_data", distribute(
            task.build_inputs, task_config.validation_data))
    elif evaluates:
        validation_data = non_empty(validation_data, True, lambda what: ValueError(
            f"Trainer: `validation_dataset` ({what}) must hold at least one batch: every "
            "evaluation would report nothing. Pass evaluate=False to train without validation."))
    if trains and not evaluates:
        logger.info("Training without validation (mode 'train', Trainer(evaluate=False)): no "
                    "validation data is built and nothing is evaluated.")
    return train_data, validation_data


def checked_inputs(task: Task, key: str, data: Any) -> Any:
    """`data` that ``task.build_inputs(task_config.<key>)`` returned, checked: something to
    iterate; for the validation data, with at least one batch (`non_empty`).

    Raises:
        HookTypeError: for None or something that cannot be iterated.
        HookValueError: for validation data that yields no batch.
    """
    hook = f"build_inputs(task.{key})"
    if not (hasattr(type(data), "__iter__") or hasattr(type(data), "__getitem__")):
        raise hook_error(HookTypeError, task, hook, describe(data),
                         f"the data of task.{key}: a DataLoader or another iterable of batches "
                         "(sized for one process: see InputContext)")
    return non_empty(data, key != "train_data", lambda what: hook_error(
        HookValueError, task, hook, what, "data of at least one batch",
        f"{'Training' if key == 'train_data' else 'Each evaluation'} would have nothing to "
        f"read: check what builds task.{key}"
        + ("; to train without validation, run mode 'train' (Trainer(evaluate=False))."
           if key != "train_data" else ".")))


def non_empty(data: Any, read_iterators: bool,
              refuse: Callable[[str], Exception]) -> Any:
    """`data`, or ``refuse(<what it is, in words>)`` raised when it holds no batch: a sized one
    of length 0, a DataLoader over an empty dataset and, with `read_iterators`, an iterator that
    is already at its end (its first batch is read for that: what is returned then is an
    iterator that starts with it). Data of unknown length passes (a DataLoader over an
    ``IterableDataset``: reading it would start its workers), and so does a mapping of datasets.

    Under torchrun only the whole dataset of a DataLoader is looked at, which every rank sees
    the same: one rank's shard may be empty when the others' are not, and a refusal on some
    ranks only would leave the others waiting.
    """
    if is_nested(data):
        return data
    if isinstance(data, DataLoader):
        size = _length(data.dataset)
        if size == 0:
            raise refuse("a DataLoader over a dataset of 0 examples")
        if not is_distributed() and size is not None and _length(data) == 0:
            raise refuse(f"a DataLoader of 0 batches ({size} examples, batch_size="
                         f"{data.batch_size}, drop_last={data.drop_last})")
        return data
    if is_distributed():
        return data
    if isinstance(data, Iterator):
        if not read_iterators:
            return data
        first = next(data, _END)
        if first is _END:
            raise refuse(f"{describe(data)} that yields no batch")
        return itertools.chain([first], data)
    if _length(data) == 0:
        raise refuse(f"{describe(data)}, which holds no batch")
    return data


_END = object()


def _length(data: Any) -> int | None:
    """``len(data)``, or None where it has none."""
    try:
        return len(data)
    except TypeError:
        return None
