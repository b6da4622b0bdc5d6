"""`read_run`: the scalars a run directory holds, read back from what the writers wrote.

A run's summaries are in the ``metrics.jsonl`` of each summary directory (``train/``,
``eval/``, and one sub-directory per nesting group of the logs, as TensorBoard shows them:
``train/task_a/`` is the run "train/task_a" on shared axes); a run that has no JSON lines is
read from its ``metrics.csv`` tables (a run that wrote only CSV: ``runtime.writers=[csv]``),
and a run that has neither (one written by another tool, or before cadence wrote them) from its
TensorBoard event files, with TensorBoard's own ``EventAccumulator``. The step and the wall time
of each record are not scalars. Besides the curves, `read_run` finds:

* **where the run resumed**: the run directory's ``resumes.jsonl``, one line each time training
  continued from a checkpoint (`cadence.core.run_dir.RunDirectory.record_resume`). A run without
  that record (older runs, a plain Controller with only a summary directory) shows its rewinds
  instead: the training summaries going back in step, as after a crash between a summary and
  the next checkpoint.
* **the best export**: the exporter's ledger (``best/info.json``), best first.

A rewind keeps what TensorBoard keeps: the points summarised before it at the steps that were
trained again are dropped (the weights they described were thrown away). An evaluation repeated
at a step (``cadence eval`` on the newest checkpoint) replaces the earlier value.

Nothing here imports torch or matplotlib.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cadence.core.intervals import is_int
from cadence.core.logs import is_finite_scalar
from cadence.core.run_dir import RunDirectory
from cadence.writers.csv import CSV_NAME
from cadence.writers.jsonl import JSONL_NAME, WALL_TIME_KEY

logger = logging.getLogger("cadence")

EVENT_FILE_PREFIX = "events.out.tfevents."
LEDGER_FILE = "info.json"  # the exporter's ledger (`cadence.engine.exporter.LEDGER_FILE`)
_SKIPPED_DIRS = frozenset({"checkpoints", "plots"})
_NOT_SCALARS = frozenset({"step", WALL_TIME_KEY})  # what every record has, besides its values


@dataclass(frozen=True)
class Series:
    """One scalar's values in one summary directory, by increasing step.

    Attributes:
        split: the summary directory relative to the run (``"train"``, ``"eval"``,
            ``"train/task_a"`` for nested logs), or the directory's own name when the run
            directory given is itself a summary directory.
        metric: the scalar's name (``"accuracy"``).
        steps: the global steps (completed steps when the value was written).
        values: the values, one per step.
    """

    split: str
    metric: str
    steps: tuple[int, ...]
    values: tuple[float, ...]

    @property
    def is_train(self) -> bool:
        """Whether these are training summaries (the ``train`` directory or below it)."""
        return self.split.split("/")[0] == "train"


@dataclass(frozen=True)
class Resume:
    """A step where training continued from a checkpoint.

    Attributes:
        step: the restored step (training went on with the next one). For an inferred rewind
            (`reason` ``"rewind"``): the first step summarised again; the restored checkpoint
            is at or before it.
        reason: ``"resume"`` (a new process), ``"recovery"`` (the loss guard restored a
            checkpoint after a blow-up) or ``"rewind"`` (inferred from the summaries).
        checkpoint: the restored checkpoint, when recorded.
    """

    step: int
    reason: str
    checkpoint: str | None = None


@dataclass(frozen=True)
class BestExport:
    """The best export of the exporter's ledger.

    Attributes:
        step: the step of the evaluation that was exported.
        metric: the metric the ledger ranks by (nested names joined by ``/``).
        value: its value.
        path: the export's directory.
    """

    step: int
    metric: str
    value: float
    path: Path


@dataclass(frozen=True)
class RunScalars:
    """What `read_run` found in one run directory.

    Attributes:
        root: the run directory.
        series: every scalar of every summary directory.
        resumes: where training continued from a checkpoint, by step.
        best: the best export, if the run has a ledger.
        source: ``"jsonl"``, ``"csv"`` or ``"tensorboard"``: what the series were read from.
    """

    root: Path
    series: tuple[Series, ...]
    resumes: tuple[Resume, ...] = ()
    best: BestExport | None = None
    source: str = "jsonl"

    @property
    def name(self) -> str:
        """The run directory's name."""
        return self.root.name

    @property
    def metrics(self) -> list[str]:
        """The scalar names, sorted, each once."""
        return sorted({s.metric for s in self.series})

    def get(self, metric: str) -> list[Series]:
        """The series of `metric`, one per summary directory."""
        return [s for s in self.series if s.metric == metric]


