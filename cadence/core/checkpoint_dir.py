"""The checkpoint directory: atomic commits, listing of complete checkpoints, retention.

A checkpoint is a directory ``ckpt-<step>`` holding the files an I/O backend wrote plus a
``manifest.json`` that names each file with its size and its SHA-256 checksum. It is written
under a hidden temporary name, every file and the directory are fsynced, the manifest is written
last, and only then is the directory renamed into place -- one atomic step. So a ``ckpt-<step>``
directory that exists is complete; one without a valid manifest, or whose files do not have the
sizes it lists, is never listed. A crash at any moment leaves at worst a hidden temporary
directory, removed on the next start.

Damage that keeps the sizes (flipped bytes) is found by `verify_files`, which readers run
before they trust a checkpoint (``sha256sum`` checks the same digests from a shell). A damaged
checkpoint is never deleted: `CheckpointDirectory.move_aside` renames it to
``ckpt-<step>.damaged-<time>`` (no longer listed, kept for inspection) with the reason beside
it, so that the run goes on from the newest good one and the next save of that step is not
blocked.

Nothing here imports torch: what goes into the files is the I/O backend's business.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cadence.core.errors import CheckpointError, CheckpointIncompatibleError, ConfigError
from cadence.core.files import relative_name
from cadence.core.intervals import is_int

logger = logging.getLogger(__name__)

FORMAT = "cadence-checkpoint"
VERSION = 2
"""Version 2 adds the ``sha256`` section; version 1 manifests (sizes only) are still read."""
MANIFEST = "manifest.json"
DAMAGED_NOTE = "DAMAGED.txt"
"""What `CheckpointDirectory.move_aside` writes beside a damaged checkpoint's files: why."""
_NAME = re.compile(r"^ckpt-(\d+)$")
_TEMP_PREFIX = ".tmp-ckpt-"
DEFAULT_MAX_TO_KEEP = 5
"""How many of the newest checkpoints every front-end keeps unless told otherwise."""
_TRASH_PREFIX = ".trash-ckpt-"


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint on disk."""

    step: int
    path: Path


def fsync_path(path: Path) -> None:
    """Flushes a file or directory to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: str | os.PathLike[str], chunk_size: int = 8 << 20) -> str:
    """The SHA-256 of a file's content, as hex; read in chunks (hashing releases the GIL)."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk_size)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            read = handle.readinto(buffer)
            if not read:
                break
            digest.update(view[:read])
    return digest.hexdigest()


def write_atomically(path: Path, text: str, errors: str = "strict") -> Path:
    """Writes `text` to `path` so that readers see the old file or the whole new one: a hidden
    temporary file in the same directory, flushed to disk, then renamed over `path` (removed
    when the write fails). `errors` is the UTF-8 encoding's (``surrogateescape`` writes back
    bytes read that way)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(temp, "w", encoding="utf-8", errors=errors) as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:  # a full disk: no half-written file is left beside `path`
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    return path


