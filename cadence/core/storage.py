"""The machine's failures of writing, mapped in one place: every writer's error -> `StorageError`.

A run writes through many libraries, and each says "the disk is full" its own way: an `OSError`
with ``errno.ENOSPC`` (cadence's own files, TensorBoard's event files, MLflow's file store, JSON
lines, CSV), safetensors' ``SafetensorError("Error while serializing: I/O error: No space left
on device (os error 28)")`` (exports), and ``torch.distributed.checkpoint``'s
``CheckpointException`` -- a `BaseException` -- holding each rank's error (sharded
checkpoints). `storage_cause` finds the machine's error behind any of them; `writing` turns it
into one `StorageError` at the place that knows what was being written; `name_newest` adds the
checkpoint the run resumes from, where the run's checkpoints are known. Nothing here imports
torch or the writers' libraries: their errors are recognised by what they hold.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from cadence.core.errors import StorageError

FIXES: Mapping[int, str] = {
    errno.ENOSPC: "free some space", errno.EDQUOT: "free some space (the disk quota is full)",
    errno.EROFS: "use a writable file system", errno.EACCES: "fix the permissions",
    errno.EPERM: "fix the permissions", errno.EIO: "check the disk",
    errno.EMFILE: "raise the limit of open files (`ulimit -n`)",
}
"""The errors of the machine rather than of cadence or the user, and what to do about each."""

_RUST_IO_ERROR = re.compile(r"\(os error ([0-9]{1,5})\)")
"""How a Rust library (safetensors) prints the operating system's error in its message."""
_MOST_LOOKED_AT = 64


def storage_cause(error: BaseException) -> OSError | None:
    """The machine's error behind `error`, as an `OSError` with one of the `FIXES`' numbers, or
    None when `error` is something else (a bug, a user's mistake).

    Looks at `error` itself, what caused it (``__cause__``, ``__context__``), the errors each
    rank of a ``torch.distributed.checkpoint`` failure holds (its ``failures``), and a message
    that carries Rust's display of an I/O error (safetensors' ``SafetensorError``).

    >>> storage_cause(OSError(errno.ENOSPC, "No space left on device")).errno == errno.ENOSPC
    True
    >>> storage_cause(Exception("Error while serializing: I/O error: No space left on device "
    ...                         "(os error 28)")).strerror
    'No space left on device'
    >>> storage_cause(FileNotFoundError(errno.ENOENT, "No such file")) is None
    True
    """
    todo: list[BaseException] = [error]
    seen: set[int] = set()
    while todo and len(seen) < _MOST_LOOKED_AT:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            if current.errno in FIXES:
                return current
        else:
            found = _RUST_IO_ERROR.search(str(current)[:10_000])
            if found is not None and int(found.group(1)) in FIXES:
                number = int(found.group(1))
                return OSError(number, os.strerror(number))
        todo.extend(_held_errors(current))
    return None


def _held_errors(error: BaseException) -> list[BaseException]:
    """The errors `error` holds: its cause and context, and a DCP failure's errors by rank."""
    held = [inner for inner in (error.__cause__, error.__context__) if inner is not None]
    failures: Any = getattr(error, "failures", None)
    if isinstance(failures, Mapping):
        for pair in failures.values():  # rank -> (error, traceback)
            inner = pair[0] if isinstance(pair, tuple) and pair else pair
            if isinstance(inner, BaseException):
                held.append(inner)
    return held


def storage_error(what: str, error: BaseException) -> StorageError | None:
    """`error` as a `StorageError` saying that `what` failed, when the machine caused it (see
    `storage_cause`); `error` itself when it is one already; else None."""
    if isinstance(error, StorageError):
        return error
    cause = storage_cause(error)
    if cause is None:
        return None
    reason = cause.strerror or str(cause)
    if cause.filename and str(cause.filename) not in what:
        reason += f" ({cause.filename})"
    return StorageError(what, reason, FIXES[cause.errno], errno=cause.errno)  # type: ignore[index]


@contextlib.contextmanager
def writing(what: str) -> Iterator[None]:
    """Turns the machine's failure inside the block, from any writer, into a `StorageError`
    saying that `what` failed; anything else passes through as it is."""
    try:
        yield
    except BaseException as error:
        mapped = storage_error(what, error)
        if mapped is None or mapped is error:
            raise
        raise mapped from error


def name_newest(error: StorageError, newest: tuple[str, int] | None) -> StorageError:
    """Says in `error`, unless it says already, which checkpoint the run resumes from:
    `newest` (its path and step), or that there is none yet. Returns `error`."""
    if error.newest is None:
        error.newest = ("There is no good checkpoint yet" if newest is None else
                        f"The newest good checkpoint is {newest[0]} (step {newest[1]})")
    return error
