"""What the writers of a whole run (MLflow, W&B) share: one tracking run per run directory.

A run's train and eval summaries go to two directories (``<run>/train``, ``<run>/eval``) and so
to two writers; MLflow and W&B show one run with ``train/...`` and ``eval/...`` values. The
writers therefore share the tracking run of their run directory (`SharedRuns`): the first to
write starts or resumes it, the last to close ends it. Its id is kept in a small JSON file in
the run directory (`read_run_file`, `write_run_file`), so that a resumed cadence run logs to the
same tracking run.

A run ends with its `Outcome`, from the exception it ends with (`Outcome.of`): the status of an
MLflow run, the exit code of a W&B run. Writers record it before they close
(`SharedRuns.record_outcome`); the last to close ends the run with the first failure or stop
recorded, so the order in which a run's train and eval writers close does not matter.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from cadence.core.checkpoint_dir import write_atomically
from cadence.core.errors import Preempted

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


@dataclass(frozen=True)
class Outcome:
    """How a run ended, as tracking services record it.

    Attributes:
        exit_code: the program's exit status (`exit_code`): 0 for a run that completed.
        stopped: whether it was stopped from outside (`was_stopped`) rather than failed.
    """

    exit_code: int = 0
    stopped: bool = False

    @classmethod
    def of(cls, error: BaseException | None) -> Outcome:
        """The outcome of a run that ends with `error` (None: it completed)."""
        return cls(exit_code(error), was_stopped(error))

    @property
    def status(self) -> str:
        """``"FINISHED"``, ``"KILLED"`` (stopped) or ``"FAILED"``: MLflow's names."""
        if self.stopped:
            return "KILLED"
        return "FINISHED" if self.exit_code == 0 else "FAILED"


def exit_code(error: BaseException | None) -> int:
    """The exit status of a program that ends with `error`: 0 without one, a `SystemExit`'s
    code (`cadence.Preempted`: 128 + the signal's number), 130 for Ctrl-C
    (`KeyboardInterrupt`), 1 for any other exception.

    >>> exit_code(None), exit_code(KeyboardInterrupt()), exit_code(SystemExit(143))
    (0, 130, 143)
    >>> exit_code(FloatingPointError("the loss diverged"))
    1
    """
    if error is None:
        return 0
    if isinstance(error, SystemExit):
        code = error.code
        return code if isinstance(code, int) else 0 if code is None else 1
    return 130 if isinstance(error, KeyboardInterrupt) else 1


def was_stopped(error: BaseException | None) -> bool:
    """Whether `error` says that the run was stopped from outside (`cadence.Preempted`, after
    SIGTERM or Ctrl-C; a notebook's `KeyboardInterrupt`) rather than that it failed."""
    return isinstance(error, (Preempted, KeyboardInterrupt))


def read_run_file(path: Path) -> dict[str, Any] | None:
    """The record of a tracking run kept at `path`, or None when there is none (or it is
    unreadable: a new run is then started and the file replaced)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_run_file(path: Path, record: dict[str, Any]) -> None:
    """Writes `record` to `path` atomically (`write_atomically`)."""
    write_atomically(path, json.dumps(record, indent=1) + "\n")


class SharedRuns(Generic[T]):
    """The tracking runs open in this process, one per key, shared by the writers that ask for
    the same key (the writers of one run directory): the first `acquire` starts it, the last
    `release` ends it, with the first outcome other than success that a writer recorded
    (`record_outcome`)."""

    def __init__(self) -> None:
        self._runs: dict[str, tuple[T, int]] = {}
        self._outcomes: dict[str, Outcome] = {}
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

    def record_outcome(self, key: str, outcome: Outcome) -> None:
        """Records how the open run of `key` ends; a failure or a stop, once recorded, stays
        (the train and eval writers of a crashed run may close in either order)."""
        with self._lock:
            if key in self._runs and outcome != Outcome():
                self._outcomes.setdefault(key, outcome)

    def release(self, key: str, end: Callable[[T, Outcome], None]) -> None:
        """One user fewer; the last one ends the run with `end` and its outcome."""
        with self._lock:
            run, users = self._runs.pop(key)
            if users > 1:
                self._runs[key] = (run, users - 1)
                return
            outcome = self._outcomes.pop(key, Outcome())
        end(run, outcome)
