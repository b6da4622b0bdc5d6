"""Threads that write checkpoints while training goes on: `in_background` runs a write in a
thread of its own at a lower CPU priority (`yield_cpu_to_training`), its result or error in a
future that the training thread waits on when it must (`CheckpointManager.wait`)."""

from __future__ import annotations

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
