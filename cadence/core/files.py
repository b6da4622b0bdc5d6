"""Opening the files of a run directory as untrusted input: never through a symbolic link, and
only names that stay inside the directory.

A run directory may be shared or copied from elsewhere. A link planted where cadence appends
(``metrics.jsonl``, ``resumes.jsonl``) or locks (``train.lock``) would make cadence write into,
or truncate, whatever the link points to; a name read from a run's own files (a manifest, the
export ledger) could name ``../../elsewhere``. `open_regular` refuses the first, `plain_name` and
`relative_name` the second.

The files cadence appends lines to are opened with `open_append`, which first drops a last line
that a crash cut short (`drop_torn_line`).
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import IO, Any

from cadence.core.errors import ConfigError

logger = logging.getLogger("cadence")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_regular(path: str | os.PathLike[str], flags: int, mode: int = 0o644,
                 where: str = "run directory") -> int:
    """``os.open(path, flags)`` without following a symbolic link at `path`, refusing anything
    but a regular file there; returns the descriptor. `where` names the kind of folder in the
    messages (a ``run directory``, a ``data folder``).

    Raises:
        ConfigError: if `path` is a symbolic link, or exists and is not a regular file (a
            directory, a FIFO): the message says what to do.
    """
    path = Path(path)
    link = ConfigError(
        f"{str(path)!r} is a symbolic link: cadence does not follow links in a {where} (one "
        f"could point anywhere). Remove the link, or use another {where}.")
    if path.is_symlink():  # also where the system has no O_NOFOLLOW
        raise link
    try:
        fd = os.open(path, flags | _NOFOLLOW, mode)
    except IsADirectoryError:
        raise ConfigError(f"{str(path)!r} is a directory where cadence keeps a file: move it "
                          f"away, or use another {where}.") from None
    except OSError:
        if path.is_symlink():  # made between the check and the open
            raise link from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{str(path)!r} is not a regular file: move it away, or use another "
                          f"{where}.")
    return fd


def open_append(path: str | os.PathLike[str], newline: str | None = None) -> IO[Any]:
    """A text file of lines opened for appending (created if missing), as `open_regular`
    allows; a last line that a crash cut short is dropped first (see `drop_torn_line`).

    Raises:
        ConfigError: as `open_regular`.
    """
    fd = open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        _drop_torn_line(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "a", encoding="utf-8", newline=newline)


def drop_torn_line(path: str | os.PathLike[str]) -> int:
    """Truncates the file of lines at `path` after its last newline; returns the bytes dropped.

    A process that dies in the middle of appending a line leaves its beginning without a
    newline. Appending after it would glue the next record to the fragment, and the record
    would be lost with it. Every file cadence appends lines to (``metrics.jsonl``,
    ``stats.jsonl``, ``resumes.jsonl``, ``metrics.csv``) follows this one rule: the fragment is
    dropped, so that every line of the file is a whole record. (Starting a new line after it
    instead would keep a CSV fragment that reads as a row of wrong numbers: ``0.12`` cut to
    ``0.1``.) A file that is empty or ends with a newline is left as it is.

    Raises:
        ConfigError: as `open_regular`.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "metrics.jsonl"
    >>> _ = path.write_text('{"step": 1}\\n{"step": 2, "lo')
    >>> drop_torn_line(path), path.read_text()
    (15, '{"step": 1}\\n')
    """
    fd = open_regular(path, os.O_RDWR)
    try:
        return _drop_torn_line(fd, path)
    finally:
        os.close(fd)


_BLOCK = 1 << 16


def _drop_torn_line(fd: int, path: str | os.PathLike[str]) -> int:
    """`drop_torn_line` on an open descriptor (read and write)."""
    size = os.fstat(fd).st_size
    if size == 0 or _read_at(fd, size - 1, 1) == b"\n":
        return 0
    # The fragment is short and the file may be long: look back for the newline in blocks.
    keep, end = 0, size
    while end > 0:
        start = max(0, end - _BLOCK)
        newline = _read_at(fd, start, end - start).rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        end = start
    os.ftruncate(fd, keep)
    logger.warning("Dropped the last line of %s: a crash cut it short (%d bytes, no newline).",
                   os.fspath(path), size - keep)
    return size - keep


def _read_at(fd: int, offset: int, size: int) -> bytes:
    """`size` bytes at `offset` (``os.pread`` is not on every system)."""
    os.lseek(fd, offset, os.SEEK_SET)
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


_PLAIN = re.compile(r"^[A-Za-z0-9_.+-]+$")


def plain_name(name: Any) -> bool:
    """Whether `name` is one file or folder name, with nothing that reaches elsewhere.

    >>> plain_name("best-40"), plain_name("../best-40"), plain_name("/etc"), plain_name("..")
    (True, False, False, False)
    """
    return isinstance(name, str) and bool(_PLAIN.match(name)) and name not in (".", "..")


def relative_name(name: Any) -> bool:
    """Whether `name` is a path relative to a directory that stays inside it (plain names
    joined by ``/``).

    >>> relative_name("sharded/__0_0.distcp"), relative_name("sharded/../../x")
    (True, False)
    """
    if not isinstance(name, str) or not name or "\\" in name:
        return False
    return all(plain_name(part) for part in PurePosixPath(name).parts) and not (
        name.startswith("/"))


def close_all(closables: Iterable[Any]) -> None:
    """Closes each of `closables` (files, writers), also after one of them failed -- a full
    disk fails the flush of every file's close -- and raises the first failure then, so that
    no file is left open.

    Raises:
        OSError: the first failure to close.
    """
    failure: OSError | None = None
    for closable in closables:
        try:
            closable.close()
        except OSError as error:
            failure = failure or error
    if failure is not None:
        raise failure