def read_run(run_dir: str | os.PathLike[str]) -> RunScalars:
    """Reads the scalars, resumes and best export of `run_dir` (see the module docstring).

    Args:
        run_dir: a run directory (``train/``, ``eval/`` ... below it), or a summary directory.

    Returns:
        What was found; ``series`` is empty when the directory holds no scalars.

    Raises:
        ValueError: if `run_dir` is not a directory.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ValueError(f"`run_dir` (got {str(root)!r}) must be a directory: a run's "
                         "(runs/<experiment>-<time>) or a summary directory.")
    run = RunDirectory(root)
    series, source = _read_jsonl_series(root), "jsonl"
    if not series:
        series, source = _read_csv_series(root), "csv"
    if not series:
        series, source = _read_event_series(root), "tensorboard"
    recorded = _read_resumes(run)
    rewinds: list[Resume] = []
    series = [_drop_rewound(s, rewinds) if s.is_train else s for s in series]
    # The record, where there is one, says where and why; the rewinds of a run without it
    # are the best that can be told (a clean resume leaves no trace in the summaries).
    resumes = recorded if recorded is not None else rewinds
    unique = sorted({(r.step, r.reason, r.checkpoint) for r in resumes},
                    key=lambda r: (r[0], r[1]))
    return RunScalars(
        root=root,
        series=tuple(sorted(series, key=lambda s: (s.metric, s.split))),
        resumes=tuple(Resume(step, reason, checkpoint) for step, reason, checkpoint in unique),
        best=_read_best(root),
        source=source,
    )


# ---------------------------------------------------------------------------- series


def _split_of(root: Path, directory: Path) -> str:
    relative = directory.relative_to(root).as_posix()
    return root.name if relative == "." else relative


def is_run_directory(path: str | os.PathLike[str]) -> bool:
    """Whether `path` looks like a run's directory: it holds a config, checkpoints or a record
    of resumes."""
    run = RunDirectory(path)
    return run.params.is_file() or run.checkpoints.is_dir() or run.resumes.is_file()


def _summary_dirs(root: Path, holds: Any) -> Iterator[Path]:
    """The directories under `root` (itself included) for which `holds(directory)` is true,
    outside checkpoints, earlier plots and other runs' directories (`root` may hold runs)."""
    for directory, subdirs, _ in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_DIRS
                            and not is_run_directory(Path(directory, d)))
        if holds(Path(directory)):
            yield Path(directory)


