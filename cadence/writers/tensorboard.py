"""`TensorBoardWriter`: TensorBoard event files, one per (sub-)directory of nested logs.

Event files are written with TensorBoard's own record writer and protos
(``tensorboard.summary.writer``), so TensorBoard reads them as its own; in the calling thread,
because at one event per loop a background thread (TensorBoard's ``EventFileWriter``) only adds
hand-offs of the GIL that the training thread waits for. Importing TensorBoard takes ~0.1 s: it
happens with this module, which a `SummaryManager` imports when it is built (before training),
never on the first write inside a loop.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter

from cadence.core.logs import is_scalar

_FILE_NUMBER = itertools.count()


class _EventFile:
    """One event file: TensorBoard's ``RecordWriter`` over a file opened in the caller's thread."""

    def __init__(self, directory: Path) -> None:
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.{next(_FILE_NUMBER):04d}")
        directory.mkdir(parents=True, exist_ok=True)
        self._records = RecordWriter(open(directory / name, "wb"))  # noqa: SIM115
        self.add_event(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_event(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()


class TensorBoardWriter:
    """Writes scalars as TensorBoard summaries under `directory`; each nesting group of the logs
    goes to a sub-directory (TensorBoard shows them as runs on shared axes).

    Args:
        directory: the root directory; created on the first write.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._files: dict[tuple[str, ...], _EventFile] = {}

    def write(self, step: int, values: Mapping[str, Any], group: tuple[str, ...] = (),
              extra: Mapping[str, Any] | None = None) -> None:
        """Writes the scalar `values` at `step` (other values and `extra` are not TensorBoard's
        to show)."""
        events = self._files.get(group)
        if events is None:
            events = self._files[group] = _EventFile(self.directory.joinpath(*group))
        scalars = [Summary.Value(tag=tag, simple_value=float(value))
                   for tag, value in values.items() if is_scalar(value)]
        if scalars:
            event = Event(wall_time=time.time(), step=int(step))
            event.summary.value.extend(scalars)
            events.add_event(event)

    def flush(self) -> None:
        for events in self._files.values():
            events.flush()

    def close(self) -> None:
        for events in self._files.values():
            events.close()
        self._files.clear()
