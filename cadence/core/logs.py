"""Helpers for logs: the (possibly nested) mappings that runners return -- flattened, printed,
kept in checkpoints.

A leaf may be a tensor, a NumPy value or array, or a Python number. Logs reach the host (the
single host-device synchronization of a loop, once per loop) on their way to the writers:
`cadence.core.summary.to_host`. Nothing here imports torch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from cadence.core.hook_checks import describe

logger = logging.getLogger("cadence")

Logs = Mapping[str, Any]
"""A mapping from names to tensors, arrays, numbers, or nested `Logs`."""


def summary_logs(output: Any, source: str, said: set[str]) -> dict[str, Any]:
    """The logs a runner's host `output` writes as summaries: the output itself when it is a
    mapping. Orbit lets ``train`` and ``evaluate`` return a bare tensor, array or number too;
    such an output names no metric, so nothing of it is written -- which is said once per
    `source` (``"MyTrainer.train()"``), in one line (`said` remembers the sources).

    >>> summary_logs({"loss": 0.5}, "T.train()", set())
    {'loss': 0.5}
    >>> summary_logs(12, "T.train()", {"T.train()"})
    {}
    """
    if isinstance(output, Mapping):
        return dict(output)
    if output is not None and source not in said:
        said.add(source)
        logger.warning("%s returned %s, not a mapping of logs: it is returned as it is, and no "
                       "summary is written of it (return {name: value, ...} to have values "
                       "written).", source, describe(output))
    return {}


def flatten(logs: Logs, prefix: str = "", sep: str = "/") -> dict[str, Any]:
    """Flattens nested logs to ``{"a/b": value}``."""
    out: dict[str, Any] = {}
    for key, value in logs.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten(value, name, sep))
        else:
            out[name] = value
    return out


def plain_logs(logs: Logs) -> dict[str, Any]:
    """Host `logs` (after `cadence.core.summary.to_host`) with only the leaves a checkpoint
    holds as they are: numbers, strings, bools, None and lists of them, in nested mappings.
    Anything else (an image object, say) is left out.

    >>> plain_logs({"accuracy": 0.5, "per_class": [0.25, 1.0], "plot": object(),
    ...             "task": {"loss": 2.0}})
    {'accuracy': 0.5, 'per_class': [0.25, 1.0], 'task': {'loss': 2.0}}
    """
    kept = _plain(logs)
    return kept if isinstance(kept, dict) else {}


_LEFT_OUT = object()


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        items = ((str(k), _plain(v)) for k, v in value.items())
        return {k: v for k, v in items if v is not _LEFT_OUT}
    if isinstance(value, (list, tuple)):
        leaves = [_plain(v) for v in value]
        return _LEFT_OUT if any(v is _LEFT_OUT for v in leaves) else leaves
    return _LEFT_OUT


def is_scalar(value: Any) -> bool:
    """Whether `value` is a single real number: a Python int or float (NumPy's float64 is one),
    not a bool, which Python counts as an int.

    This is the package's one "a real number, not a bool" test: for host logs (after
    `cadence.core.summary.to_host`: the scalars a writer shows) and for arguments that must be
    numbers. `is_finite_scalar` adds "finite".

    >>> is_scalar(2), is_scalar(0.5), is_scalar(float("nan")), is_scalar(True), is_scalar("1")
    (True, True, True, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite_scalar(value: Any) -> bool:
    """Whether `value` is a finite real number: `is_scalar`, and neither NaN nor an infinity
    (a config's ranges, the points of a plotted series).

    >>> is_finite_scalar(0.5), is_finite_scalar(float("inf")), is_finite_scalar(False)
    (True, False, False)
    """
    return is_scalar(value) and math.isfinite(value)


def format_value(value: Any) -> str:
    """Formats one host value for a log line."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.6g}"
    if isinstance(value, list) and len(value) > 8:
        return f"[{len(value)} values]"
    return str(value)


def format_logs(logs: Logs) -> str:
    """Formats host logs as ``name=value`` pairs (nested names joined by ``/``)."""
    return ", ".join(f"{k}={format_value(v)}" for k, v in flatten(logs).items())


def humanize_duration(seconds: float) -> str:
    """A duration in days, hours, minutes and seconds (4 significant digits).

    >>> humanize_duration(65.3), humanize_duration(0.0123), humanize_duration(7203)
    ('1m 5.3s', '0.0123s', '2h 3s')
    >>> humanize_duration(0), humanize_duration(-90)
    ('0s', '1m 30s ago')
    """
    if seconds < 0:
        return humanize_duration(-seconds) + " ago"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            count = int(seconds // size)
            parts.append(f"{count}{unit}")
            seconds -= count * size
    if seconds > 1e-9 or not parts:
        parts.append(f"{seconds:.4g}s")
    return " ".join(parts)
