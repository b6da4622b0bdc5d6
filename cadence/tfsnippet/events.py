"""`EventSource` and `EventKeys`: tfsnippet's event system (seed 004), on cadence's engine.

Handlers are plain callables registered per key. ``fire`` calls them in registration order;
``reverse_fire`` in reverse order, which is what every "after" event uses, so that handlers that
set something up before an epoch or step tear it down in stack order after it.

>>> events = EventSource()
>>> calls = []
>>> events.on(EventKeys.BEFORE_EPOCH, lambda loop: calls.append("first"))
>>> events.on(EventKeys.BEFORE_EPOCH, lambda loop: calls.append("second"))
>>> events.fire(EventKeys.BEFORE_EPOCH, None)
>>> events.reverse_fire(EventKeys.BEFORE_EPOCH, None)
>>> calls
['first', 'second', 'second', 'first']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


class EventKeys:
    """The events a `cadence.TrainLoop` fires, with the arguments handlers receive.

    ========================== ============================================== ==============
    key                        when                                           arguments
    ========================== ============================================== ==============
    ``ENTER_LOOP``             entering ``with TrainLoop(...)`` (after a       ``(loop)``
                               checkpoint was restored)
    ``BEFORE_EPOCH``           each epoch, before its body                    ``(loop)``
    ``BEFORE_STEP``            each step, before its body                     ``(loop)``
    ``AFTER_STEP``             each step, after its body (reverse order)      ``(loop)``
    ``AFTER_EPOCH``            each epoch, after its body (reverse order)     ``(loop)``
    ``METRICS_COLLECTED``      `collect_metrics`                              ``(loop, metrics)``
    ``TIME_METRICS_COLLECTED`` a `timeit` block ends                          ``(loop, metrics)``
    ``METRIC_STATS_PRINTED``   `print_logs` printed metrics                   ``(loop, stats)``
    ``TIME_METRIC_STATS_PRINTED`` `print_logs` printed time metrics           ``(loop, stats)``
    ``SUMMARY_ADDED``          `add_summary`                                  ``(loop, summary)``
    ``EXIT_LOOP``              leaving the ``with`` block, also on an error   ``(loop)``
    ========================== ============================================== ==============

    Unlike tfsnippet, whose ``ENTER_LOOP`` and ``EXIT_LOOP`` were documented but never fired, every
    key here is fired, and a test checks the order.
    """

    ENTER_LOOP = "enter_loop"
    EXIT_LOOP = "exit_loop"
    BEFORE_EPOCH = "before_epoch"
    AFTER_EPOCH = "after_epoch"
    BEFORE_STEP = "before_step"
    AFTER_STEP = "after_step"
    METRICS_COLLECTED = "metrics_collected"
    TIME_METRICS_COLLECTED = "time_metrics_collected"
    METRIC_STATS_PRINTED = "metric_stats_printed"
    TIME_METRIC_STATS_PRINTED = "time_metric_stats_printed"
    SUMMARY_ADDED = "summary_added"

    @classmethod
    def all(cls) -> tuple[str, ...]:
        """Every key."""
        return tuple(v for k, v in vars(cls).items() if k.isupper())


class EventSource:
    """Registers handlers by key and fires them.

    Args:
        allowed_event_keys: the keys handlers may be registered for and fired with; None allows
            any key.
    """

    def __init__(self, allowed_event_keys: Iterable[str] | None = None) -> None:
        self._allowed = frozenset(allowed_event_keys) if allowed_event_keys is not None else None
        self._handlers: dict[str, list[Callable[..., Any]]] = {}

    def _check(self, key: str) -> None:
        if self._allowed is not None and key not in self._allowed:
            raise KeyError(f"Event key {key!r} is not allowed; allowed: "
                           f"{', '.join(sorted(self._allowed))}.")

    def on(self, key: str, handler: Callable[..., Any]) -> None:
        """Calls `handler` whenever `key` fires."""
        self._check(key)
        self._handlers.setdefault(key, []).append(handler)

    def off(self, key: str, handler: Callable[..., Any]) -> None:
        """Stops calling `handler` for `key`.

        Raises:
            ValueError: if `handler` is not registered for `key`.
        """
        self._check(key)
        handlers = self._handlers.get(key, [])
        if handler not in handlers:
            raise ValueError(f"{handler!r} is not registered for event {key!r}.")
        handlers.remove(handler)

    def handlers(self, key: str) -> list[Callable[..., Any]]:
        """The live list of `key`'s handlers: handlers registered or removed later show in it
        (a loop checks it each step to skip `fire` when nothing listens). Do not change it."""
        self._check(key)
        return self._handlers.setdefault(key, [])

    def fire(self, key: str, *args: Any, **kwargs: Any) -> None:
        """Calls the handlers of `key` in registration order."""
        self._check(key)
        handlers = self._handlers.get(key)
        if handlers:  # a copy: a handler may register or remove handlers
            for handler in list(handlers):
                handler(*args, **kwargs)

    def reverse_fire(self, key: str, *args: Any, **kwargs: Any) -> None:
        """Calls the handlers of `key` in reverse registration order."""
        self._check(key)
        handlers = self._handlers.get(key)
        if handlers:
            for handler in reversed(list(handlers)):
                handler(*args, **kwargs)

    def clear_event_handlers(self, key: str | None = None) -> None:
        """Removes the handlers of `key`, or of every key."""
        if key is None:
            for handlers in self._handlers.values():
                handlers.clear()  # in place: `handlers` lists stay live
        else:
            self._check(key)
            self._handlers.get(key, []).clear()
