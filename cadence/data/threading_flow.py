"""The machinery of `cadence.data.dataflow.ThreadingFlow` (``DataFlow.threaded``): the next
batches of a flow, prepared in a background thread while the training step runs.

One worker thread reads the source pass after pass and keeps up to `prefetch` batches ready --
also across the end of a pass, so the first batches of the next pass are loaded while the last
ones of this pass are used (tfsnippet's ``ThreadingFlow``). The thread starts with the first
pass and stops at `close` (or when the flow is used as a context manager, at its end).

`ThreadedPasses` knows its source only as passes of batches with a position, and imports no
`DataFlow`: ``dataflow.py`` builds ``ThreadingFlow`` from it and `DataFlow`, so the import
arrow points one way.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any, Protocol, TypeVar

import torch

from cadence.core.intervals import is_int
from cadence.data.device import DeviceCopier

Batch = tuple[Any, ...]
_Self = TypeVar("_Self", bound="ThreadedPasses")


class Source(Protocol):
    """What `ThreadedPasses` reads: passes of batches, and a position (a `DataFlow`)."""

    def __iter__(self) -> Iterator[Batch]: ...

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

_END = object()
"""Marks the end of a pass in the queue."""


def _to_device(copier: DeviceCopier | None, batch: Batch) -> tuple[Batch, Any]:
    if copier is None:
        return batch, None
    moved, ready = copier.start(tuple(torch.as_tensor(a) for a in batch))
    return tuple(moved), ready


class ThreadedPasses:
    """Prepares the next batches of `source` in a background thread, so that loading overlaps
    the training step. An error in the thread is raised in the consumer, with its traceback.
    It is the half of `cadence.data.dataflow.ThreadingFlow` that is not `DataFlow`: one pass
    is `_iterate`, which `DataFlow.__iter__` runs.

    With a `device`, arrays become tensors on that device. On CUDA the thread copies each batch
    from pinned memory on its own stream, and the consumer's stream waits for that copy only
    when the batch is used: host-to-device copies overlap compute (tensorpack's
    ``StagingInput``).

    Its position is that of the last batch *consumed*: batches prepared ahead but not used are
    prepared again after a resume.

    Args:
        source: the flow to read.
        prefetch: how many batches to keep ready (at least 1).
        device: where to move batches, if anywhere.

    Raises:
        ValueError: if `prefetch` is less than 1.
    """

    def __init__(self, source: Source, prefetch: int = 2,
                 device: torch.device | str | None = None) -> None:
        if not is_int(prefetch) or prefetch < 1:
            raise ValueError(f"`prefetch` (got {prefetch!r}) must be at least 1.")
        self.source = source
        self.prefetch = prefetch
        self.device = torch.device(device) if device is not None else None
        self._copier = DeviceCopier(self.device, pin=True) if self.device is not None else None
        self._consumed_state: dict[str, Any] | None = None
        self._items: queue.Queue[Any] | None = None
        self._stop: threading.Event | None = None
        self._worker: threading.Thread | None = None
        self._pass = 0  # the pass the consumer reads next; the worker numbers its passes alike

    def __len__(self) -> int:
        return len(self.source)

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @staticmethod
    def _work(source: Source, copier: DeviceCopier | None, items: queue.Queue[Any],
              stop: threading.Event, first_pass: int) -> None:
        """The worker: reads `source` pass after pass into `items` until `stop` is set. (It
        holds no reference to the flow, so that dropping the flow stops it.)"""

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    items.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        number = first_pass
        try:
            while not stop.is_set():
                for batch in source:
                    moved, ready = _to_device(copier, batch)
                    if not put((number, moved, ready, source.state_dict())):
                        return
                if not put((number, _END, None, source.state_dict())):
                    return
                number += 1  # on to the next pass, while the consumer finishes this one
        except BaseException as error:  # handed to the consumer, raised there
            put((number, error, None, None))

    def _start(self) -> queue.Queue[Any]:
        if self._worker is None:
            if self._consumed_state is None:
                self._consumed_state = self.source.state_dict()
            items: queue.Queue[Any] = queue.Queue(self.prefetch)
            stop = self._stop = threading.Event()
            self._items = items
            self._worker = threading.Thread(
                target=self._work, args=(self.source, self._copier, items, stop, self._pass),
                daemon=True, name="cadence-dataflow")
            self._worker.start()
        assert self._items is not None
        return self._items

    def _iterate(self) -> Iterator[Batch]:
        items = self._start()
        number = self._pass
        try:
            while True:
                item_pass, payload, ready, state = items.get()
                if item_pass < number:
                    continue  # the rest of a pass the consumer left early
                if isinstance(payload, BaseException):
                    self.close()
                    raise payload
                self._consumed_state = state
                if payload is _END:
                    return
                if self._copier is not None:  # CUDA: wait for the side-stream copy
                    payload = self._copier.use(payload, ready)
                yield payload
        finally:
            self._pass = number + 1

    def close(self) -> None:
        """Stops the background thread and waits for it (the batches it prepared are dropped;
        the next pass starts it again from the position of the last batch consumed)."""
        worker, stop = self._worker, self._stop
        self._worker = self._stop = self._items = None
        if stop is not None:
            stop.set()
        if worker is not None and worker is not threading.current_thread():
            worker.join()
        if self._consumed_state is not None and worker is not None:
            # The source read ahead: put it back where the consumer is.
            self.source.load_state_dict(self._consumed_state)

    def __del__(self) -> None:
        if self._stop is not None:  # a dropped flow stops its worker
            self._stop.set()

    def state_dict(self) -> dict[str, Any]:
        if self._consumed_state is not None:
            return self._consumed_state
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self._consumed_state = None
        self.source.load_state_dict(state)
