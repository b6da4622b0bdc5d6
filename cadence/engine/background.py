"""Work that goes on while training does: `in_background` runs a checkpoint write in a thread of
its own at a lower CPU priority (`yield_cpu_to_training`), its result or error in a future that
the training thread waits on when it must (`CheckpointManager.wait`); an `AsyncCoordinator`
runs a trainer's host-side work (export writes) in one thread, in submission order, and its
``join`` waits for that work and for the checkpoint writes it was given."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


def yield_cpu_to_training() -> None:
    """Lowers the calling thread's CPU priority (on Linux a thread has its own nice value), so
    that a background write runs on CPU time the training thread does not want: where cores
    are scarce, the write takes longer instead of slowing the steps."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread)
                                                    + 10))


def in_background(name: str, work: Callable[..., Any], *args: Any) -> Future[Any]:
    """`work(*args)` in a thread of its own named `name`, at a lower CPU priority
    (`yield_cpu_to_training`); its result or its exception in the returned future."""
    future: Future[Any] = Future()

    def run() -> None:
        yield_cpu_to_training()
        try:
            future.set_result(work(*args))
        except BaseException as error:  # handed to the training thread by wait()
            future.set_exception(error)

    threading.Thread(target=run, name=name).start()
    return future


class AsyncCoordinator:
    """Runs host-side work (file writes) in one background thread, in submission order.

    `join` waits for everything submitted so far and re-raises the first error.
    """

    def __init__(self, waitables: list[Any] | None = None) -> None:
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[Any]] = []
        self._waitables: list[Any] = waitables if waitables is not None else []

    def renewed(self) -> AsyncCoordinator:
        """A fresh coordinator (no thread, nothing scheduled) whose `join` waits for the same
        waitables as this one's."""
        return AsyncCoordinator(self._waitables)

    def add_waitable(self, obj: Any) -> None:
        """Makes `join` also call ``obj.wait(retention=...)`` (a `CheckpointManager` writing in
        the background)."""
        self._waitables.append(obj)

    def schedule(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        """Runs ``fn(*args)`` in the background."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="cadence-async")
        future = self._executor.submit(fn, *args)
        self._pending.append(future)
        return future

    def join(self, waitables: bool = True, retention: bool = True) -> None:
        """Waits for all scheduled work (and, with `waitables`, for what `add_waitable` added:
        ``obj.wait(retention=...)``; False lets a checkpoint manager's deletion of old
        checkpoints go on); raises the first error any of it raised."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()
        if waitables:
            for obj in self._waitables:
                obj.wait(retention=retention)
