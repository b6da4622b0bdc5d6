"""Real file systems that fail, for the tests of what cadence does when the machine does: a small
tmpfs that fills up, a ballast that fills it now, and a read-only remount. Mounting needs root
on Linux; where it fails, the test is skipped with the reason."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *arguments], capture_output=True, text=True)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "256k") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (made) for the block, then unmounted.

    Skips the test, saying why, where it cannot be mounted (not root, no mount command, a
    container that forbids it).
    """
    path.mkdir(parents=True, exist_ok=True)
    try:
        mounted = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    except OSError as error:
        pytest.skip(f"cannot mount a tmpfs here ({error}): run as root on Linux")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}): "
                    "run as root on Linux")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(directory: Path, leave: int = 0) -> Path:
    """Fills the file system of `directory` with a ballast file until at most `leave` bytes
    are free (0: until a write fails with ``ENOSPC``); returns the ballast, whose removal frees
    the space again. Files whose last page has room may still grow a little, as on any full
    disk."""
    ballast = directory / f"ballast-{len(list(directory.glob('ballast-*')))}"
    with open(ballast, "wb", buffering=0) as handle:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1):
            while True:
                free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
                if leave and free - chunk < leave:
                    break
                try:
                    handle.write(b"\0" * chunk)
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    break
    return ballast


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """The tmpfs mounted at `path` remounted read-only for the block (writes fail with
    ``EROFS``), then writable again."""
    remounted = _mount("-o", "remount,ro", str(path))
    if remounted.returncode != 0:
        pytest.skip(f"cannot remount {path} read-only ({remounted.stderr.strip()})")
    try:
        yield path
    finally:
        _mount("-o", "remount,rw", str(path))


def open_files_under(directory: Path) -> list[str]:
    """The files under `directory` this process holds open (from ``/proc/self/fd``)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(directory)):
                held.append(target)
    return held
