"""torchmetrics' metrics wherever cadence's own go: built by a `Task`, kept by a runner, returned
in a runner's logs, collected by a `TrainLoop`, computed by an ``InferenceRunner``.

cadence never imports torchmetrics (an optional dependency: ``pip install 'cadence[metrics]'``):
an object is recognised as a torchmetrics ``Metric`` or ``MetricCollection`` only when the library
is already imported (``sys.modules``) -- which it must be for such an object to exist. What
cadence does with one, where it does the same for its own metrics:

- **update**: a `Task`'s ``process_metrics`` calls ``metric.update(outputs, labels)``
  (torchmetrics' order: predictions first) where it calls ``update_state(labels, outputs)`` on
  cadence's. The update itself is torchmetrics': for most metrics in-place tensor arithmetic, no
  host sync (with integer predictions ``validate_args=True`` counts distinct input values, a sync
  on CUDA; ``MeanMetric`` checks for NaNs with a host read unless ``nan_strategy="disable"``; see
  ``docs/metrics.md``).
- **read**: ``compute()``, once per loop or evaluation (`read_metric`, `compute_in_logs`).
  ``compute()`` gathers the states of every rank itself (torchmetrics' machinery, with
  ``dist_sync_on_step=False``): cadence does not all-reduce them too (`reduce_across_ranks`).
  A metric that saw no update on this rank is computed quietly: the other ranks' states still
  count, and cadence's own metrics read as NaN there without a warning either.
- **reset**: where cadence resets its own (the runner does: ``reset()`` is the same name).
- **checkpoint**: `MetricState` saves the metric's states (``metric_state``, which
  ``state_dict()`` leaves out unless ``persistent(True)``) and its update count, as this rank's
  own (``rank_local``): each rank resumes its own accumulation, and ``compute()`` after the resume
  gathers them as before. `checkpoint_part` puts it in place of a metric wherever a checkpoint
  collects its parts (`cadence.Module.checkpoint_items`, a `CheckpointManager`'s dict).
- **device**: the Task `Trainer` moves them to its device with the model (`move_metrics`).

>>> plain = object()
>>> is_torchmetric(plain), checkpoint_part(plain) is plain
(False, True)
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from cadence.core.errors import CheckpointIncompatibleError

_classes: tuple[type, ...] = ()

_UNUPDATED = r"The ``compute`` method of metric .* was called before the ``update`` method"
"""torchmetrics' warning for a metric computed before any update."""

_SHARDABLE = frozenset({"dim_zero_sum", "dim_zero_cat", "dim_zero_max", "dim_zero_min"})
"""Reductions under which one rank holding every old rank's state merged, and the others their
defaults, computes the same value as the old ranks together (see `MetricState.load_resharded`)."""


def torchmetrics_classes() -> tuple[type, ...]:
    """``(Metric, MetricCollection)`` of torchmetrics once it is imported, else ``()``."""
    global _classes
    if not _classes:
        module = sys.modules.get("torchmetrics")
        if module is not None and hasattr(module, "MetricCollection"):
            _classes = (module.Metric, module.MetricCollection)
    return _classes


def is_torchmetric(obj: Any) -> bool:
    """Whether `obj` is a torchmetrics ``Metric`` or ``MetricCollection``."""
    classes = _classes or torchmetrics_classes()
    return bool(classes) and isinstance(obj, classes)


def _is_collection(metric: Any) -> bool:
    classes = torchmetrics_classes()
    return len(classes) > 1 and isinstance(metric, classes[1])


def _members(metric: Any) -> list[Any]:
    """The metrics of a collection (in its order), or ``[metric]``."""
    if _is_collection(metric):
        return [member for _, member in metric.items(keep_base=True, copy_state=False)]
    return [metric]


def compute_metric(metric: Any) -> Any:
    """``metric.compute()``; quietly for a metric that saw no update on this rank (a rank whose
    shard was empty still takes part in the gathering of the states)."""
    if all(member.update_called for member in _members(metric)):
        return metric.compute()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_UNUPDATED)
        return metric.compute()


def read_metric(metric: Any) -> Any:
    """The value of a metric: ``compute()`` for torchmetrics', ``result()`` for the others."""
    if is_torchmetric(metric):
        return compute_metric(metric)
    return metric.result()


def reduce_across_ranks(metric: Any) -> None:
    """Makes `metric` cover every rank's data before it is read: ``all_reduce()`` for cadence's
    metrics; nothing for torchmetrics', whose ``compute()`` gathers the ranks' states itself."""
    if not is_torchmetric(metric):
        metric.all_reduce()


def holds_torchmetric(logs: Any) -> bool:
    """Whether `logs` (nested mappings, lists, tuples) hold a torchmetrics metric: only then do
    they need `compute_in_logs`."""
    if not torchmetrics_classes():
        return False
    if is_torchmetric(logs):
        return True
    if isinstance(logs, Mapping):
        return any(holds_torchmetric(item) for item in logs.values())
    if isinstance(logs, (list, tuple)):
        return any(holds_torchmetric(item) for item in logs)
    return False


def compute_in_logs(logs: Any) -> Any:
    """`logs` with every torchmetrics metric in it replaced by its ``compute()`` (a collection's
    by the mapping of its results): what a runner returns may hold the metrics themselves."""
    if logs is None or not torchmetrics_classes():
        return logs
    return _computed(logs)


def _computed(value: Any) -> Any:
    if is_torchmetric(value):
        return compute_metric(value)
    if isinstance(value, Mapping):
        return {key: _computed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_computed(item) for item in value)
    return value


