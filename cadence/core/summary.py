"""Summaries: TensorBoard event files and a ``metrics.jsonl`` per directory.

`SummaryManager` is Orbit's summary manager: one per directory, writers created lazily per
sub-directory, and nested logs written one nesting level per sub-directory, so that TensorBoard
shows ``{"train": {...}, "eval": {...}}`` as two runs on shared axes. Event files are written
with TensorBoard's own record writer and protos (``tensorboard.summary.writer``), in the calling
thread, so TensorBoard reads them as its own. Beside them, ``metrics.jsonl`` gets one JSON
object per write: ``step`` plus the scalars.

In a distributed run only rank 0 writes (the rank is read from torchrun's ``RANK`` variable).

Costs are paid where they belong: TensorBoard's writer modules are imported when an active
manager is built (not on the first write, inside a training loop), and a directory's files stay
open between writes, flushed by `flush` (once per loop) and closed by `close`.

Summaries can also be written from inside a step with `scalar`; the tag is prefixed by the
current name scope (`Module.name_scope`). Values are kept as they are -- tensors stay on the
device -- and reach the host when the manager is flushed, at the end of the loop.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cadence.core.logs import Logs, is_scalar, iter_groups, to_host
from cadence.core.scope import scoped

JSONL_NAME = "metrics.jsonl"


def process_rank() -> int:
    """This process's rank as torchrun sets it (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


@functools.cache
def _tensorboard() -> tuple[Any, Any, Any]:
    """TensorBoard's record writer and protos (importing them takes ~0.1 s, once)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    return RecordWriter, Event, Summary


def import_writer() -> None:
    """Imports TensorBoard's writer now (about 0.1 s, once per process), so that the first
    summary written inside a training loop does not pay for it. Front-ends that will write
    summaries call it when they are built; an active `SummaryManager` calls it itself."""
    _tensorboard()


_FILE_NUMBER = itertools.count()


class _EventFile:
    """One TensorBoard event file, written in the caller's thread with TensorBoard's own
    ``RecordWriter`` and protos -- the format TensorBoard's ``EventFileWriter`` writes, without
    its background thread: at one event per loop, a thread only adds hand-offs of the GIL that
    the training thread waits for."""

    def __init__(self, directory: Path) -> None:
        record_writer, event_proto, _ = _tensorboard()
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.{next(_FILE_NUMBER)}")
        self._records = record_writer(open(directory / name, "wb"))  # noqa: SIM115
        self.add_event(event_proto(wall_time=time.time(), file_version="brain.Event:2"))

    def add_event(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()


class _DirectoryWriter:
    """The event file and the JSONL file of one directory, opened on first write."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._events: Any = None
        self._jsonl: Any = None

    def write(self, step: int, values: dict[str, Any], extra: dict[str, Any] | None) -> None:
        _, event_proto, summary_proto = _tensorboard()
        if self._events is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._events = _EventFile(self.directory)
            self._jsonl = open(self.directory / JSONL_NAME, "a", encoding="utf-8")  # noqa: SIM115
        summary_values = []
        for tag, value in values.items():
            if is_scalar(value):
                summary_values.append(summary_proto.Value(tag=tag, simple_value=float(value)))
        if summary_values:
            event = event_proto(wall_time=time.time(), step=int(step))
            event.summary.value.extend(summary_values)
            self._events.add_event(event)
        record = {"step": int(step), **(extra or {}), **values}
        self._jsonl.write(json.dumps(record, default=str) + "\n")

    def flush(self) -> None:
        if self._events is not None:
            self._events.flush()
            self._jsonl.flush()

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._jsonl.close()
            self._events = self._jsonl = None


