"""`CheckpointWriter`: how a checkpoint's files reach the disk and become a checkpoint.

A `cadence.CheckpointManager` decides *what* a checkpoint holds and *when* it is saved or
restored; its writer does the writing, in the one of five ways the job calls for:

==============================  =============================================================
one process                     the files are written and committed now (`write_now`)
one process, ``async_save``     the state is copied into reused host buffers now; a thread
                                of its own writes and commits it (`_write_in_background`)
several processes               every rank writes its files into one staging directory, each
                                hashes and fsyncs its own, rank 0 gathers the digests and
                                commits (`_commit_distributed`: no file is read back)
several, ``async_save``         as above, each rank's files written by a thread; the commit
                                -- a collective -- waits for the next `wait` of the training
                                thread (`_wait_for_the_ranks_writes`)
several, sharded (FSDP2)        each rank's shards through ``torch.distributed.checkpoint``
                                (in DCP's thread with ``async_save``), committed as above
==============================  =============================================================

Every way commits atomically through `cadence.core.checkpoint_dir.CheckpointDirectory` (a
staging directory renamed into place once its manifest of SHA-256 digests is written), then
applies retention -- rank 0 of a distributed job deletes old checkpoints in a thread of its own.
A failed write commits nothing and says which checkpoint is still the newest good one.
Before training, `check_shared_directory` makes sure every rank sees the one directory they
will all write into.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed as dist

from cadence.core.checkpoint_dir import CheckpointDirectory, fsync_path
from cadence.core.errors import CheckpointError, StorageError
from cadence.core.rank import process_rank, world_size
from cadence.core.storage import name_newest, storage_cause, storage_error
from cadence.engine.background import in_background, yield_cpu_to_training
from cadence.engine.checkpoint_io import CheckpointIO, StateFileIO, save_with_digests
from cadence.engine.distributed import any_rank, broadcast_object, gather_on_rank_zero
from cadence.engine.rank_state import rank_file, write_rank_state
from cadence.engine.runtime import current_runtime, is_distributed
from cadence.engine.sharded import own_shard_digests, save_sharded, save_sharded_async
from cadence.engine.state_file import HostSnapshot, PackedState

logger = logging.getLogger("cadence")


def distributed() -> tuple[int, int]:
    """This process's rank and the job's world size ((0, 1) without a process group): each
    rank writes its own files."""
    return process_rank(), world_size()


class CheckpointWriter:
    """Writes and commits the checkpoints of one `cadence.CheckpointManager` (see the module
    docstring for the five ways).

    Args:
        directory: where the checkpoints are committed.
        io: how the shared state's files are written.
        async_save: write in the background (the training thread waits only for the copy into
            host memory).
        on_commit: called with the step and the path of each checkpoint once it is committed,
            on the rank that commits it, from the thread that does.
    """

    def __init__(self, directory: CheckpointDirectory, io: CheckpointIO, async_save: bool,
                 on_commit: Callable[[int, Path], None] | None = None) -> None:
        self.directory = directory
        self.io = io
        self.async_save = async_save
        self.on_commit = on_commit
        self._snapshot = HostSnapshot()
        self._rank_snapshot = HostSnapshot()  # this rank's random state and data position
        self._pending: threading.Thread | None = None
        # a DCP write of this rank: (future, staging, step, world size, rank 0's digests)
        self.pending_commit: tuple[Any, Path, int, int, dict[str, str]] | None = None
        """A distributed checkpoint written (or being written) and not committed yet."""
        self._pending_error: BaseException | None = None
        self._pruning: Future[Any] | None = None
        """Rank 0 of a distributed job deletes old checkpoints in a thread (`wait` joins it)."""

    def write(self, step: int, payload: dict[str, Any], rank_state: dict[str, Any],
              sharded: dict[str, Any]) -> None:
        """Writes the checkpoint of `step` -- the shared `payload` (rank 0's), this rank's
        `rank_state`, and its `sharded` parts (FSDP2, through DCP) -- in the way the job calls
        for. Every rank of a distributed job calls it.

        Raises:
            StorageError: if the machine fails the write (a full disk): the message names the
                newest good checkpoint.
            CheckpointError: if writing fails otherwise, or the ranks do not all see the
                directory.
        """
        rank, world = distributed()
        if world == 1 and self.async_save and not sharded:
            self._start_background_write(step, payload, rank_state)
        elif world == 1:
            self.write_now(payload, rank_state, step, sharded=sharded)
        else:
            self._write_distributed(step, payload, rank_state, sharded, rank, world)

    def _copy(self, payload: dict[str, Any]) -> dict[str, Any] | PackedState:
        """`payload` in host memory. The default writer writes the packed buffer as it is:
        a background thread then holds the GIL for a few calls, whatever the tensors."""
        return (self._snapshot.pack(payload) if isinstance(self.io, StateFileIO)
                else self._snapshot.take(payload))

    def _start_background_write(self, step: int, payload: dict[str, Any],
                                rank_state: dict[str, Any]) -> None:
        """One process, ``async_save``: the copy into host memory is the only part the
        training loop waits for; a thread writes and commits it."""
        copied = self._copy(payload)
        own = self._rank_snapshot.pack(rank_state)
        self._pending = threading.Thread(target=self._write_in_background,
                                         args=(copied, own, step),
                                         name=f"cadence-checkpoint-{step}")
        self._pending.start()

    def _stage(self, step: int, rank: int) -> Path:
        """The staging directory every rank of a distributed job writes into, made by rank 0
        and seen by every rank.

        Raises:
            CheckpointError: when a rank does not see it (no shared filesystem).
        """
        staging = self.directory.temp_path(step, unique=False)
        if rank == 0:
            staging.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        if any_rank(not staging.is_dir(), "checking the checkpoint directory"):
            raise CheckpointError(
                f"Not every rank sees the checkpoint directory {str(self.directory.directory)!r} "
                f"(rank {rank} {'does not' if not staging.is_dir() else 'does'}): the ranks "
                "of a job must share it. Put the run directory on a filesystem every node "
                "mounts (NFS, Lustre, a shared volume)."
            )
        return staging

    def _write_distributed(self, step: int, payload: dict[str, Any],
                           rank_state: dict[str, Any], sharded: dict[str, Any], rank: int,
                           world: int) -> None:
        staging = self._stage(step, rank)
        if self.async_save and not sharded:
            # As in one process: the training thread waits only for the copy into host
            # memory; this rank's files are written by a thread of its own, and committed
            # by the training thread at the next wait() (the commit is a collective).
            copied = self._copy(payload) if rank == 0 else None
            own = self._rank_snapshot.pack(rank_state)
            writing = in_background(f"cadence-checkpoint-{step}", self._write_files,
                                     copied, own, staging, rank)
            self.pending_commit = (writing, staging, step, world, {})
            return
        # Every rank's digests, computed while writing: the commit reads nothing back.
        checksums = self._write_files(payload if rank == 0 else None, rank_state, staging)
        if sharded and self.async_save:  # shards written by DCP's thread: commit later
            future = save_sharded_async(sharded, staging)
            self.pending_commit = (future, staging, step, world, checksums)
            return
        if sharded:
            save_sharded(sharded, staging)
        self._commit_distributed(staging, step, world, checksums)

    def _write_files(self, payload: dict[str, Any] | PackedState | None,
                     rank_state: dict[str, Any] | PackedState, staging: Path,
                     rank: int | None = None) -> dict[str, str]:
        """Writes this rank's file of a distributed checkpoint (and, with `payload`, rank 0's
        shared state: `save_with_digests`) into `staging`; returns every file's SHA-256."""
        rank = distributed()[0] if rank is None else rank
        checksums = {rank_file(staging, rank).name: write_rank_state(rank_state, staging, rank)}
        if payload is not None:
            checksums.update(save_with_digests(self.io, payload, staging))
        return checksums

    def _commit_distributed(self, staging: Path, step: int, world: int,
                            checksums: dict[str, str]) -> None:
        """Once every rank has written its files: each hashes its own shards (DCP's) and fsyncs
        its own files, rank 0 gathers every rank's digests and sizes -- which is also the wait
        for every rank's write -- and commits without reading, listing or fsyncing a file, then
        applies retention."""
        rank = distributed()[0]
        own = {**checksums, **own_shard_digests(staging, rank)}
        sizes = {}
        for name in own:  # each rank makes its own files durable, in parallel
            fsync_path(staging / name)
            sizes[name] = (staging / name).stat().st_size
        gathered = gather_on_rank_zero((own, sizes), "gathering the checkpoint's digests")
        if rank == 0:
            merged = {name: digest for digests, _ in gathered for name, digest in digests.items()}
            synced = {name: size for _, part in gathered for name, size in part.items()}
            final = self.directory.commit(staging, step, extra={
                "world_size": world, "layout": current_runtime().dims.degrees},
                checksums=merged, synced=synced)
            logger.info("Saved checkpoint %s.", final)
            if self.on_commit is not None:
                self.on_commit(step, final)
        dist.barrier()
        if distributed()[0] == 0:  # deletes thousands of files at scale: not in the way
            self._join_pruning()  # two prunes never overlap
            self._pruning = in_background(f"cadence-prune-{step}", self._prune)

    def _wait_for_the_ranks_writes(self) -> None:
        """Waits for this rank's background write (cadence's thread, or DCP's for shards);
        commits once every rank's is done, or discards the checkpoint on every rank when one
        failed (a collective, in the training thread)."""
        pending, self.pending_commit = self.pending_commit, None
        if pending is None:
            return
        future, staging, step, world, checksums = pending
        error: BaseException | None = None
        try:
            written = future.result()  # DCP's: None; cadence's own thread: the digests
            checksums = {**checksums, **(written if isinstance(written, dict) else {})}
        except Exception as failure:
            error = failure
        if any_rank(error is not None, "finishing a background checkpoint write"):
            if distributed()[0] == 0:
                shutil.rmtree(staging, ignore_errors=True)
            raise self._failure(step, error if error is not None else RuntimeError(
                "another rank's write failed"), background=True)
        self._commit_distributed(staging, step, world, checksums)

    def write_now(self, payload: dict[str, Any] | PackedState,
               rank_state: dict[str, Any] | PackedState, step: int, background: bool = False,
               sharded: dict[str, Any] | None = None) -> None:
        """Writes and commits the checkpoint of a single process, then applies retention."""
        staging = self.directory.temp_path(step)
        try:
            staging.mkdir(parents=True)
            checksums = dict(self.io.save(payload, staging) or {})  # type: ignore[arg-type]
            checksums[rank_file(staging, 0).name] = write_rank_state(rank_state, staging, 0)
            if sharded:
                save_sharded(sharded, staging)
            final = self.directory.commit(staging, step, checksums=checksums)
        except BaseException as error:
            shutil.rmtree(staging, ignore_errors=True)
            if storage_cause(error) is not None or isinstance(
                    error, (OSError, RuntimeError, TypeError, ValueError)):
                raise self._failure(step, error, background) from error
            raise
        logger.info("Saved checkpoint %s.", final)
        if self.on_commit is not None:
            self.on_commit(step, final)
        self._prune()

    def _failure(self, step: int, error: BaseException, background: bool) -> Exception:
        """What a failed write raises: a `StorageError` when the machine failed it (a full
        disk: `cadence.core.storage`), else a `CheckpointError`; either says what failed, why,
        and which checkpoint is still the newest good one."""
        name = self.directory.path_for(step).name
        what = (f"Writing checkpoint {name} in the background" if background
                else f"Saving checkpoint {name}")
        latest = self.directory.latest()
        storage = storage_error(what, error)
        if storage is not None:
            return name_newest(storage, None if latest is None else (str(latest.path),
                                                                     latest.step))
        reason = str(error).strip() or type(error).__name__
        good = (f"the newest good checkpoint is still {latest.path} (step {latest.step})"
                if latest is not None else "there is no good checkpoint yet")
        return CheckpointError(
            f"{what} failed: {reason}. {name} was not committed; {good}. Fix the cause, then "
            "run again: training resumes from the newest good one.")

    def _prune(self) -> None:
        for deleted in self.directory.prune():
            logger.info("Deleted old checkpoint %s (max_to_keep=%s).", deleted,
                        self.directory.max_to_keep)

    def _write_in_background(self, payload: dict[str, Any] | PackedState,
                             rank_state: PackedState, step: int) -> None:
        yield_cpu_to_training()
        try:
            self.write_now(payload, rank_state, step, background=True)
        except BaseException as error:  # handed to the training thread by wait()
            self._pending_error = error

    @property
    def writing(self) -> bool:
        """Whether a background write (``async_save``) is still running."""
        shards = self.pending_commit
        return ((self._pending is not None and self._pending.is_alive())
                or (shards is not None and not shards[0].done()))

    def abandon(self) -> None:
        """On a rank failing while the others may train on: waits for its own background work
        and drops an uncommitted distributed checkpoint without a commit's collectives (they
        would meet the others' training ones and hang the job until the collective timeout).
        The previous checkpoint stays the newest. In one process this is `wait`."""
        if distributed()[1] == 1:
            self.wait()
            return
        pending, self.pending_commit = self.pending_commit, None
        for work in (pending[0] if pending else None, self._pruning):
            if work is not None:
                work.exception()  # waits; what failed is dropped with the checkpoint
        self._pruning = None

    def wait(self, retention: bool = True) -> None:
        """Waits for a background write to be committed, and for old checkpoints to be deleted.

        Args:
            retention: False leaves the deletion of old checkpoints that the commit started
                running (rank 0 of a distributed job): the Task Trainer's wait at each loop's
                end, so that rank 0's training thread never waits for thousands of deletes.
                The next save or `wait()` joins it; a run ends with retention applied.

        Raises:
            StorageError: if the machine failed the background write (a full disk).
            CheckpointError: if it failed otherwise. Either message names the newest good
                checkpoint, which is still the newest complete one.
        """
        self._wait_for_the_ranks_writes()
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.join()
        if retention:
            self._join_pruning()
        error, self._pending_error = self._pending_error, None
        if isinstance(error, (CheckpointError, StorageError)):
            raise error
        if error is not None:
            raise CheckpointError(
                f"Writing a checkpoint in the background failed: {error}. The previous "
                "checkpoint is still the newest complete one.") from error

    def _join_pruning(self) -> None:
        pruning, self._pruning = self._pruning, None
        failed = pruning.exception() if pruning is not None else None  # (waits for it)
        if failed is not None:  # the old checkpoints stay; nothing is lost
            logger.warning("Deleting old checkpoints failed: %s", failed)