def read_manifest(path: str | os.PathLike[str],
                  sizes_of: Iterable[str] | None = None) -> dict[str, Any]:
    """Reads the manifest of checkpoint directory `path` and checks the files' sizes.

    This is cheap (no file is read); `verify_files` also checks the content.

    Args:
        path: the checkpoint directory.
        sizes_of: the files whose presence and size to check (a `stat` each); None checks
            every file the manifest lists. A reader that checks each file it reads
            (`verify_files` does, size first) passes ``()``: at 1,024 ranks a checkpoint has
            thousands of files, and every rank statting all of them is millions of `stat`s.

    Raises:
        CheckpointError: if `path` is not a directory, has no manifest, the manifest is not
            cadence's, or a file is missing or has another size than when it was written.
    """
    path = Path(path)
    if not path.is_dir():
        what = "is a file, not a directory" if path.exists() else "does not exist"
        raise CheckpointError(
            f"Checkpoint {str(path)!r} {what}. "
            "Pass a `ckpt-<step>` directory written by cadence's CheckpointManager."
        )
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(
            f"{str(path)!r} has no {MANIFEST}: it is not a complete cadence checkpoint "
            "(it was not written by cadence, or its write never finished). "
            "Use CheckpointManager.checkpoints to list the complete ones."
        ) from None
    except (OSError, ValueError) as error:
        raise CheckpointError(f"The manifest of {str(path)!r} is unreadable: {error}.") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"{str(path)!r} is not a cadence checkpoint (its {MANIFEST} has no "
            f"format={FORMAT!r}). Load foreign weights in an `init_fn` instead."
        )
    version = manifest.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise CheckpointError(f"{str(path)!r} has a {MANIFEST} whose version is not a number "
                              f"(got {version!r}): it is damaged.")
    if version > VERSION:
        # Sound, but not for this cadence: never skipped for an older checkpoint or a fresh
        # start (a refusal is never a rollback).
        raise CheckpointIncompatibleError(
            f"{str(path)!r} was written by a newer cadence (format version {version}, this one "
            f"reads up to {VERSION}). Upgrade cadence (pip install -U cadence), then run the "
            "same command again."
        )
    files, checksums = manifest.get("files", {}), manifest.get("sha256", {})
    if (not isinstance(files, dict) or not isinstance(checksums, dict)
            or not isinstance(manifest.get("step"), int)):
        raise CheckpointError(f"The manifest of {str(path)!r} is damaged: it lacks the step, "
                              "the files or their checksums. Restore an older checkpoint.")
    outside = [name for name in [*files, *checksums] if not relative_name(name)]
    if outside:
        raise CheckpointError(
            f"The manifest of {str(path)!r} names files outside the checkpoint "
            f"({', '.join(map(repr, outside[:3]))}): it was not written by cadence, or was "
            "tampered with. Restore an older checkpoint.")
    for name in files if sizes_of is None else sizes_of:
        if name in files:
            check_size(path, name, files[name])
    return manifest


def check_size(path: Path, name: str, size: Any) -> None:
    """Checks that file `name` of checkpoint `path` is a plain file of `size` bytes.

    Raises:
        CheckpointError: naming the file, when it is missing, a link, or of another size.
    """
    file = path / name
    if file.is_symlink() or not file.is_file() or file.stat().st_size != size:
        raise CheckpointError(
            f"Checkpoint {str(path)!r} is corrupt: {name} is missing or has been "
            f"truncated (expected {size} bytes). Restore an older checkpoint instead."
        )


def verify_files(path: str | os.PathLike[str], manifest: dict[str, Any],
                 names: Sequence[str] | None = None) -> None:
    """Checks the content of checkpoint files against the SHA-256 digests in `manifest`.

    Args:
        path: the checkpoint directory.
        manifest: its manifest (`read_manifest`).
        names: the files to check; None checks every file that has a digest. A file without
            one (a version 1 checkpoint) is not checked.

    Raises:
        CheckpointError: naming the first file that is missing, has another size than the
            manifest lists, or whose content differs from when it was written.
    """
    path = Path(path)
    checksums: dict[str, str] = manifest.get("sha256", {})
    sizes: dict[str, Any] = manifest.get("files", {})
    for name in checksums if names is None else names:
        if name in sizes:
            check_size(path, name, sizes[name])
        expected = checksums.get(name)
        if expected is None:
            continue
        try:
            actual = file_sha256(path / name)
        except OSError as error:
            raise CheckpointError(f"Cannot read {str(path / name)!r}: {error}.") from error
        if actual != expected:
            raise CheckpointError(
                f"Checkpoint {str(path)!r} is damaged: {name} does not match its SHA-256 "
                "checksum (its bytes changed after it was written). Restore an older "
                "checkpoint instead."
            )