def _records(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a ``metrics.jsonl`` (or ``resumes.jsonl``); a line that does not
    parse (the last one of a process that died mid-write) is skipped with a warning, and the
    lines after it are read. A record that an older cadence appended right after such a
    fragment, on the same line, is read too (see `_glued_record`)."""
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                bad += 1
                record = _glued_record(line)
            if isinstance(record, dict):
                yield record
    if bad:
        logger.warning("Skipped %d unreadable line(s) of %s.", bad, path)


def _glued_record(line: str) -> dict[str, Any] | None:
    """The whole JSON object that ends `line` after a fragment, or None.

    A writer that appended to a file whose last line a crash had cut short (cadence before it
    dropped such lines, or another tool) glued its record to the fragment:
    ``{"step": 3, "loss": 0.{"step": 4, "loss": 0.25}``. The record is the longest end of the
    line that is one JSON object.

    >>> _glued_record('{"step": 3, "loss": 0.{"step": 4, "loss": 0.25}\\n')
    {'step': 4, 'loss': 0.25}
    """
    text = line.rstrip()
    decoder = json.JSONDecoder()
    start = text.find("{", 1)
    while start > 0:
        try:
            record, end = decoder.raw_decode(text, start)
        except ValueError:
            record, end = None, -1
        if end == len(text) and isinstance(record, dict):
            return record
        start = text.find("{", start + 1)
    return None


def _read_jsonl_series(root: Path) -> list[Series]:
    found: list[Series] = []
    for directory in _summary_dirs(root, lambda d: (d / JSONL_NAME).is_file()):
        points: dict[str, list[tuple[int, float]]] = {}
        for record in _records(directory / JSONL_NAME):
            step = record.get("step")
            if not is_int(step):
                continue
            for key, value in record.items():
                if key not in _NOT_SCALARS and is_finite_scalar(value):
                    points.setdefault(key, []).append((step, float(value)))
        split = _split_of(root, directory)
        found.extend(_series(split, metric, pts) for metric, pts in points.items())
    return found


def _number(cell: str | None) -> float | None:
    """A CSV cell as a finite number, or None (empty, text such as a checkpoint's name)."""
    try:
        value = float(cell) if cell else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _read_csv_series(root: Path) -> list[Series]:
    found: list[Series] = []
    for directory in _summary_dirs(root, lambda d: (d / CSV_NAME).is_file()):
        points: dict[str, list[tuple[int, float]]] = {}
        with open(directory / CSV_NAME, newline="", encoding="utf-8",
                  errors="replace") as handle:
            for row in csv.DictReader(handle):
                step = _number(row.get("step"))
                if step is None or step != int(step):
                    continue  # a row a crash cut short
                for key, cell in row.items():
                    value = _number(cell) if isinstance(cell, str) else None
                    if key is not None and key not in _NOT_SCALARS and value is not None:
                        points.setdefault(key, []).append((int(step), value))
        split = _split_of(root, directory)
        found.extend(_series(split, metric, pts) for metric, pts in points.items())
    return found


def _read_event_series(root: Path) -> list[Series]:
    def holds_events(directory: Path) -> bool:
        return any(p.name.startswith(EVENT_FILE_PREFIX) and p.is_file()
                   for p in directory.iterdir())

    directories = list(_summary_dirs(root, holds_events))
    if not directories:
        return []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: list[Series] = []
    for directory in directories:
        # Everything kept (no sampling), and nothing purged: rewinds are handled here, the same
        # way for both sources.
        accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0},
                                       purge_orphaned_data=False)
        accumulator.Reload()
        split = _split_of(root, directory)
        for tag in accumulator.Tags().get("scalars", []):
            points = [(int(e.step), float(e.value)) for e in accumulator.Scalars(tag)
                      if math.isfinite(e.value)]
            found.append(_series(split, tag, points))
    return found


def _series(split: str, metric: str, points: Iterable[tuple[int, float]]) -> Series:
    """Points in the order they were written, as a `Series`. The order is kept here (a
    training series may go back in step; see `_drop_rewound`); for evaluations, a step written
    again replaces its earlier value."""
    points = list(points)
    if split.split("/")[0] != "train":
        latest = dict(points)  # the last value written at each step wins
        points = sorted(latest.items())
    return Series(split, metric, tuple(s for s, _ in points), tuple(v for _, v in points))


def _drop_rewound(series: Series, rewinds: list[Resume]) -> Series:
    """`series` by increasing step, without the points that a rewind trained again; each rewind
    found is appended to `rewinds` (as TensorBoard purges "orphaned" points)."""
    kept: list[tuple[int, float]] = []
    for step, value in zip(series.steps, series.values):
        if kept and step < kept[-1][0]:
            rewinds.append(Resume(step, "rewind"))
        while kept and kept[-1][0] >= step:  # trained again (or written twice): the last wins
            kept.pop()
        kept.append((step, value))
    return Series(series.split, series.metric, tuple(s for s, _ in kept),
                  tuple(v for _, v in kept))


# ---------------------------------------------------------------------------- resumes, best


def _read_resumes(run: RunDirectory) -> list[Resume] | None:
    """The recorded resumes, or None when the run has no record."""
    if not run.resumes.is_file():
        return None
    resumes = []
    for record in _records(run.resumes):
        step = record.get("step")
        if is_int(step):
            checkpoint = record.get("checkpoint")
            resumes.append(Resume(step, str(record.get("reason", "resume")),
                                  checkpoint if isinstance(checkpoint, str) else None))
    return resumes


def _read_best(root: Path) -> BestExport | None:
    """The best entry of the exporter's ledger: ``best/info.json``, else a ledger in another
    direct sub-directory (``trainer.best_checkpoint_export_subdir`` may rename it)."""
    candidates = [root / "best" / LEDGER_FILE,
                  *sorted(p for p in root.glob(f"*/{LEDGER_FILE}") if p.parent.name != "best")]
    for path in candidates:
        try:
            ledger = json.loads(path.read_text(encoding="utf-8"))
            top = ledger["exports"][0]
            return BestExport(int(top["step"]), str(ledger["metric"]), float(top["value"]),
                              path.parent / str(top["path"]))
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue  # none there, not a ledger, or a ledger with nothing kept
    return None

