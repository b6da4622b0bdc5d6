"""`RunDirectory`: the layout of a run's directory, written down once.

Every front-end and built-in callback that writes into a run's directory finds its place here::

    <root>/
      params.yaml        the final config of a Task run (reloads exactly)
      train.lock         held while a process trains here (`RunLock`); in the fault-tolerant
                         mode each replica group holds its own, train-replica-<g>.lock
      checkpoints/       ckpt-<step>/ (atomic; a run resumes from the newest)
      train/             training summaries: TensorBoard event files, metrics.jsonl (or the
                         run's metric writers': metrics.csv, ...)
      eval/              evaluation summaries
      best/              the best exports (safetensors + metrics.json, ledger info.json)
      stats.jsonl        the tensorpack monitors' one line per epoch
      mlflow_run.json    the run's MLflow run (with the mlflow writer; ../mlruns/, shared by
                         the folder's runs, is its default store); wandb_run.json and wandb/
                         the same for W&B
      resumes.jsonl      one line each time training continued from a checkpoint
      events.out.tfevents.*.hparams
                         the run's hyper-parameters for TensorBoard's HPARAMS tab (the
                         tensorboard writer's)
      timeline/          what each attempt of the run lived through, as JSON lines
                         (`cadence.records.timeline`); ``cadence goodput`` reads it

The Task front-end (``run_experiment``, the ``cadence`` command) calls the root its model
directory, the tensorpack front-end its ``logdir``. Callbacks read the run directory of the run
they are in from ``RunState.run_dir``.

>>> run = RunDirectory("runs/digits-1")
>>> str(run.checkpoints), str(run.best)
('runs/digits-1/checkpoints', 'runs/digits-1/best')
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cadence.core.errors import ConfigError
from cadence.core.files import open_append, open_regular
from cadence.core.intervals import check_int, is_int
from cadence.core.rank import process_rank
from cadence.core.slurm import SlurmJob
from cadence.core.storage import writing

try:
    import fcntl
except ImportError:  # not POSIX: the lock falls back to an exclusively created file
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("cadence")

PARAMS_FILE = "params.yaml"
LOCK_FILE = "train.lock"
RESUMES_FILE = "resumes.jsonl"
TIMELINE_DIR = "timeline"
"""Where the run's timeline files are (`cadence.records.timeline`)."""
RESUME_REASONS = ("resume", "recovery")
"""Why training continued from a checkpoint: a new process resumed the run, or the loss guard
restored the newest checkpoint after a blow-up."""


