"""The run timeline: what happened in a run and when, one JSON line per event (a file format).

Every training process appends to its run directory what it lived through -- it began, built its
model, restored a checkpoint, ended a loop (and how long it waited in it), evaluated, saved,
received a signal, ended -- so that ``cadence goodput`` can say afterwards where every second of
the run went, across crashes, restarts and resizes (`cadence.records.goodput`). The `Timeline`
writes it; `read_timeline` reads it back as untrusted input. Nothing here imports torch.

**Files**, in ``<run>/timeline/``:

- ``run.jsonl``: the run's record, written by rank 0 of each attempt. In the fault-tolerant
  mode (`cadence.engine.fault_tolerance`), rank 0 of replica group ``g`` writes
  ``run-replica-<g>.jsonl`` instead: each group's attempts are its own.
- ``rank-<r>.jsonl`` (r >= 1): what only rank r knows: its own waits, one ``loop_end`` per
  loop. Rank 0's waits are in the run's record. In the fault-tolerant mode, rank r of group
  ``g`` writes ``replica-<g>-rank-<r>.jsonl``.

**Lines.** Each line is one JSON object: ``{"t": <unix seconds>, "event": <name>, "attempt":
<id>, ...fields}``. ``t`` is the wall clock (``time.time()``) when the event was recorded;
``attempt`` names the process that wrote it, unique per process lifetime (the pid and a random
tag). The events of the run's record, and their fields (``int`` counts are >= 0 unless said,
durations are finite seconds >= 0):

==================  ===========================================================================
event               fields; when it is recorded
==================  ===========================================================================
``start``           ``world_size`` (>= 1), ``restart`` (``TORCHELASTIC_RESTART_COUNT``, 0
                    without torchrun), ``host``, ``pid``, ``process_start_t`` (when the process
                    was created, from ``/proc/self/stat``; null where unknown, and in a
                    notebook, whose kernel may be hours old), ``replica`` and ``replicas``
                    (null outside the fault-tolerant mode), ``slurm_job``, ``slurm_step``
                    and ``slurm_restart`` (the Slurm job id, its step -- ``"batch"`` for the
                    batch script -- and ``SLURM_RESTART_COUNT``; null outside Slurm:
                    `cadence.core.slurm.SlurmJob`), ``version`` (of this format: 1):
                    an attempt begins -- the first thing a training process records.
``setup_end``       none: the model, the data and the trainer are built.
``restore_begin``   none: restoring a checkpoint begins (at the start of an attempt, or a loss
                    guard's recovery within one).
``restore_end``     ``step`` (the global step restored, 0 if nothing was), ``checkpoint`` (its
                    directory name, ``"ckpt-20"``, or null): the restore ended.
``loop_end``        ``step`` (the global step after the loop), ``steps`` (steps in the loop,
                    <= ``step``), ``seconds`` (the loop's wall time), ``data_wait_s`` (time the
                    training thread waited for input in it), ``checkpoint_wait_s`` (time it was
                    blocked by checkpoint work inside it), ``stall_s`` and ``discarded_s``
                    (replica groups: the time it waited for the groups to agree after a group
                    failed -- the detection -- and the compute of the steps no group committed;
                    0 otherwise): a loop of steps ended; ``t`` is its end, ``t - seconds`` its
                    beginning.
``eval_begin``      ``step``: an evaluation begins.
``eval_end``        ``step``: it ended.
``save``            ``step``, ``stall_s`` (how long the training thread was blocked by
                    checkpoint work of that step outside a loop: a save -- the whole write when
                    synchronous, the snapshot when in the background -- or a wait for a
                    background write to finish): recorded when the training thread goes on,
                    so the stall is ``[t - stall_s, t]``. Such a block inside a loop is the
                    loop's ``checkpoint_wait_s`` instead, never both.
``commit``          ``step``, ``checkpoint``: the checkpoint became durable (from the thread that
                    committed it: it may be a background thread).
``signal``          ``signal`` (its name, ``"SIGTERM"``): a stop signal was received.
``end``             ``outcome`` (``"finished"``, ``"preempted"`` or ``"error"``), ``step`` (or
                    null), ``error`` (a short text, or null): the process is leaving on a
                    known exit. An attempt without an ``end`` crashed (or is still running).
==================  ===========================================================================

A rank's file holds ``loop_end`` records only, with that rank's own waits.

**Reading** (`read_timeline`) treats the directory as untrusted input, as the rest of a run:
only the file names above are read, each a regular file inside ``timeline/`` (never through a
symbolic link, the directory included), at most `MAX_FILE_BYTES` each; a line longer than
`MAX_LINE_BYTES`, or that is not a JSON object of the schema (a torn last line, a wrong type, a
number that is NaN, infinite, negative or absurdly large, an unknown event, a missing field) is
skipped and counted, never raised. Extra fields are ignored, so a newer cadence may add some.

**Writing** (`Timeline`) appends one line per event and flushes it; ``start`` and ``end`` are
also fsync'd, so that the boundaries of attempts survive a power loss. A last line that a crash
cut short is dropped when the file is opened again (`cadence.core.files.open_append`). Appends
are serialized by a lock (commits come from a background thread) and written whole; recording is
cheap and meant for once per loop, never per step. A failed write (a full disk) is logged once
and silences the timeline: it never stops a run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any

from cadence.core.checkpoint_dir import fsync_path
from cadence.core.errors import ConfigError
from cadence.core.files import open_append, open_regular, plain_name
from cadence.core.intervals import is_int
from cadence.core.logs import is_scalar
from cadence.core.notebook import in_notebook
from cadence.core.run_dir import TIMELINE_DIR
from cadence.core.slurm import SLURM_ID, SlurmJob

logger = logging.getLogger("cadence")

RUN_FILE = "run.jsonl"
VERSION = 1
"""The version of the format, in each ``start`` record."""
OUTCOMES = ("finished", "preempted", "error")
"""How an ``end`` record says a process left."""
MAX_FILE_BYTES = 512 * 2**20
"""The largest timeline file read (a loop's line is ~200 bytes: millions of loops)."""
MAX_LINE_BYTES = 64 * 2**10
"""The longest line read; a longer one is skipped unparsed."""
MAX_RANK_FILES = 65536
"""The most rank files read."""

_REPLICA_FILE = re.compile(r"^run-replica-(0|[1-9][0-9]{0,8})\.jsonl$")
_RANK_FILE = re.compile(r"^rank-([1-9][0-9]{0,8})\.jsonl$")
_REPLICA_RANK_FILE = re.compile(r"^replica-(0|[1-9][0-9]{0,8})-rank-([1-9][0-9]{0,8})\.jsonl$")
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_MAX_T = 1e11  # about the year 5000: a larger time is not a wall-clock time
_MAX_SECONDS = 1e9  # about 30 years
_MAX_STEP = 2**62
_MAX_COUNT = 2**31


# ---------------------------------------------------------------------------- the schema


class _Bad(Exception):
    """A value that does not fit its field (never leaves this module)."""


def _number(value: Any, top: float) -> float:
    if not is_scalar(value):
        raise _Bad
    if isinstance(value, int) and not -2**1023 < value < 2**1023:
        raise _Bad  # float() of it would overflow
    value = float(value)
    if not (math.isfinite(value) and 0.0 <= value <= top):
        raise _Bad
    return value


def _seconds(value: Any) -> float:
    return _number(value, _MAX_SECONDS)


def _time(value: Any) -> float:
    return _number(value, _MAX_T)


def _step(value: Any) -> int:
    if not is_int(value) or not 0 <= value <= _MAX_STEP:
        raise _Bad
    return int(value)


def _count(value: Any) -> int:
    if not is_int(value) or not 1 <= value <= _MAX_COUNT:
        raise _Bad
    return int(value)


def _small(value: Any) -> int:
    if not is_int(value) or not 0 <= value <= _MAX_COUNT:
        raise _Bad
    return int(value)


def _text(limit: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or len(value) > limit:
            raise _Bad
        return value
    return check


def _checkpoint(value: Any) -> str:
    if not plain_name(value) or len(value) > 255:
        raise _Bad
    return str(value)


def _outcome(value: Any) -> str:
    if value not in OUTCOMES:
        raise _Bad
    return str(value)


_SIGNAL = re.compile(r"^[A-Z][A-Z0-9+_]{0,31}$")


def _signal(value: Any) -> str:
    if not isinstance(value, str) or not _SIGNAL.match(value):
        raise _Bad
    return value


def _slurm_id(value: Any) -> str:
    if not isinstance(value, str) or not SLURM_ID.match(value):
        raise _Bad
    return value


def _or_null(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def nullable(value: Any) -> Any:
        return None if value is None else check(value)
    return nullable


_REQUIRED = object()
_Spec = Mapping[str, tuple[Callable[[Any], Any], Any]]
"""Each field: (its check, its default when absent; `_REQUIRED` when it must be there)."""

SCHEMA: Mapping[str, _Spec] = MappingProxyType({
    "start": {"world_size": (_count, _REQUIRED), "restart": (_small, 0),
              "host": (_or_null(_text(255)), None), "pid": (_or_null(_small), None),
              "process_start_t": (_or_null(_time), None),
              "replica": (_or_null(_small), None), "replicas": (_or_null(_count), None),
              "slurm_job": (_or_null(_slurm_id), None), "slurm_step": (_or_null(_slurm_id), None),
              "slurm_restart": (_or_null(_small), None), "version": (_count, VERSION)},
    "setup_end": {},
    "restore_begin": {},
    "restore_end": {"step": (_step, _REQUIRED), "checkpoint": (_or_null(_checkpoint), None)},
    "loop_end": {"step": (_step, _REQUIRED), "steps": (_step, _REQUIRED),
                 "seconds": (_seconds, _REQUIRED), "data_wait_s": (_seconds, 0.0),
                 "checkpoint_wait_s": (_seconds, 0.0), "stall_s": (_seconds, 0.0),
                 "discarded_s": (_seconds, 0.0)},
    "eval_begin": {"step": (_step, _REQUIRED)},
    "eval_end": {"step": (_step, _REQUIRED)},
    "save": {"step": (_step, _REQUIRED), "stall_s": (_seconds, _REQUIRED)},
    "commit": {"step": (_step, _REQUIRED), "checkpoint": (_or_null(_checkpoint), None)},
    "signal": {"signal": (_signal, _REQUIRED)},
    "end": {"outcome": (_outcome, _REQUIRED), "step": (_or_null(_step), None),
            "error": (_or_null(_text(1000)), None)},
})
"""The events of the format and the checks of their fields (see the module docstring)."""
EVENTS = tuple(SCHEMA)


@dataclass(frozen=True)
class Event:
    """One line of a timeline, checked against the schema.

    Attributes:
        t: when it was recorded (unix seconds).
        event: its name, one of `EVENTS`.
        attempt: the id of the process that recorded it.
        fields: its fields, each checked, defaults filled in (see the module docstring).
    """

    t: float
    event: str
    attempt: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]


def parse_event(record: Any) -> Event | None:
    """`record` (a decoded JSON line) as an `Event`, or None when it is not one of the schema.

    >>> parse_event({"t": 5.0, "event": "save", "attempt": "7-ab", "step": 20, "stall_s": 0.5})
    Event(t=5.0, event='save', attempt='7-ab', fields={'step': 20, 'stall_s': 0.5})
    >>> parse_event({"t": 5.0, "event": "save", "attempt": "7-ab", "step": 20,
    ...              "stall_s": float("nan")}) is None
    True
    """
    if not isinstance(record, dict):
        return None
    name, attempt = record.get("event"), record.get("attempt")
    spec = SCHEMA.get(name) if isinstance(name, str) else None
    if spec is None or not isinstance(attempt, str) or not 0 < len(attempt) <= 200:
        return None
    try:
        t = _time(record.get("t"))
        fields = {}
        for name, (check, default) in spec.items():
            if name in record:
                fields[name] = check(record[name])
            elif default is _REQUIRED:
                return None
            else:
                fields[name] = default
    except _Bad:
        return None
    if record["event"] == "loop_end" and fields["steps"] > fields["step"]:
        return None  # more steps in the loop than the run has made
    return Event(t, record["event"], attempt, fields)


# ---------------------------------------------------------------------------- the writer


def timeline_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Where a run's timeline files are (``<run>/timeline``)."""
    return Path(run_dir) / TIMELINE_DIR


def timeline_file(run_dir: str | os.PathLike[str], rank: int = 0,
                  replica: int | None = None) -> Path:
    """The file a process of rank `rank` (of replica group `replica`, in the fault-tolerant
    mode) writes: ``run.jsonl``, ``run-replica-<g>.jsonl``, ``rank-<r>.jsonl`` or
    ``replica-<g>-rank-<r>.jsonl``.

    >>> timeline_file("runs/a").as_posix(), timeline_file("runs/a", 3).as_posix()
    ('runs/a/timeline/run.jsonl', 'runs/a/timeline/rank-3.jsonl')
    """
    if rank != 0:  # in the fault-tolerant mode every group has its own ranks
        name = (f"rank-{rank}.jsonl" if replica is None
                else f"replica-{replica}-rank-{rank}.jsonl")
    elif replica is not None:
        name = f"run-replica-{replica}.jsonl"
    else:
        name = RUN_FILE
    return timeline_dir(run_dir) / name


_attempt: tuple[int, str] | None = None


def attempt_id() -> str:
    """This process's attempt id: its pid and a random tag, the same for the life of the
    process (a forked child gets its own)."""
    global _attempt
    pid = os.getpid()
    if _attempt is None or _attempt[0] != pid:
        _attempt = (pid, f"{pid}-{secrets.token_hex(4)}")
    return _attempt[1]


def process_start_time() -> float | None:
    """When this process was created (unix seconds, to the kernel's 10 ms tick), from
    ``/proc``; None where unknown.

    ``/proc/self/stat`` counts the start in ticks since boot. The boot's unix time is taken
    from the clocks themselves (now minus ``CLOCK_BOOTTIME``), not from ``/proc/stat``'s
    ``btime``: that one is whole seconds, cut down, and put every start up to a second early --
    the time between two attempts read short by as much.
    """
    try:
        with open("/proc/self/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
        # The command name (field 2) may hold spaces and parentheses: count after its end.
        ticks = float(stat[stat.rindex(")") + 2:].split()[19])  # field 22, starttime
        started = _boot_time() + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return started if math.isfinite(started) and 0 < started < _MAX_T else None


def _boot_time() -> float:
    """The unix time at which the machine booted: from the clocks where Linux has
    ``CLOCK_BOOTTIME`` (the clock ``/proc`` counts process starts on), else ``btime``."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        return time.time() - time.clock_gettime(boottime)
    with open("/proc/stat", encoding="ascii", errors="replace") as handle:
        return next(float(line.split()[1]) for line in handle if line.startswith("btime "))


def _restart_count() -> int:
    text = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(text) if text.isdigit() and len(text) < 10 else 0


class Timeline:
    """Appends a process's events to its run's timeline (see the module docstring).

    Rank 0 writes the run's record (``run.jsonl``); another rank writes ``rank-<r>.jsonl``,
    which holds only `loop_end`: on such a rank every other method does nothing, so that every
    rank can make the same calls. The file is opened at the first record.

    Args:
        run_dir: the run's directory.
        rank: this process's rank.
        replica: its replica group in the fault-tolerant mode, else None.
        listener: called with each `Event` recorded, in order (a live `GoodputCalculator`'s
            ``add``), under the writer's lock.
        clock: the wall clock (tests pass their own).
        waits: returns cumulative waits of the training thread by field of ``loop_end``
            (``stall_s``, ``discarded_s``); each ``loop_end`` records what they grew by since
            the previous one.

    Raises:
        ValueError: for a negative rank or replica.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, rank: int = 0,
                 replica: int | None = None, listener: Callable[[Event], None] | None = None,
                 clock: Callable[[], float] = time.time,
                 waits: Callable[[], Mapping[str, float]] | None = None) -> None:
        if not is_int(rank) or rank < 0:
            raise ValueError(f"`rank` (got {rank!r}) must be an integer >= 0.")
        if replica is not None and (not is_int(replica) or replica < 0):
            raise ValueError(f"`replica` (got {replica!r}) must be None or an integer >= 0.")
        self.path = timeline_file(run_dir, rank, replica)
        self.rank = rank
        self.replica = replica
        self.attempt = attempt_id()
        self.listener = listener
        self._clock = clock
        self._waits = waits
        self._waited = dict(waits()) if waits is not None else {}
        self._lock = threading.RLock()  # re-entrant: a signal handler may record mid-record
        self._handle: IO[Any] | None = None
        self._silent = False

    @property
    def writes_run_record(self) -> bool:
        """Whether this is the run's record (rank 0), rather than a rank's own file."""
        return self.rank == 0

    # ------------------------------------------------------------------ the events

    def start(self, world_size: int, *, restart: int | None = None,
              replicas: int | None = None, process_start_t: float | None = None,
              host: str | None = None, slurm: SlurmJob | None = None) -> None:
        """Records that an attempt begins: the first record of a training process.

        Args:
            world_size: the processes of the job (of the replica group, in the fault-tolerant
                mode).
            restart: torchrun's restart count; default ``TORCHELASTIC_RESTART_COUNT`` (0).
            replicas: the replica groups in the fault-tolerant mode, else None.
            process_start_t: when the process was created; default `process_start_time`
                (None in a notebook).
            host: default this machine's name.
            slurm: the Slurm job; default the one the environment names, if any.
        """
        if process_start_t is None and not in_notebook():
            process_start_t = process_start_time()
        job = slurm if slurm is not None else SlurmJob.from_environ()
        self.record("start", world_size=world_size,
                    restart=_restart_count() if restart is None else restart,
                    host=socket.gethostname()[:255] if host is None else host,
                    pid=os.getpid(), process_start_t=process_start_t,
                    replica=self.replica, replicas=replicas,
                    **(job.record() if job is not None else {}), version=VERSION)

    def setup_end(self) -> None:
        """Records that the model, data and trainer are built."""
        self.record("setup_end")

    def restore_begin(self) -> None:
        """Records that restoring a checkpoint begins."""
        self.record("restore_begin")

    def restore_end(self, step: int, checkpoint: str | os.PathLike[str] | None) -> None:
        """Records that a restore ended at global step `step` from `checkpoint` (a path or
        name: its last part is kept; None when there was nothing to restore)."""
        self.record("restore_end", step=step, checkpoint=_checkpoint_name(checkpoint))

    def loop_end(self, step: int, steps: int, seconds: float, data_wait_s: float = 0.0,
                 checkpoint_wait_s: float = 0.0) -> None:
        """Records a loop's end: `steps` steps up to global step `step` in `seconds`, of which
        the training thread waited `data_wait_s` for input and `checkpoint_wait_s` for
        checkpoint work (and, with `waits`, what they report). The one record of a rank's own
        file."""
        more: dict[str, float] = {}
        if self._waits is not None:  # what the waits grew by in this loop (host counters)
            now = dict(self._waits())
            more = {name: max(0.0, value - self._waited.get(name, 0.0))
                    for name, value in now.items()}
            self._waited = now
        self.record("loop_end", step=step, steps=steps, seconds=seconds,
                    data_wait_s=data_wait_s, checkpoint_wait_s=checkpoint_wait_s, **more)

    def eval_begin(self, step: int) -> None:
        """Records that an evaluation at global step `step` begins."""
        self.record("eval_begin", step=step)

    def eval_end(self, step: int) -> None:
        """Records that the evaluation at global step `step` ended."""
        self.record("eval_end", step=step)

    def save(self, step: int, stall_s: float) -> None:
        """Records that the training thread goes on after checkpoint work of step `step` outside
        a loop blocked it for `stall_s` seconds (a save, or a wait for a background write)."""
        self.record("save", step=step, stall_s=stall_s)

    def commit(self, step: int, checkpoint: str | os.PathLike[str] | None) -> None:
        """Records that the checkpoint of step `step` is durable (any thread may call it)."""
        self.record("commit", step=step, checkpoint=_checkpoint_name(checkpoint))

    def signal(self, name: str) -> None:
        """Records that stop signal `name` (``"SIGTERM"``) was received."""
        self.record("signal", signal=name)

    def end(self, outcome: str, step: int | None, error: str | None = None) -> None:
        """Records that the process leaves on a known exit (`outcome` one of `OUTCOMES`);
        `error`, when given, is cut to one line of at most 1000 characters."""
        if error is not None:
            error = " ".join(str(error).split())[:1000]
        self.record("end", outcome=outcome, step=step, error=error)

    # ------------------------------------------------------------------ writing

    def record(self, event: str, **fields: Any) -> None:
        """Appends one event (one of `EVENTS`, with its fields) and flushes it; ``start`` and
        ``end`` are also fsync'd. On a rank's own file, only ``loop_end`` is written.

        Raises:
            ValueError: if `event` is unknown or a field does not fit the schema.
            ConfigError: if ``timeline/`` or the file is a symbolic link, or not what it must
                be (at the first record).
        """
        spec = SCHEMA.get(event)
        if spec is None:
            raise ValueError(f"`event` (got {event!r}) must be one of {', '.join(EVENTS)}.")
        if not self.writes_run_record and event != "loop_end":
            return
        with self._lock:
            record = {"t": float(self._clock()), "event": event, "attempt": self.attempt,
                      **fields}
            parsed = parse_event(record)
            if parsed is None or set(fields) - set(spec):
                raise ValueError(
                    f"Timeline event {event!r} (got {fields!r}) must have the fields "
                    f"{', '.join(spec) or 'none'}, each of its kind (counts >= 0, finite "
                    "seconds >= 0): see cadence.records.timeline.")
            if self._silent:
                return
            handle = self._open()
            try:
                handle.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
                handle.flush()
                if event in ("start", "end"):
                    os.fsync(handle.fileno())
            except OSError as error:
                self._fall_silent(error)
                return
            if self.listener is not None:
                self.listener(parsed)

    def _open(self) -> IO[Any]:
        if self._handle is not None:
            return self._handle
        directory = self.path.parent
        if directory.is_symlink():
            raise ConfigError(
                f"{str(directory)!r} is a symbolic link: cadence does not write through links "
                "in a run directory (one could point anywhere). Remove the link, or use another "
                "run directory.")
        try:
            created = not directory.exists()
            directory.mkdir(parents=True, exist_ok=True)
            self._handle = open_append(self.path)
            if created:  # the new directory's entry survives a power loss too
                with contextlib.suppress(OSError):
                    fsync_path(directory.parent)
        except FileExistsError:
            raise ConfigError(f"{str(directory)!r} is a file where cadence keeps its timeline "
                              "directory: move it away, or use another run directory.") from None
        return self._handle

    def _fall_silent(self, error: OSError) -> None:
        self._silent = True
        logger.warning("Could not write the run's timeline %s (%s): it stops here; training "
                       "goes on, and `cadence goodput` will count from what was written.",
                       self.path, error)
        self.close()

    def close(self) -> None:
        """Closes the file (a later record opens it again)."""
        with self._lock:
            handle, self._handle = self._handle, None
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()

    def __enter__(self) -> Timeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _checkpoint_name(checkpoint: str | os.PathLike[str] | None) -> str | None:
    """The directory name of `checkpoint`, or None when it has none fit for the record (a
    name with spaces, of a checkpoint a user passed)."""
    name = None if checkpoint is None else Path(checkpoint).name
    return name if plain_name(name) and len(str(name)) <= 255 else None


# ---------------------------------------------------------------------------- the reader


@dataclass(frozen=True)
class RunTimeline:
    """What `read_timeline` found in a run directory.

    Attributes:
        root: the run directory.
        run: the events of the run's record (``run.jsonl``), in the order written.
        replicas: the records of the replica groups (``run-replica-<g>.jsonl``), by group.
        ranks: the ``loop_end`` events of each rank's own file (``rank-<r>.jsonl``), by rank.
        replica_ranks: the same of each replica group's ranks
            (``replica-<g>-rank-<r>.jsonl``), by group and rank.
        skipped_lines: lines dropped because they are not events of the schema.
        refused: the files not read, each with why (a link, too large).
    """

    root: Path
    run: tuple[Event, ...] = ()
    replicas: Mapping[int, tuple[Event, ...]] = field(default_factory=dict)
    ranks: Mapping[int, tuple[Event, ...]] = field(default_factory=dict)
    replica_ranks: Mapping[int, Mapping[int, tuple[Event, ...]]] = field(default_factory=dict)
    skipped_lines: int = 0
    refused: tuple[str, ...] = ()

    @property
    def found(self) -> bool:
        """Whether the run has a record to read (its own, or a replica group's)."""
        return bool(self.run or self.replicas)


def read_timeline(run_dir: str | os.PathLike[str]) -> RunTimeline:
    """Reads the timeline files of `run_dir` as untrusted input (see the module docstring).

    Never raises for what the files hold: a file that cannot be read safely is listed in
    ``refused``, a line that is not an event is counted in ``skipped_lines``.

    Args:
        run_dir: the run's directory.
    """
    root = Path(run_dir)
    directory = timeline_dir(root)
    if directory.is_symlink():
        return RunTimeline(root, refused=(
            f"{str(directory)!r} is a symbolic link: cadence does not read through links in "
            "a run directory (one could point anywhere).",))
    if not directory.is_dir():
        return RunTimeline(root)
    run: tuple[Event, ...] = ()
    replicas: dict[int, tuple[Event, ...]] = {}
    ranks: dict[int, tuple[Event, ...]] = {}
    replica_ranks: dict[int, dict[int, tuple[Event, ...]]] = {}
    skipped, refused = 0, []
    try:
        names = sorted(entry.name for entry in os.scandir(directory))
    except OSError as error:
        return RunTimeline(root, refused=(f"{str(directory)!r} cannot be listed ({error}).",))
    rank_files = 0
    for name in names:
        replica, rank = _REPLICA_FILE.match(name), _RANK_FILE.match(name)
        replica_rank = _REPLICA_RANK_FILE.match(name)
        if name != RUN_FILE and not replica and not rank and not replica_rank:
            continue  # not a timeline file: never opened
        if rank or replica_rank:
            rank_files += 1
            if rank_files > MAX_RANK_FILES:
                refused.append(f"{str(directory)!r} holds more than {MAX_RANK_FILES} rank "
                               "files: the rest were not read.")
                break
        try:
            events, bad = _read_events(directory / name)
        except _Refused as why:
            refused.append(str(why))
            continue
        skipped += bad
        if rank:
            ranks[int(rank.group(1))] = tuple(e for e in events if e.event == "loop_end")
        elif replica_rank:
            replica_ranks.setdefault(int(replica_rank.group(1)), {})[
                int(replica_rank.group(2))] = tuple(e for e in events if e.event == "loop_end")
        elif replica:
            replicas[int(replica.group(1))] = events
        else:
            run = events
    if skipped:
        logger.warning("Skipped %d line(s) of %s that are not timeline events.", skipped,
                       directory)
    return RunTimeline(root, run, replicas, ranks, replica_ranks, skipped,
                       tuple(refused))


class _Refused(Exception):
    """A timeline file that is not read, and why."""


def _read_events(path: Path) -> tuple[tuple[Event, ...], int]:
    """The events of one file and how many lines were skipped.

    Raises:
        _Refused: for a link, something else than a regular file, or a file over the bound.
    """
    try:  # without waiting for a writer, should it be a FIFO (refused then)
        fd = open_regular(path, os.O_RDONLY | _NONBLOCK)
    except (ConfigError, OSError) as error:
        raise _Refused(str(error)) from None
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        if size > MAX_FILE_BYTES:
            raise _Refused(
                f"{str(path)!r} is {size} bytes, more than the {MAX_FILE_BYTES} cadence reads "
                "of a timeline file: it was not written by cadence, or not by a run of "
                "sensible length.")
        events, skipped = [], 0
        for line in _bounded_lines(handle):
            if line is None:
                skipped += 1
                continue
            if not line.strip():
                continue
            try:
                event = parse_event(json.loads(line))
            except (ValueError, RecursionError):
                event = None
            if event is None:
                skipped += 1
            else:
                events.append(event)
    return tuple(events), skipped


def _bounded_lines(handle: IO[bytes]) -> Iterator[bytes | None]:
    """The lines of `handle`; None for each line longer than `MAX_LINE_BYTES` (not kept)."""
    while True:
        line = handle.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # the rest of the long line
                line = handle.readline(MAX_LINE_BYTES)
            yield None
        else:
            yield line