def move_metrics(metrics: Iterable[Any], device: torch.device) -> None:
    """Moves the torchmetrics metrics among `metrics` (and their states) to `device`."""
    for metric in metrics:
        if is_torchmetric(metric) and any(member.device != device
                                          for member in _members(metric)):
            metric.to(device)


def checkpoint_part(obj: Any) -> Any:
    """What a checkpoint saves for `obj`: a `MetricState` for a torchmetrics metric, else `obj`."""
    return MetricState(obj) if is_torchmetric(obj) else obj


def _state_of(metric: Any) -> dict[str, Any]:
    states = {}
    for name, value in metric.metric_state.items():
        states[name] = (value.detach() if isinstance(value, torch.Tensor)
                        else [item.detach() for item in value])
    return {"states": states, "update_count": metric.update_count}


def _load(metric: Any, saved: Mapping[str, Any]) -> None:
    states = saved["states"]
    expected = set(metric.metric_state)
    if set(states) != expected:
        raise ValueError(
            f"the checkpoint holds the states {sorted(states)} and this "
            f"{type(metric).__name__} has {sorted(expected)}: it was saved from another metric")
    device = metric.device
    for name, value in states.items():
        setattr(metric, name, value.to(device) if isinstance(value, torch.Tensor)
                else [item.to(device) for item in value])
    _set_update_count(metric, int(saved["update_count"]))  # compute() warns while it is 0


def _merge(metric: Any, saved: Mapping[str, Any]) -> None:
    """Adds another rank's saved states to `metric`'s."""
    for name, reduction in _reductions(metric).items():
        if getattr(reduction, "__name__", None) not in _SHARDABLE:
            raise ValueError(f"its state {name!r} is reduced across ranks by "
                             f"{getattr(reduction, '__name__', reduction)!r}")
    incoming = {name: value.to(metric.device) if isinstance(value, torch.Tensor)
                else [item.to(metric.device) for item in value]
                for name, value in saved["states"].items()}
    metric.merge_state(incoming)
    _set_update_count(metric, metric.update_count + int(saved["update_count"]))


# torchmetrics' public API reads the states (``metric_state``), the update count
# (``update_count``) and merges states (``merge_state``), but has no way to set the update count
# of restored states, nor to say how a state is reduced across ranks. The two functions below
# are cadence's only uses of its private attributes (as of torchmetrics 1.9); nothing else here
# reaches past its public API.

def _set_update_count(metric: Any, count: int) -> None:
    """Sets `metric`'s update count (``compute()`` warns while it is 0, and a mean's
    ``merge_state`` weighs by it) and drops its cached ``compute()`` result, as its own
    ``update`` does."""
    metric._update_count = count
    metric._computed = None


def _reductions(metric: Any) -> Mapping[str, Any]:
    """How each of `metric`'s states is reduced across ranks (``add_state``'s
    ``dist_reduce_fx``), by state name."""
    reductions: Mapping[str, Any] = metric._reductions
    return reductions


class MetricState:
    """The checkpointed state of a torchmetrics ``Metric`` or ``MetricCollection``: its metric
    states and update count (a collection's: each member's), loaded back onto the metric's
    device.

    A checkpoint written before this existed holds the metric's ``state_dict()`` (empty unless
    ``persistent(True)``); it is loaded as torchmetrics loads it.

    Args:
        metric: the metric.
    """

    rank_local = True
    """Each rank accumulates its own share; ``compute()`` gathers them."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric

    def state_dict(self) -> dict[str, Any]:
        if _is_collection(self.metric):
            return {"members": {name: _state_of(member) for name, member
                                in self.metric.items(keep_base=True, copy_state=False)}}
        return _state_of(self.metric)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores the states.

        Raises:
            ValueError: if the checkpoint holds the states of another metric.
        """
        if "members" in state_dict:
            members = dict(self.metric.items(keep_base=True, copy_state=False))
            saved = state_dict["members"]
            if set(saved) != set(members):
                raise ValueError(f"the checkpoint holds the metrics {sorted(saved)} and this "
                                 f"collection has {sorted(members)}")
            for name, member in members.items():
                _load(member, saved[name])
        elif "states" in state_dict:
            _load(self.metric, state_dict)
        else:  # an earlier checkpoint: the metric's own state_dict()
            self.metric.reset()
            self.metric.load_state_dict(dict(state_dict))

    def load_resharded(self, states: list[dict[str, Any]], rank: int, world_size: int) -> str:
        """Continues from the states of the ranks of a job with another number of processes:
        new rank 0 holds every old rank's states merged, the other ranks start empty, so that
        ``compute()`` gives the value the old ranks would have.

        Raises:
            CheckpointError: for a metric whose states do not merge that way (a mean, a custom
                reduction, ``full_state_update``).
        """
        self.metric.reset()
        if rank != 0:
            return "the metric's states are merged on rank 0."
        self.load_state_dict(states[0])
        try:
            for saved in states[1:]:
                if "members" in saved:
                    members = dict(self.metric.items(keep_base=True, copy_state=False))
                    for name, member in members.items():
                        _merge(member, saved["members"][name])
                else:
                    _merge(self.metric, saved)
        except (ValueError, RuntimeError, KeyError) as error:
            raise CheckpointIncompatibleError(
                f"The states of {type(self.metric).__name__} saved by {len(states)} processes "
                f"cannot be merged for {world_size} ({error}). Resume with {len(states)} "
                "processes, or from a checkpoint taken where the metric was reset.") from error
        return "the metric's states are merged on rank 0."
