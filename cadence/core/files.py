"""Opening the files of a run directory as untrusted input: never through a symbolic link, and
only names that stay inside the directory.

A run directory may be shared or copied from elsewhere. A link planted where cadence appends
(``metrics.jsonl``, ``resumes.jsonl``) or locks (``train.lock``) would make cadence write into,
or truncate, whatever the link points to; a name read from a run's own files (a manifest, the
export ledger) could name ``../../elsewhere``. `open_regular` refuses the first, `plain_name` and
`relative_name` the second.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import IO, Any

from cadence.core.errors import ConfigError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_regular(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags)`` without following a symbolic link at `path`, refusing anything
    but a regular file there; returns the descriptor.

    Raises:
        ConfigError: if `path` is a symbolic link, or exists and is not a regular file (a
            directory, a FIFO): the message says what to do.
    """
    path = Path(path)
    link = ConfigError(
        f"{str(path)!r} is a symbolic link: cadence does not write through links in a run "
        "directory (one could point anywhere). Remove the link, or use another run directory.")
    if path.is_symlink():  # also where the system has no O_NOFOLLOW
        raise link
    try:
        fd = os.open(path, flags | _NOFOLLOW, mode)
    except IsADirectoryError:
        raise ConfigError(f"{str(path)!r} is a directory where cadence keeps a file: move it "
                          "away, or use another run directory.") from None
    except OSError:
        if path.is_symlink():  # made between the check and the open
            raise link from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{str(path)!r} is not a regular file: move it away, or use another "
                          "run directory.")
    return fd


def open_append(path: str | os.PathLike[str], newline: str | None = None) -> IO[Any]:
    """A text file opened for appending (created if missing), as `open_regular` allows."""
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding="utf-8", newline=newline)


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
