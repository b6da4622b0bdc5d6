"""`JSONLWriter`: one JSON object per write -- the step, the wall time, the record's extra fields
and every value -- appended to ``metrics.jsonl`` in each (sub-)directory of nested logs.

``wall_time`` is when the record was written, in seconds since the epoch (``time.time()``,
to the millisecond), as TensorBoard's events have it: runs compare by time as well as by step.

Plain lines that any tool (and ``json.loads``) reads; appending never loses earlier lines to a
crash. The file stays open between writes and is flushed with the writer.

A last line that a crash cut short (no newline) is dropped when the file is opened again, the
rule of every file cadence appends lines to (`cadence.core.files.drop_torn_line`): appended
after it, the next record would be glued to the fragment and unreadable with it.

In an evaluation directory, a step evaluated again replaces its earlier records
(`JSONLWriter.forget_step`): the file is rewritten without them, through a temporary file and a
rename, so a crash leaves the old file or the new one.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from cadence.core.checkpoint_dir import write_atomically
from cadence.core.files import close_all, open_append
from cadence.core.intervals import is_int

JSONL_NAME = "metrics.jsonl"
WALL_TIME_KEY = "wall_time"
"""The name of the wall time of each JSON line and CSV row: seconds since the epoch."""


class JSONLWriter:
    """Appends ``{"step": ..., "wall_time": ..., **extra, **values}`` lines; a line that a crash
    cut short at the end of a file is dropped before the first append (see the module
    docstring).

    Args:
        directory: the root directory; created on the first write.
        filename: the file name in each directory.
        step_key: the record's name for the step.
        fsync: flush each line to stable storage as it is written (for once-per-epoch records
            that must survive a crash; costs a disk sync per write).
    """

    def __init__(self, directory: str | os.PathLike[str], filename: str = JSONL_NAME,
                 step_key: str = "step", fsync: bool = False) -> None:
        self.directory = Path(directory)
        self.filename = filename
        self.step_key = step_key
        self.fsync = fsync
        self._files: dict[tuple[str, ...], IO[str]] = {}
        self._appended: dict[tuple[str, ...], int] = {}  # lines this writer wrote, by group
        self._earlier_steps: dict[tuple[str, ...], set[int]] = {}  # steps of the lines before

    def write(self, step: int, values: Mapping[str, Any], group: tuple[str, ...] = (),
              extra: Mapping[str, Any] | None = None) -> None:
        """Appends one record."""
        handle = self._files.get(group)
        if handle is None:
            directory = self.directory.joinpath(*group)
            directory.mkdir(parents=True, exist_ok=True)
            handle = self._files[group] = open_append(directory / self.filename)
        record = {self.step_key: int(step), WALL_TIME_KEY: round(time.time(), 3),
                  **(extra or {}), **values}
        handle.write(json.dumps(record, default=str) + "\n")
        self._appended[group] = self._appended.get(group, 0) + 1
        if self.fsync:
            handle.flush()
            os.fsync(handle.fileno())

    def forget_step(self, step: int, group: tuple[str, ...] = ()) -> None:
        """Drops the records of `step` that the file of `group` held before this writer wrote
        to it, rewriting it atomically; the lines this writer wrote stay
        (`cadence.core.protocols.StepReplacingWriter`). The file is read once per writer;
        afterwards a step it did not hold costs nothing."""
        earlier = self._earlier_steps.get(group)
        path = self.directory.joinpath(*group, self.filename)
        if (earlier is not None and step not in earlier) or not path.is_file():
            return
        handle = self._files.pop(group, None)
        if handle is not None:
            handle.close()  # reopened by the next write, after the rewrite
        # surrogateescape: bytes that are not UTF-8 go back as they came
        lines = path.read_text("utf-8", "surrogateescape").splitlines(keepends=True)
        cut = max(len(lines) - self._appended.get(group, 0), 0)
        kept = [line for line in lines[:cut] if _step_of(line, self.step_key) != step]
        self._earlier_steps[group] = {s for s in (_step_of(line, self.step_key)
                                                  for line in kept) if s is not None}
        if len(kept) < cut:
            write_atomically(path, "".join(kept + lines[cut:]), errors="surrogateescape")

    def flush(self) -> None:
        for handle in self._files.values():
            handle.flush()

    def close(self) -> None:
        files, self._files = list(self._files.values()), {}
        close_all(files)


def _step_of(line: str, step_key: str) -> int | None:
    """The step of a JSON line, or None for a line that is not a record with one."""
    try:
        step = json.loads(line).get(step_key)
    except (ValueError, AttributeError):
        return None
    return step if is_int(step) else None
