"""What the writers of a whole run (MLflow, W&B) share: one tracking run per run directory.

A run's train and eval summaries go to two directories (``<run>/train``, ``<run>/eval``) and so
to two writers; MLflow and W&B show one run with ``train/...`` and ``eval/...`` values. The
writers therefore share the tracking run of their run directory (`SharedRuns`): the first to
write starts or resumes it, the last to close ends it. Its id is kept in a small JSON file in
the run directory (`read_run_file`, `write_run_file`), so that a resumed cadence run logs to the
same tracking run.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def key_prefix(directory: Path, run_dir: Path) -> tuple[str, ...]:
    """The path of `directory` below `run_dir`, as name parts (``("train",)``; ``()`` for the
    run directory itself).

    Raises:
        ValueError: if `directory` is not `run_dir` or inside it.
    """
    try:
        relative = Path(os.path.abspath(directory)).relative_to(os.path.abspath(run_dir))
    except ValueError:
        raise ValueError(f"The summary directory {str(directory)!r} is not inside `run_dir` "
                         f"{str(run_dir)!r}: pass the run's root as run_dir (or none, for a "
                         "run of this directory alone).") from None
    return relative.parts


def metric_name(parts: tuple[str, ...], name: str) -> str:
    """``"/".join(parts + (name,))``, with characters that tracking servers refuse (anything
    but letters, digits, ``_ - . /`` and spaces) replaced by ``_``.

    >>> metric_name(("train",), "loss"), metric_name(("eval", "top@5"), "acc[0]")
    ('train/loss', 'eval/top_5/acc_0_')
    """
    joined = "/".join((*parts, name))
    cleaned = re.sub(r"[^\w\-. /]", "_", joined)
    return posixpath.normpath(cleaned).lstrip("/") if cleaned else "_"


def read_run_file(path: Path) -> dict[str, Any] | None:
    """The record of a tracking run kept at `path`, or None when there is none (or it is
    unreadable: a new run is then started and the file replaced)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_run_file(path: Path, record: dict[str, Any]) -> None:
    """Writes `record` to `path` atomically (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)


class SharedRuns(Generic[T]):
    """The tracking runs open in this process, one per key, shared by the writers that ask for
    the same key (the writers of one run directory): the first `acquire` starts it, the last
    `release` ends it."""

    def __init__(self) -> None:
        self._runs: dict[str, tuple[T, int]] = {}
        self._lock = threading.Lock()

    def acquire(self, key: str, start: Callable[[], T]) -> T:
        """The run of `key`, started by `start` if it is not open."""
        with self._lock:
            if key in self._runs:
                run, users = self._runs[key]
            else:
                run, users = start(), 0
            self._runs[key] = (run, users + 1)
            return run

    def release(self, key: str, end: Callable[[T], None]) -> None:
        """One user fewer; the last one ends the run with `end`."""
        with self._lock:
            run, users = self._runs.pop(key)
            if users > 1:
                self._runs[key] = (run, users - 1)
                return
        end(run)
