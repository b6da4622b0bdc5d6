"""`stop_on_signals`: SIGTERM and Ctrl-C become a clean stop at the next step boundary.

Every front-end trains inside this context manager: the first SIGTERM or SIGINT requests a
stop through the run state (the loops end after the current step, and the front-end saves a
checkpoint and raises `cadence.Preempted`); a second Ctrl-C stops at once, without saving.
Handlers are installed only in the main thread, and the previous ones are put back afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

from cadence.core.callbacks import RunState

logger = logging.getLogger("cadence")


@contextlib.contextmanager
def stop_on_signals(state: RunState, enabled: bool = True) -> Iterator[list[int]]:
    """Yields a list that receives the number of the signal that requested the stop, if any."""
    received: list[int] = []
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, frame: Any) -> None:
        if received and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without saving
        received.append(signum)
        name = signal.Signals(signum).name
        logger.warning("Received %s: stopping after this step and saving a checkpoint.", name)
        state.request_stop(name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
