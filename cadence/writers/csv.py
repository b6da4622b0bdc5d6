"""`CSVWriter`: a ``metrics.csv`` table in each (sub-)directory of nested logs -- one row per
write, one column per name -- for spreadsheets and ``pandas.read_csv``.

The table is wide, as spreadsheet and pandas users expect (``df.plot(x="step")``): the first
column is the step, then the wall time (``wall_time``: when the row was written, in seconds since
the epoch, as in ``metrics.jsonl``), then the record's extra fields (an evaluation's
``checkpoint``), then each scalar in the order its name first appeared. A row leaves empty the
names it does not have (pandas reads NaN). A name that appears later adds a column: the file is
rewritten once with the wider header (through a temporary file and a rename, so a crash leaves
the old table or the new one, never half of either); every other write appends one line.

A resumed run appends to the table it finds, under its header; rows written after the checkpoint
it resumed from stay, so a step may appear twice (``df.drop_duplicates("step", keep="last")``
keeps the resumed run's). A last line cut short by a crash is dropped on reopening (the rule of
every file cadence appends lines to: `cadence.core.files.drop_torn_line`); a row cut short
could otherwise read as a row of wrong numbers.
In an evaluation directory, a step evaluated again replaces its earlier rows
(`CSVWriter.forget_step`: the table is rewritten without them, as when it widens).
Non-scalar values (lists, strings) are left out, as TensorBoard leaves them.
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from cadence.core.files import close_all, drop_torn_line, open_append
from cadence.core.logs import is_scalar
from cadence.writers.jsonl import WALL_TIME_KEY

CSV_NAME = "metrics.csv"


def _is_cell(value: Any) -> bool:
    """Whether an extra field goes into the table (a number, a string, a flag or None)."""
    return value is None or isinstance(value, (int, float, str, bool))


class _Table:
    """One CSV file: its columns, and a handle open for appending."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.columns: list[str] = []
        self.appended = 0  # rows written through this table, at the end of the file
        self._earlier_steps: set[str] | None = None  # the steps of the rows before them
        self._handle: IO[str] | None = None
        if path.is_file() and path.stat().st_size > 0:
            drop_torn_line(path)  # before the header is read: it may be the line cut short
            with open(path, newline="", encoding="utf-8") as handle:
                self.columns = next(csv.reader(handle), [])

    def append(self, row: dict[str, Any]) -> None:
        new = [name for name in row if name not in self.columns]
        if new:
            self._widen(self.columns + new)
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open_append(self.path, newline="")
        csv.DictWriter(self._handle, self.columns, restval="").writerow(row)
        self.appended += 1

    def drop_earlier_rows(self, step_key: str, step: int) -> None:
        """Rewrites the table without the rows at `step` that were there before this table
        appended any (its own rows stay). The file is read once; afterwards a step it did not
        hold costs nothing."""
        if self._earlier_steps is not None and str(step) not in self._earlier_steps:
            return
        rows = self._rows()
        cut = max(len(rows) - self.appended, 0)
        kept = [row for row in rows[:cut] if row.get(step_key) != str(step)]
        self._earlier_steps = {row.get(step_key) or "" for row in kept}
        if len(kept) < cut:
            self._rewrite(self.columns, kept + rows[cut:])

    def _rows(self) -> list[dict[str, str]]:
        self.close()
        if not (self.path.is_file() and self.columns):
            return []
        with open(self.path, newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))

    def _widen(self, columns: list[str]) -> None:
        """Rewrites the table with `columns` as its header (the earlier rows keep their cells)."""
        self._rewrite(columns, self._rows())

    def _rewrite(self, columns: list[str], rows: list[dict[str, str]]) -> None:
        """Replaces the table with `rows` under the header `columns`, atomically."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with open(temporary, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary, self.path)
        self.columns = columns

    def flush(self) -> None:
        if self._handle is not None:
            self._handle.flush()

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()


class CSVWriter:
    """Writes ``step, wall_time, <extra fields>, <scalars>`` rows to a CSV table per nesting
    group.

    Args:
        directory: the root directory; created on the first write.
        filename: the file name in each directory.
        step_key: the name of the step column.

    >>> import tempfile
    >>> directory = Path(tempfile.mkdtemp())
    >>> writer = CSVWriter(directory)
    >>> writer.write(10, {"loss": 0.5})
    >>> writer.write(20, {"loss": 0.25, "accuracy": 0.9})
    >>> writer.close()
    >>> for line in (directory / "metrics.csv").read_text().splitlines():
    ...     print(",".join(cell for n, cell in enumerate(line.split(",")) if n != 1))
    step,loss,accuracy
    10,0.5,
    20,0.25,0.9

    (The second column, left out here, is ``wall_time``.)
    """

    def __init__(self, directory: str | os.PathLike[str], filename: str = CSV_NAME,
                 step_key: str = "step") -> None:
        self.directory = Path(directory)
        self.filename = filename
        self.step_key = step_key
        self._tables: dict[tuple[str, ...], _Table] = {}

    def write(self, step: int, values: Mapping[str, Any], group: tuple[str, ...] = (),
              extra: Mapping[str, Any] | None = None) -> None:
        """Appends one row: the step, `extra`'s plain fields and the scalar `values`."""
        row: dict[str, Any] = {self.step_key: int(step), WALL_TIME_KEY: round(time.time(), 3)}
        row.update((k, v) for k, v in (extra or {}).items() if _is_cell(v))
        row.update((k, v) for k, v in values.items() if is_scalar(v))
        table = self._tables.get(group)
        if table is None:
            table = self._tables[group] = _Table(self.directory.joinpath(*group, self.filename))
        table.append(row)

    def forget_step(self, step: int, group: tuple[str, ...] = ()) -> None:
        """Drops the rows of `step` that the table of `group` held before this writer wrote to
        it, rewriting it atomically; the rows this writer wrote stay
        (`cadence.core.protocols.StepReplacingWriter`)."""
        table = self._tables.get(group)
        if table is None:
            table = self._tables[group] = _Table(self.directory.joinpath(*group, self.filename))
        table.drop_earlier_rows(self.step_key, step)

    def flush(self) -> None:
        for table in self._tables.values():
            table.flush()

    def close(self) -> None:
        tables, self._tables = list(self._tables.values()), {}
        close_all(tables)