class CheckpointDirectory:
    """Manages the ``ckpt-<step>`` directories under `directory`.

    Args:
        directory: where checkpoints live; created on the first commit.
        max_to_keep: how many of the newest complete checkpoints to keep; None keeps all.
        writer: who writes here, when several jobs write into one directory (the replica
            groups of a fault-tolerant job: ``"r1"``): its staging directories carry the name,
            and `remove_stale` removes only its own leftovers -- never another writer's write
            in progress. ``""``: the only writer.

    Raises:
        ConfigError: for an empty `directory` (the current one), or one that is a file --
            refused when the manager is made, not at the first save after training.
    """

    def __init__(self, directory: str | os.PathLike[str],
                 max_to_keep: int | None = DEFAULT_MAX_TO_KEEP, writer: str = "") -> None:
        if max_to_keep is not None and not (is_int(max_to_keep) and max_to_keep >= 1):
            raise ValueError(
                f"`max_to_keep` (got {max_to_keep!r}) must be a positive int, or None to keep "
                "every checkpoint."
            )
        if not str(directory).strip():
            raise ConfigError("The checkpoint directory is '': pass a directory, e.g. "
                             "'runs/mine/checkpoints' ('' would write into the current one).")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ConfigError(f"The checkpoint directory {str(directory)!r} is a file: move it "
                             "away, or pass another directory.")
        self.max_to_keep = max_to_keep
        self.writer = writer
        self._reported: set[str] = set()  # incomplete directories already warned about
        self._sized: set[tuple[str, int]] = set()
        """Checkpoints (name, inode) whose files' sizes this process checked once: listed again
        -- rank 0 lists after every commit, to prune -- only their manifests are read. Each
        checkpoint's files are `stat`ted once, not once per save for as long as it is kept."""

    def path_for(self, step: int) -> Path:
        """Where the checkpoint of `step` is (or would be) committed."""
        return self.directory / f"ckpt-{step}"

    def checkpoints(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest first. Incomplete or foreign directories are skipped.

        Raises:
            CheckpointIncompatibleError: for a checkpoint a newer cadence wrote: skipping it
                could restore an older one, or start the run afresh, in its place.
        """
        if not self.directory.is_dir():
            return []
        found = []
        for entry in self.directory.iterdir():
            match = _NAME.match(entry.name)
            if match is None or not entry.is_dir():
                continue
            key = (entry.name, entry.stat().st_ino)
            try:
                read_manifest(entry, sizes_of=() if key in self._sized else None)
                self._sized.add(key)
            except CheckpointIncompatibleError:
                raise  # a newer cadence's: this run cannot go on here, nor start afresh
            except CheckpointError as error:
                if str(entry) not in self._reported:  # listings repeat: say it once
                    self._reported.add(str(entry))
                    logger.warning("Skipping %s: %s", entry, error)
                continue
            found.append(CheckpointInfo(int(match.group(1)), entry))
        return sorted(found, key=lambda info: info.step)

    def latest(self) -> CheckpointInfo | None:
        """The newest complete checkpoint, or None."""
        complete = self.checkpoints()
        return complete[-1] if complete else None

    def move_aside(self, path: Path, reason: str) -> Path:
        """Renames damaged checkpoint `path` so that it is no longer listed, and keeps it.

        The new name is ``<name>.damaged-<time>`` beside it; `DAMAGED_NOTE` inside says why.
        The files are not touched otherwise, so the damage can still be inspected.

        Returns:
            Where the checkpoint is now.
        """
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = path.with_name(f"{path.name}.damaged-{stamp}")
        suffix = 1
        while target.exists():
            suffix += 1
            target = path.with_name(f"{path.name}.damaged-{stamp}-{suffix}")
        os.rename(path, target)
        with contextlib.suppress(OSError):  # the note is a courtesy (the disk may be full)
            (target / DAMAGED_NOTE).write_text(f"{reason}\n", encoding="utf-8")
        self._reported.discard(str(path))
        return target

    def remove_stale(self) -> None:
        """Removes temporary and half-deleted directories left by a crash."""
        if not self.directory.is_dir():
            return
        for entry in self.directory.iterdir():
            if entry.name.startswith((_TEMP_PREFIX, _TRASH_PREFIX)) and self._owns(entry.name):
                logger.info("Removing %s, left by an interrupted checkpoint write.", entry)
                shutil.rmtree(entry, ignore_errors=True)

    def temp_path(self, step: int, unique: bool = True) -> Path:
        """A hidden staging path for the checkpoint of `step`.

        With ``unique=False`` the name is the same in every process, which lets the ranks of a
        distributed job write into one staging directory.
        """
        suffix = f"-{uuid.uuid4().hex[:8]}" if unique else ""
        writer = f".{self.writer}" if self.writer else ""
        return self.directory / f"{_TEMP_PREFIX}{step}{writer}{suffix}"

    def _owns(self, name: str) -> bool:
        """Whether a leftover named `name` is this writer's (every one, for the only writer)."""
        if not self.writer:
            return True
        return "." in name[1:] and name[1:].rsplit(".", 1)[1].split("-")[0] == self.writer

    @contextlib.contextmanager
    def staging(self, step: int) -> Iterator[Path]:
        """Yields an empty staging directory; on normal exit it is committed as ``ckpt-<step>``,
        on an exception it is removed and nothing is committed."""
        temp = self.temp_path(step)
        temp.mkdir(parents=True)
        try:
            yield temp
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        self.commit(temp, step)

    def commit(self, temp: Path, step: int, extra: dict[str, Any] | None = None,
               checksums: dict[str, str] | None = None,
               synced: dict[str, int] | None = None) -> Path:
        """Writes the manifest into staging directory `temp` and renames it to ``ckpt-<step>``.

        Every file is fsynced before the manifest is written, and the rename is the last step,
        so the checkpoint appears whole or not at all. A directory already at ``ckpt-<step>``
        (an incomplete or damaged leftover: callers keep a good one instead of saving again) is
        moved aside first, so it never blocks the save.

        Args:
            temp: the staging directory.
            step: the checkpoint's step.
            extra: more manifest entries.
            checksums: SHA-256 digests of files, computed while they were written; the others
                are read back and hashed here.
            synced: the whole checkpoint, when its writers say what it is: every file's size
                by name, each already fsynced by the process that wrote it (every rank of a
                distributed job its own), with its digest in `checksums`. The commit then
                lists, stats and fsyncs no file -- its work does not grow with the files.
        """
        if synced is not None:
            files = dict(sorted(synced.items()))
            digests = {name: (checksums or {})[name] for name in files}
            for folder in sorted({str(Path(name).parent) for name in files}):
                fsync_path(temp / folder)  # the entries the writers made
        else:
            files, digests = {}, {}
            for file in sorted(temp.rglob("*")):
                if file.is_file():
                    name = str(file.relative_to(temp))
                    fsync_path(file)
                    files[name] = file.stat().st_size
                    known = (checksums or {}).get(name)
                    digests[name] = known if known is not None else file_sha256(file)
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "step": step,
            "time": time.time(),
            "files": files,
            "sha256": digests,
            **(extra or {}),
        }
        manifest_path = temp / MANIFEST
        with open(manifest_path, "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        fsync_path(temp)
        final = self.path_for(step)
        if final.exists():
            moved = self.move_aside(final, f"{final.name} was incomplete or damaged, and in the "
                                    "way of a new checkpoint of the same step.")
            logger.warning("Moved %s aside to %s: it was incomplete or damaged, and a new "
                           "checkpoint of step %d replaces it.", final, moved, step)
        os.rename(temp, final)
        fsync_path(self.directory)
        return final

    def prune(self) -> list[Path]:
        """Deletes the oldest complete checkpoints beyond `max_to_keep`; returns what it deleted.

        The newest complete checkpoint is never deleted. A checkpoint is first renamed to a hidden
        name and then removed, so a crash mid-delete never leaves a partial ``ckpt-<step>``.
        """
        if self.max_to_keep is None:
            return []
        complete = self.checkpoints()
        doomed = complete[: max(0, len(complete) - self.max_to_keep)]
        deleted = []
        for info in doomed:
            writer = f".{self.writer}" if self.writer else ""
            trash = self.directory / f"{_TRASH_PREFIX}{info.step}{writer}-{uuid.uuid4().hex[:8]}"
            os.rename(info.path, trash)
            shutil.rmtree(trash, ignore_errors=True)
            deleted.append(info.path)
        return deleted


def new_checkpoints(listing: Callable[[], Sequence[CheckpointInfo]], timeout: float | None,
                    poll_interval: float = 1.0,
                    timeout_fn: Callable[[], bool] | None = None) -> Iterator[CheckpointInfo]:
    """Yields every complete checkpoint that `listing` shows, oldest first, as they appear --
    each once -- until `timeout` seconds pass without a new one (None: forever).

    When the timeout expires, `timeout_fn` is called (TensorFlow's ``checkpoints_iterator``):
    True ends the iteration, False waits another `timeout`; without one the iteration ends.
    `listing` is called again after each yielded checkpoint, so one deleted by retention
    before it was read is never yielded.
    """
    seen: set[int] = set()
    last_new = time.monotonic()
    while True:
        pending = [info for info in listing() if info.step not in seen]
        if pending:
            info = pending[0]
            seen.add(info.step)
            yield info
            last_new = time.monotonic()
            continue
        if timeout is not None and time.monotonic() - last_new >= timeout:
            if timeout_fn is None or timeout_fn():
                logger.info("No new checkpoint for %.0fs: continuous evaluation ends.", timeout)
                return
            last_new = time.monotonic()
            continue  # timeout_fn may have waited for, or made, a new checkpoint: look again
        time.sleep(poll_interval)