class RunDirectory:
    """The paths of one run.

    Args:
        root: the run's directory (need not exist yet).
        eval_subdir: where evaluation summaries go (``trainer.validation_summary_subdir``).
        best_subdir: where the best exports go (``trainer.best_checkpoint_export_subdir``).
    """

    def __init__(self, root: str | os.PathLike[str], *, eval_subdir: str = "eval",
                 best_subdir: str = "best") -> None:
        self.root = Path(root)
        self.eval_subdir = eval_subdir
        self.best_subdir = best_subdir

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.root)!r})"

    @property
    def params(self) -> Path:
        """The saved config (``params.yaml``)."""
        return self.root / PARAMS_FILE

    @property
    def checkpoints(self) -> Path:
        """The checkpoint directory: where checkpoints are saved and resumed from."""
        return self.root / "checkpoints"

    @property
    def train(self) -> Path:
        """Training summaries."""
        return self.root / "train"

    @property
    def eval(self) -> Path:
        """Evaluation summaries."""
        return self.root / self.eval_subdir

    @property
    def best(self) -> Path:
        """The best exports."""
        return self.root / self.best_subdir

    @property
    def stats(self) -> Path:
        """The per-epoch JSON lines of the tensorpack monitors."""
        return self.root / "stats.jsonl"

    @property
    def lock_file(self) -> Path:
        """Held while a process trains in the run (see `RunLock`)."""
        return self.root / LOCK_FILE

    @property
    def timeline(self) -> Path:
        """The run's timeline files (`cadence.records.timeline`)."""
        return self.root / TIMELINE_DIR

    @property
    def resumes(self) -> Path:
        """The record of resumes: one JSON line each time training continued from a checkpoint
        (see `record_resume`)."""
        return self.root / RESUMES_FILE

    def record_resume(self, step: int, checkpoint: str | None, reason: str = "resume") -> None:
        """Appends ``{"step", "checkpoint", "reason", "time"}`` to `resumes` (rank 0 only).

        Summaries alone cannot tell where a run resumed (the steps after a clean resume simply
        go on), so the front-ends say so when they restore a checkpoint to continue training;
        ``cadence plot`` marks these steps. A last line that a crash cut short is dropped
        before the append (`cadence.core.files.open_append`).

        Args:
            step: the restored step: training continues with step ``step + 1``.
            checkpoint: the restored checkpoint's path.
            reason: one of `RESUME_REASONS`.

        Raises:
            ValueError: for a negative `step` or an unknown `reason`.
            StorageError: if the machine fails the write (a full disk).
        """
        step = check_int("RunDirectory.record_resume", "step", step,
                         "Pass the restored global step, e.g. 100.", minimum=0)
        if reason not in RESUME_REASONS:
            raise ValueError(f"`reason` (got {reason!r}) must be one of "
                             f"{', '.join(RESUME_REASONS)}.")
        if process_rank() != 0:
            return
        record = {"step": step, "checkpoint": None if checkpoint is None else str(checkpoint),
                  "reason": reason, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with writing(f"Recording the resume in {str(self.resumes)!r}"):
            self.root.mkdir(parents=True, exist_ok=True)
            with open_append(self.resumes) as handle:
                handle.write(json.dumps(record) + "\n")

    def layout_problem(self, training: bool) -> str | None:
        """What makes this directory unfit to hold the run, in one sentence with the fix, or
        None: found before step 0, never at the first save after a loop of training.

        Refused: a file where the run's directory, ``checkpoints/``, a summary or export
        directory must be; a directory where ``params.yaml`` or ``train.lock`` must be; a
        directory inside another run (``runs/X/checkpoints``); and, to train, an existing
        directory of someone else's files (files cadence does not write, and no run: see
        `is_run`), such as the current directory of a project.

        Args:
            training: whether a trainer is about to write into it (evaluation only reads a
                run, and writes its summaries).
        """
        root = self.root
        outer = enclosing_run(root)
        if outer is not None:
            return (f"{str(root)!r} is inside the run directory {str(outer)!r}: pass that run "
                    f"itself (--model-dir {outer}) to "
                    f"{'continue' if training else 'evaluate'} it, or a directory outside it.")
        if not root.exists():
            return None
        if not root.is_dir():
            return (f"The run directory {str(root)!r} is a file: pass a directory (a new one "
                    "starts a run, an existing one continues it).")
        for path, kind in ((self.params, "file"), (self.lock_file, "file"),
                           (self.checkpoints, "directory"), (self.train, "directory"),
                           (self.eval, "directory"), (self.best, "directory"),
                           (self.timeline, "directory")):
            if path == root:
                continue
            if path.is_symlink() or (path.exists() and path.is_dir() != (kind == "directory")):
                what = "a symbolic link" if path.is_symlink() else (
                    "a directory" if path.is_dir() else "a file")
                return (f"{str(path)!r} is {what} where cadence keeps its {path.name} "
                        f"{kind}: move it away, or use another run directory.")
        own = {PARAMS_FILE, LOCK_FILE, RESUMES_FILE, TIMELINE_DIR, "checkpoints", "train",
               "plots", "profile", "stats.jsonl", "mlruns", "mlflow_run.json", "wandb",
               "wandb_run.json",
               self.eval_subdir.split("/")[0], self.best_subdir.split("/")[0]}
        others = [p.name for p in root.iterdir() if p.name not in own
                  and not any(pattern.match(p.name) for pattern in _OWN_PATTERNS)]
        if training and others and not is_run(root):
            named = ", ".join(sorted(others)[:3]) + (", ..." if len(others) > 3 else "")
            if any(is_run(root / name) for name in others):
                return (f"{str(root)!r} holds other runs ({named}): pass one of them to "
                        "continue it, or a new directory for a new run.")
            return (f"{str(root)!r} holds files that are not a run's ({named}) and no run "
                    f"({PARAMS_FILE} with checkpoints/ or a trainer's lock): cadence will not "
                    "train among someone else's files; pass a new or empty directory, or a "
                    "run's.")
        return None

    def subdir(self, name: str) -> Path:
        """Another directory of the run (a callback's own, e.g. ``profile``)."""
        return self.root / name

    def replica_lock_file(self, replica: int) -> Path:
        """Held while replica group `replica` of a fault-tolerant job trains in the run: the
        groups train in one run directory at once, each under its own lock."""
        return self.root / f"train-replica-{int(replica)}.lock"

    @contextlib.contextmanager
    def training_lock(self, replica: int | None = None) -> Iterator[RunLock]:
        """Holds the run's `RunLock` -- or, for a replica group of a fault-tolerant job, the
        group's -- for the duration of a ``with`` block.

        Raises:
            RunLockedError: if another live process trains in this run directory (in this
                replica group).
        """
        lock = RunLock(self.lock_file if replica is None else self.replica_lock_file(replica))
        lock.acquire()
        try:
            yield lock
        finally:
            lock.release()


_PARAMS_BACKUP = re.compile(r"^params\.[0-9-]+\.yaml$")
"""The name of a replaced config (``params.<time>.yaml``)."""
_REPLICA_LOCK = re.compile(r"^train-replica-[0-9]+\.lock$")
"""The lock of a replica group in the fault-tolerant mode (`RunDirectory.replica_lock_file`)."""
_HPARAMS = re.compile(r"^events\.out\.tfevents\.[^/]*\.hparams$")
"""The tensorboard writer's hyper-parameters session, in the run's root."""
_OWN_PATTERNS = (_PARAMS_BACKUP, _REPLICA_LOCK, _HPARAMS)
"""The names of the run's own files that vary (besides the fixed names of `layout_problem`)."""


def is_run(path: Path) -> bool:
    """Whether `path` is the directory of a run that started: it holds ``params.yaml`` and
    ``checkpoints/`` or a trainer's lock -- ``train.lock``, or in the fault-tolerant mode a
    replica group's ``train-replica-<g>.lock``, which is all a run has before its first
    checkpoint -- (a ``params.yaml`` alone may be another tool's)."""
    if not (path / PARAMS_FILE).is_file():
        return False
    if (path / LOCK_FILE).exists() or (path / "checkpoints").is_dir():
        return True
    try:
        with os.scandir(path) as entries:
            return any(_REPLICA_LOCK.match(entry.name) for entry in entries)
    except OSError:
        return False


def enclosing_run(path: str | os.PathLike[str]) -> Path | None:
    """The run directory that `path` lies inside of (not `path` itself), or None.

    >>> enclosing_run("/") is None
    True
    """
    absolute = Path(os.path.abspath(path))
    for parent in absolute.parents:
        if parent.is_dir() and is_run(parent):
            try:  # say it as the user did: relative where they passed a relative path
                return parent.relative_to(Path.cwd()) if not Path(path).is_absolute() else parent
            except ValueError:
                return parent
    return None


class RunLockedError(RuntimeError):
    """Another live process trains in the run directory. The message names it."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # it exists (another user's), or we cannot tell: assume alive
    return True


class RunLock:
    """One trainer per run directory: an exclusive lock on `path` while training.

    The file records the owner (pid, host, command, start time, and the Slurm job and step it
    runs in, if any), so that a second trainer's error names it. On POSIX the lock is an
    ``flock``, which the kernel drops when its process dies however it dies: a lock left by a
    dead process is taken over (and said so). Elsewhere the file is created exclusively and a
    dead owner is detected by its pid. Evaluation does not take the lock: it only reads
    checkpoints, and may run beside a trainer.

    Args:
        path: the lock file (`RunDirectory.lock_file`).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @staticmethod
    def _owner_text(owner: dict[str, Any]) -> str:
        if not owner.get("pid"):
            return "another process"
        host = owner.get("host")
        where = f" on {host}" if host and host != socket.gethostname() else ""
        command = f" ({owner['command']})" if owner.get("command") else ""
        since = f", since {owner['since']}" if owner.get("since") else ""
        job = (f", in Slurm job {owner['slurm_job']} (step {owner.get('slurm_step', '?')})"
               if owner.get("slurm_job") else "")
        return f"process {owner['pid']}{where}{command}{since}{job}"

    def _read_owner(self) -> dict[str, Any]:
        try:
            owner = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}
        return owner if isinstance(owner, dict) else {}

    def _refuse(self, owner: dict[str, Any]) -> RunLockedError:
        return RunLockedError(
            f"{str(self.path.parent)!r} is in use: {self._owner_text(owner)} is training in "
            "it. Wait for it to finish or stop it, or train in another directory; evaluation "
            "(`cadence eval`) may run beside it."
        )

    def acquire(self) -> None:
        """Takes the lock.

        Raises:
            RunLockedError: naming the process that holds it.
            StorageError: if the machine fails the write (a full disk, a read-only file
                system).
        """
        if self._fd is not None:
            return
        with writing(f"Taking the run's lock {str(self.path)!r}"):
            self._acquire()

    def _acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is not None:
            fd = open_regular(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise self._refuse(self._read_owner()) from None
        else:
            owner = self._read_owner()
            if owner.get("pid") and _pid_alive(int(owner["pid"])):
                raise self._refuse(owner)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            try:
                fd = open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                raise self._refuse(self._read_owner()) from None
        previous = self._read_owner()
        if previous.get("pid") and previous.get("pid") != os.getpid():
            logger.warning("Taking over %s: it was held by %s, which is no longer running.",
                           self.path, self._owner_text(previous))
        job = SlurmJob.from_environ()
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "command": " ".join(sys.argv)[:200],
                  "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                  **(job.record() if job is not None else {})}
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(record).encode("utf-8"))
        except BaseException:  # a full disk: the lock is not held, its file not left open
            os.close(fd)
            raise
        self._fd = fd

    def holder(self) -> dict[str, Any] | None:
        """The record of the live process that holds the lock (its ``pid``, ``host``,
        ``command``, ``since``; ``{}`` when unreadable), or None when no process holds it.

        Found without taking the lock or changing the file, so that a trainer starting at
        that moment is never refused because of it: on Linux from the kernel's table of locks
        (``/proc/locks``, which shows the locks of this machine only: a trainer on another host
        of a shared filesystem is not seen). Elsewhere a shared lock is tried without waiting
        and dropped at once; without ``fcntl``, the recorded pid is checked.
        """
        try:
            info = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        owner = _read_small_json(self.path)
        held = _held_in_kernel_table(info, owner.get("pid"))
        if held is None and fcntl is not None:
            held = _held_by_probe(self.path)
        elif held is None:
            held = is_int(owner.get("pid")) and _pid_alive(int(owner["pid"]))
        return owner if held else None

    def release(self) -> None:
        """Releases the lock (the file stays, emptied: removing it would race a new owner)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        if fcntl is None:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(fd)


_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted as the lock file: never wait on it


def _read_small_json(path: Path, limit: int = 1 << 16) -> dict[str, Any]:
    """The JSON object in the regular file `path` (at most `limit` bytes read), or ``{}``."""
    try:
        fd = open_regular(path, os.O_RDONLY | _NONBLOCK)
    except (ConfigError, OSError):
        return {}
    try:
        owner = json.loads(os.read(fd, limit) or b"{}")
    except ValueError:
        return {}
    finally:
        os.close(fd)
    return owner if isinstance(owner, dict) else {}


_KERNEL_LOCK_FILE = re.compile(r"^([0-9a-f]+):([0-9a-f]+):([0-9]+)$")


def _held_in_kernel_table(info: os.stat_result, owner_pid: Any) -> bool | None:
    """Whether ``/proc/locks`` lists a lock on the file of `info`, or None without that table.

    A line reads ``1: FLOCK  ADVISORY  WRITE 8387 fe:00:2146426 0 EOF`` (the holder's pid,
    then the device in hex and the inode); a process waiting for a lock is a line with ``->``,
    which holds nothing. On an overlay filesystem the table names the device underneath, so a
    line with the inode and the pid the lock file records counts too.
    """
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as handle:
            table = handle.read()
    except OSError:
        return None
    device = (os.major(info.st_dev), os.minor(info.st_dev))
    for line in table.splitlines():
        parts = line.split()
        if "->" in parts:
            continue
        for index, part in enumerate(parts[1:], start=1):
            match = _KERNEL_LOCK_FILE.match(part)
            if match is None or int(match.group(3)) != info.st_ino:
                continue
            pid = parts[index - 1]
            same_device = (int(match.group(1), 16), int(match.group(2), 16)) == device
            if same_device or (pid.isdigit() and is_int(owner_pid) and int(pid) == owner_pid):
                return True
    return False


def _held_by_probe(path: Path) -> bool:
    """Whether a shared ``flock`` on `path` would have to wait (taken and dropped at once)."""
    try:
        fd = open_regular(path, os.O_RDONLY | _NONBLOCK)
    except (ConfigError, OSError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