def check_shared_directory(directory: str | os.PathLike[str], timeout: float = 5.0) -> None:
    """Checks, before training, that every rank of a job sees one `directory`: rank 0 writes a
    random token there, and every rank must read it back within `timeout` seconds (a shared
    filesystem may show a new file late). A collective; nothing to do in one process.

    The ranks write their parts of every checkpoint into one directory, and all restore the
    newest one there: on nodes that do not share it, the first save would fail after a whole
    interval of training, and a node that sees no checkpoint would start again from step 0.

    Raises:
        CheckpointError: naming the ranks (and hosts) that do not see rank 0's token.
    """
    if not is_distributed():
        return
    rank = process_rank()
    directory = Path(directory)
    token: str | None = None
    if rank == 0:
        token = uuid.uuid4().hex
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f".shared-{token}").write_text(token, encoding="utf-8")
    token = broadcast_object(token)  # sent once rank 0 has written it
    probe = directory / f".shared-{token}"
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            if probe.read_text(encoding="utf-8") == token:
                break
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    views = gather_on_rank_zero((probe.is_file(), socket.gethostname()),
                                "checking that the ranks share the checkpoint directory")
    blind = None
    if rank == 0:
        with contextlib.suppress(OSError):
            probe.unlink()
        blind = ([f"rank {r} on {host}" for r, (ok, host) in enumerate(views) if not ok],
                 views[0][1])
    missing, host0 = broadcast_object(blind)  # every rank refuses, or none does
    if missing:
        raise CheckpointError(
            f"The ranks of this job do not share the checkpoint directory {str(directory)!r}: "
            f"{', '.join(missing)} cannot see the file rank 0 (on {host0}) wrote there. "
            "Every rank writes its part of each checkpoint there and restores from it: put the "
            "run directory on a filesystem every node mounts (NFS, Lustre, a shared volume) "
            "and pass that path to every node.")