class SummaryManager:
    """Writes logs as scalar summaries under `summary_dir`.

    Args:
        summary_dir: where to write; None makes every method a no-op.
        global_step: returns the step to write at when `write_summaries` gets none.
        enabled: whether this process writes; defaults to "rank 0 only".
    """

    def __init__(
        self,
        summary_dir: str | os.PathLike[str] | None,
        global_step: Callable[[], int] | None = None,
        *,
        enabled: bool | None = None,
    ) -> None:
        self.summary_dir = Path(summary_dir) if summary_dir is not None else None
        self._global_step = global_step
        self.enabled = (process_rank() == 0) if enabled is None else enabled
        self._writers: dict[tuple[str, ...], _DirectoryWriter] = {}
        self._pending: list[tuple[str, Any, int]] = []
        if self.active:
            import_writer()

    @property
    def active(self) -> bool:
        """Whether writes go anywhere."""
        return self.enabled and self.summary_dir is not None

    def summary_writer(self, relative_path: str | tuple[str, ...] = "") -> _DirectoryWriter | None:
        """The writer of a sub-directory (created lazily), or None when inactive."""
        if not self.active:
            return None
        assert self.summary_dir is not None
        key = tuple(p for p in relative_path.split("/") if p) if isinstance(
            relative_path, str) else relative_path
        if key not in self._writers:
            self._writers[key] = _DirectoryWriter(self.summary_dir.joinpath(*key))
        return self._writers[key]

    def _step(self, step: int | None) -> int:
        if step is not None:
            return step
        if self._global_step is None:
            raise ValueError(
                "write_summaries() got no `step` and the SummaryManager has no `global_step`. "
                "Pass step=... or build the manager with global_step=lambda: trainer.global_step."
            )
        return self._global_step()

    def write_summaries(
        self, logs: Logs, step: int | None = None, *, extra: dict[str, Any] | None = None
    ) -> None:
        """Writes `logs` at `step`; each nested mapping goes to a sub-directory of its key.

        Args:
            logs: nested mapping of names to tensors, arrays or numbers.
            step: the x-axis value; defaults to the manager's `global_step`.
            extra: fields added to the top-level ``metrics.jsonl`` record only (e.g. which
                checkpoint an evaluation ran on); not written to TensorBoard.
        """
        if not self.active:
            return
        step = self._step(step)
        for path, leaves in iter_groups(to_host(logs)):
            writer = self.summary_writer(path)
            assert writer is not None
            writer.write(step, leaves, extra if not path else None)

    def add_pending(self, tag: str, value: Any, step: int) -> None:
        """Queues one in-step summary; it is converted and written at the next `flush`."""
        detach = getattr(value, "detach", None)
        self._pending.append((tag, detach() if detach is not None else value, step))

    def flush(self) -> None:
        """Writes queued in-step summaries, then flushes every open file."""
        if self._pending and self.active:
            by_step: dict[int, dict[str, Any]] = {}
            for tag, value, step in self._pending:
                by_step.setdefault(step, {})[tag] = to_host(value)
            writer = self.summary_writer()
            assert writer is not None
            for step, values in sorted(by_step.items()):
                writer.write(step, values, None)
        self._pending.clear()
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        """Flushes and closes every writer."""
        self.flush()
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    @contextlib.contextmanager
    def as_default(self, record_if: Callable[[int], bool] | None = None) -> Iterator[None]:
        """Makes this manager the target of `scalar` calls inside the block.

        Args:
            record_if: called with the step of each `scalar` call; False drops the summary.
        """
        token = _ACTIVE.set((self, record_if))
        try:
            yield
        finally:
            _ACTIVE.reset(token)


_ACTIVE: contextvars.ContextVar[
    tuple[SummaryManager, Callable[[int], bool] | None] | None
] = contextvars.ContextVar("cadence_summary", default=None)


def scalar(name: str, value: Any, step: int | None = None) -> bool:
    """Writes a scalar summary from inside a step, tagged with the current name scope.

    Does nothing outside a Controller's loop (no default manager) or when the Controller's
    `summary_interval` says this step is not recorded. No host-device synchronization happens
    here: a tensor value is read when the loop ends.

    Args:
        name: the tag, prefixed by the current name scope.
        value: a number or a one-element tensor.
        step: the step to record at; defaults to the manager's global step.

    Returns:
        Whether the summary was recorded.
    """
    active = _ACTIVE.get()
    if active is None:
        return False
    manager, record_if = active
    if not manager.active:
        return False
    step = manager._step(step)
    if record_if is not None and not record_if(step):
        return False
    manager.add_pending(scoped(name), value, step)
    return True
