"""`CheckpointManager`: saves and restores everything needed to continue a run exactly.

A checkpoint holds the state of every tracked object (a `Module` contributes the parts it
declares in `Module.checkpoint_items`: models, optimizers, schedulers, scalers, a runner's step
counter and data position), the
states of the random number generators of every rank, and, when a Controller drives it, the
callbacks' and the Controller's own state.

Files are committed atomically by `cadence.core.checkpoint_dir.CheckpointDirectory`, with the
SHA-256 of each in the manifest. The default `StateFileIO` writes ``state.cadence``
(`cadence.engine.state_file`: a safetensors file, no pickle), so a background write releases
the GIL for nearly all of its time, and loading never unpickles anything. The bytes go through
a small `CheckpointIO` interface, so a sharded writer (``torch.distributed.checkpoint``) can
replace the default one without changing callers.

What a restore does with a damaged checkpoint (truncated, flipped bytes, unreadable, not
cadence's, written for another model): `restore_or_initialize` falls back to the newest good
one with a warning that names the damage, and a training job moves each damaged newer one aside
(renamed ``ckpt-<step>.damaged-<time>``, kept) so that it can save that step again; with no
good checkpoint it fails with one error listing what is wrong with each.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed as dist

from cadence.core.checkpoint_dir import (
    DEFAULT_MAX_TO_KEEP,
    CheckpointDirectory,
    CheckpointInfo,
    fsync_path,
    read_manifest,
)
from cadence.core.errors import (
    CheckpointError,
    CheckpointIncompatibleError,
    CheckpointMismatchError,
)
from cadence.core.intervals import check_interval
from cadence.core.protocols import Stateful
from cadence.engine.background import in_background, yield_cpu_to_training
from cadence.engine.checkpoint_io import (
    CheckpointIO,
    StateFileIO,
    read_checkpoint,
    save_with_digests,
)
from cadence.engine.distributed import any_rank, gather_on_rank_zero
from cadence.engine.module import DictState, Module, load_stateful
from cadence.engine.rank_state import (
    rank_file,
    rank_payload,
    read_rank_states,
    restore_rank_state,
    write_rank_state,
)
from cadence.engine.rng import capture_rng_state
from cadence.engine.sharded import (
    dcp_parts,
    load_sharded,
    own_shard_digests,
    save_sharded,
    save_sharded_async,
    sharded_names,
    sharded_reader,
    uses_dcp,
    verify_sharded_reads,
)
from cadence.engine.state_file import HostSnapshot, PackedState

__all__ = ["CheckpointIO", "CheckpointManager", "HostSnapshot", "StateFileIO", "read_checkpoint"]

logger = logging.getLogger("cadence")

_RESERVED = frozenset({"state"})


def _distributed() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class CheckpointManager:
    """Saves numbered checkpoints of `state` under `directory` and restores the newest.

    Args:
        state: a `Module` (the parts of its `checkpoint_items` are saved) or a dict of stateful
            objects (``{"model": model, "optimizer": optimizer}``).
        directory: where ``ckpt-<step>`` directories are written.
        max_to_keep: how many of the newest checkpoints to keep; None keeps all.
        checkpoint_interval: the Controller saves every this many steps, exactly on multiples;
            None: only at the end of training and on explicit saves.
        init_fn: called by `restore_or_initialize` when there is no checkpoint yet (e.g. to load
            pretrained weights).
        io: how payloads are written; defaults to `StateFileIO`.
        strict: restoring requires the checkpoint to hold exactly the state's objects. False
            ignores objects the checkpoint has but `state` does not track (an evaluation job
            restores only the model from a training checkpoint); missing ones are still errors.
        read_only: only read checkpoints: `save` raises, and leftovers of interrupted writes are
            not cleaned up (they may be a training job's write in progress).
        async_save: `save` returns once the state is copied into host buffers (reused from one
            save to the next); the files are written and committed in a background thread. A
            second save, a restore, or `wait` first waits for the pending write and raises its
            error. The commit stays atomic: a crash during the write leaves the previous
            checkpoint as the newest. In a distributed job, sharded state (FSDP2) is written
            in the background by ``torch.distributed.checkpoint.async_save`` and committed by
            rank 0 at the next `save`, `wait` or restore, once every rank's write is done; the
            rest of a distributed checkpoint is written synchronously. "Saved checkpoint ..."
            is logged once the commit is done.
        on_commit: called with the step and the path of each checkpoint once it is committed
            (durable), on the rank that commits it, from the thread that does (the run's
            timeline records it).
        writes: asked at each save whether this job writes it (the same answer on all its
            ranks); False: another job writes it -- the first live replica group of a
            fault-tolerant job -- and `save` only returns its path. None: always.
        writer: this job's name among several that write into `directory` (``"r1"`` for
            replica group 1): its staging directories carry it, and the leftovers it removes
            at start are its own (see `cadence.core.checkpoint_dir.CheckpointDirectory`).

    Raises:
        TypeError: if `state` is neither a Module nor a dict of stateful objects, or `init_fn`
            is not callable.
        ValueError: if `max_to_keep` or `checkpoint_interval` is not a positive int.
    """

    def __init__(
        self,
        state: Module | Mapping[str, Any],
        directory: str | os.PathLike[str],
        *,
        max_to_keep: int | None = DEFAULT_MAX_TO_KEEP,
        checkpoint_interval: int | None = None,
        init_fn: Callable[[], Any] | None = None,
        io: CheckpointIO | None = None,
        strict: bool = True,
        read_only: bool = False,
        async_save: bool = False,
        on_commit: Callable[[int, Path], None] | None = None,
        writes: Callable[[], bool] | None = None,
        writer: str = "",
    ) -> None:
        if isinstance(state, Module):
            self._state: Stateful = state
        elif isinstance(state, Mapping):
            self._state = DictState(state)
        else:
            raise TypeError(
                f"`state` (got {type(state).__name__}) must be a cadence.Module or a dict of "
                "stateful objects, e.g. {'model': model, 'optimizer': optimizer}."
            )
        if init_fn is not None and not callable(init_fn):
            raise TypeError(f"`init_fn` (got {type(init_fn).__name__}) must be callable or None.")
        self.checkpoint_interval = check_interval("checkpoint_interval", checkpoint_interval)
        self._directory = CheckpointDirectory(directory, max_to_keep, writer)
        self.init_fn = init_fn
        self.io: CheckpointIO = io or StateFileIO()
        self._tracked: dict[str, Stateful] = {}
        self.strict = strict
        self.read_only = read_only
        self.async_save = async_save
        self.on_commit = on_commit
        self.writes = writes
        self._snapshot = HostSnapshot()
        self._rank_snapshot = HostSnapshot()  # this rank's random state and data position
        self._pending: threading.Thread | None = None
        # a DCP write of this rank: (future, staging, step, world size, rank 0's digests)
        self._pending_commit: tuple[Any, Path, int, int, dict[str, str]] | None = None
        self._pending_error: BaseException | None = None
        self._pruning: Future[Any] | None = None
        """Rank 0 of a distributed job deletes old checkpoints in a thread (`wait` joins it)."""
        self.logs_saves = True
        """The manager logs "Saved checkpoint ..." itself, after the commit (the Controller
        does not log a save whose files may still be being written)."""
        if _distributed()[0] == 0 and not read_only:
            self._directory.remove_stale()

    @property
    def directory(self) -> Path:
        """The checkpoint directory."""
        return self._directory.directory

    @property
    def max_to_keep(self) -> int | None:
        return self._directory.max_to_keep

    @property
    def checkpoints(self) -> list[CheckpointInfo]:
        """The complete checkpoints on disk, oldest first."""
        return self._directory.checkpoints()

    @property
    def latest_checkpoint(self) -> str | None:
        """The path of the newest complete checkpoint, or None."""
        latest = self._directory.latest()
        return str(latest.path) if latest is not None else None

    def track(self, name: str, obj: Stateful) -> None:
        """Adds another stateful object to every checkpoint under `name` (the Controller tracks
        its callbacks this way).

        Raises:
            ValueError: if `name` is taken.
        """
        if name in _RESERVED or name in self._tracked:
            raise ValueError(f"`name` {name!r} is already tracked by this CheckpointManager.")
        self._tracked[name] = obj

    def save(self, step: int) -> str:
        """Saves a checkpoint numbered `step` and applies retention; returns its path.

        If a complete checkpoint of `step` exists already, it is kept and its path returned; an
        incomplete or damaged directory of that step is moved aside and the step saved anew.
        Every rank of a distributed job must call this; rank 0 writes the shared state, each
        rank its own random state and rank-local parts (``rank-<r>.cadence``: its data
        position), and under FSDP2 its shards. With `async_save` every rank only copies its
        part into host memory here; a thread writes it (DCP's for shards), and the checkpoint
        is committed at the next `wait` -- the next save, a restore, or the end of training.

        Raises:
            CheckpointError: if the manager is read-only, a previous background write failed,
                writing fails (a full disk: the message says what failed and which checkpoint
                is still the newest good one; nothing is committed then), or (distributed) the
                ranks do not all see the checkpoint directory.
        """
        if self.read_only:
            raise CheckpointError(
                f"This CheckpointManager of {str(self.directory)!r} is read-only (an evaluation "
                "job): it does not save."
            )
        if self.writes is not None and not self.writes():
            logger.debug("Checkpoint of step %d: another replica group writes it.", step)
            return str(self._directory.path_for(step))
        self.wait()
        final = self._directory.path_for(step)
        rank, world = _distributed()
        if final.is_dir():
            try:
                read_manifest(final)
                logger.info("Checkpoint %s exists already: kept.", final)
                return str(final)
            except CheckpointError:
                pass  # incomplete or damaged: the commit moves it aside
        items = self._items()
        sharded = dcp_parts(items) if uses_dcp(items) else {}  # FSDP2: every rank its shards
        payload = {
            "step": step,
            "state": ({name: obj.state_dict() for name, obj in items.items() if name not in sharded}
                      if sharded else self._state.state_dict()),
            "tracked": {name: obj.state_dict() for name, obj in self._tracked.items()},
        }
        rank_state = rank_payload(items, capture_rng_state())
        if world == 1 and self.async_save and not sharded:
            # The copy into host memory is the only part the training loop waits for. The
            # default writer writes the packed buffer as it is: the background thread then
            # holds the GIL for a few calls, whatever the number of tensors.
            copied = (self._snapshot.pack(payload) if isinstance(self.io, StateFileIO)
                      else self._snapshot.take(payload))
            own = self._rank_snapshot.pack(rank_state)
            self._pending = threading.Thread(
                target=self._write_in_background,
                args=(copied, own, step),
                name=f"cadence-checkpoint-{step}")
            self._pending.start()
            return str(final)
        if world == 1:
            self._write(payload, rank_state, step, sharded=sharded)
        else:
            staging = self._directory.temp_path(step, unique=False)
            if rank == 0:
                staging.mkdir(parents=True, exist_ok=True)
            dist.barrier()
            if any_rank(not staging.is_dir(), "checking the checkpoint directory"):
                raise CheckpointError(
                    f"Not every rank sees the checkpoint directory {str(self.directory)!r} "
                    f"(rank {rank} {'does not' if not staging.is_dir() else 'does'}): the ranks "
                    "of a job must share it. Put the run directory on a filesystem every node "
                    "mounts (NFS, Lustre, a shared volume)."
                )
            if self.async_save and not sharded:
                # As in one process: the training thread waits only for the copy into host
                # memory; this rank's files are written by a thread of its own, and committed
                # by the training thread at the next wait() (the commit is a collective).
                copied = ((self._snapshot.pack(payload) if isinstance(self.io, StateFileIO)
                           else self._snapshot.take(payload)) if rank == 0 else None)
                own = self._rank_snapshot.pack(rank_state)
                writing = in_background(f"cadence-checkpoint-{step}", self._write_files,
                                         copied, own, staging, rank)
                self._pending_commit = (writing, staging, step, world, {})
                return str(final)
            # Every rank's digests, computed while writing: the commit reads nothing back.
            checksums = self._write_files(payload if rank == 0 else None, rank_state, staging)
            if sharded and self.async_save:  # shards written by DCP's thread: commit later
                future = save_sharded_async(sharded, staging)
                self._pending_commit = (future, staging, step, world, checksums)
                return str(final)
            if sharded:
                save_sharded(sharded, staging)
            self._commit_distributed(staging, step, world, checksums)
        return str(final)

    def _write_files(self, payload: dict[str, Any] | PackedState | None,
                     rank_state: dict[str, Any] | PackedState, staging: Path,
                     rank: int | None = None) -> dict[str, str]:
        """Writes this rank's file of a distributed checkpoint (and, with `payload`, rank 0's
        shared state: `save_with_digests`) into `staging`; returns every file's SHA-256."""
        rank = _distributed()[0] if rank is None else rank
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
        rank = _distributed()[0]
        own = {**checksums, **own_shard_digests(staging, rank)}
        sizes = {}
        for name in own:  # each rank makes its own files durable, in parallel
            fsync_path(staging / name)
            sizes[name] = (staging / name).stat().st_size
        gathered = gather_on_rank_zero((own, sizes), "gathering the checkpoint's digests")
        if rank == 0:
            merged = {name: digest for digests, _ in gathered for name, digest in digests.items()}
            synced = {name: size for _, part in gathered for name, size in part.items()}
            final = self._directory.commit(staging, step, extra={"world_size": world},
                                           checksums=merged, synced=synced)
            logger.info("Saved checkpoint %s.", final)
            if self.on_commit is not None:
                self.on_commit(step, final)
        dist.barrier()
        if _distributed()[0] == 0:  # deletes thousands of files at scale: not in the way
            self._join_pruning()  # two prunes never overlap
            self._pruning = in_background(f"cadence-prune-{step}", self._prune)

    def _wait_for_the_ranks_writes(self) -> None:
        """Waits for this rank's background write (cadence's thread, or DCP's for shards);
        commits once every rank's is done, or discards the checkpoint on every rank when one
        failed (a collective, in the training thread)."""
        pending, self._pending_commit = self._pending_commit, None
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
            if _distributed()[0] == 0:
                shutil.rmtree(staging, ignore_errors=True)
            reason = str(error) if error is not None else "another rank's write failed"
            raise CheckpointError(self._failure(step, RuntimeError(reason), background=True))
        self._commit_distributed(staging, step, world, checksums)

    def _write(self, payload: dict[str, Any] | PackedState,
               rank_state: dict[str, Any] | PackedState, step: int, background: bool = False,
               sharded: dict[str, Any] | None = None) -> None:
        """Writes and commits the checkpoint of a single process, then applies retention."""
        staging = self._directory.temp_path(step)
        try:
            staging.mkdir(parents=True)
            checksums = dict(self.io.save(payload, staging) or {})  # type: ignore[arg-type]
            checksums[rank_file(staging, 0).name] = write_rank_state(rank_state, staging, 0)
            if sharded:
                save_sharded(sharded, staging)
            final = self._directory.commit(staging, step, checksums=checksums)
        except BaseException as error:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(error, (OSError, RuntimeError, TypeError, ValueError)):
                raise CheckpointError(self._failure(step, error, background)) from error
            raise
        logger.info("Saved checkpoint %s.", final)
        if self.on_commit is not None:
            self.on_commit(step, final)
        self._prune()

    def _failure(self, step: int, error: BaseException, background: bool) -> str:
        """What a failed write says: what failed, why, and what is still good."""
        what = "Writing a checkpoint in the background" if background else "Saving a checkpoint"
        reason = str(error).strip() or type(error).__name__
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            hint = (f"Free space on the disk of {str(self.directory)!r} (or lower max_to_keep), "
                    "then run again: training resumes from the newest good checkpoint.")
        else:
            hint = "Fix the cause, then run again: training resumes from the newest good one."
        latest = self._directory.latest()
        good = (f"the newest good checkpoint is still {latest.path} (step {latest.step})"
                if latest is not None else "there is no good checkpoint yet")
        return (f"{what} failed: {reason}. {self._directory.path_for(step).name} was not "
                f"committed; {good}. {hint}")

    def _prune(self) -> None:
        for deleted in self._directory.prune():
            logger.info("Deleted old checkpoint %s (max_to_keep=%s).", deleted,
                        self.max_to_keep)

    def _write_in_background(self, payload: dict[str, Any] | PackedState,
                             rank_state: PackedState, step: int) -> None:
        yield_cpu_to_training()
        try:
            self._write(payload, rank_state, step, background=True)
        except BaseException as error:  # handed to the training thread by wait()
            self._pending_error = error

    @property
    def writing(self) -> bool:
        """Whether a background write (``async_save``) is still running."""
        shards = self._pending_commit
        return ((self._pending is not None and self._pending.is_alive())
                or (shards is not None and not shards[0].done()))

    def abandon(self) -> None:
        """On a rank failing while the others may train on: waits for its own background work
        and drops an uncommitted distributed checkpoint without a commit's collectives (they
        would meet the others' training ones and hang the job until the collective timeout).
        The previous checkpoint stays the newest. In one process this is `wait`."""
        if _distributed()[1] == 1:
            self.wait()
            return
        pending, self._pending_commit = self._pending_commit, None
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
            CheckpointError: if the background write failed (the message names the newest
                good checkpoint, which is still the newest complete one).
        """
        self._wait_for_the_ranks_writes()
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.join()
        if retention:
            self._join_pruning()
        error, self._pending_error = self._pending_error, None
        if isinstance(error, CheckpointError):
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

    def restore(self, path: str | os.PathLike[str]) -> int:
        """Restores the checkpoint at `path`; returns its step.

        Everything this rank reads is verified (sizes and SHA-256 checksums) before anything
        is loaded, and the ranks agree that every one of them could (else none loads).

        Raises:
            CheckpointError: if `path` is not a complete cadence checkpoint, or a file is
                damaged, unreadable or holds anything but tensors and plain values.
            CheckpointMismatchError: if the checkpoint does not fit the tracked objects; the
                message names it and lists every difference. Nothing is loaded in that case.
        """
        self.wait()
        path = Path(path)
        damage: CheckpointError | None = None
        items = self._items()
        try:  # each rank verifies what it reads: the payload, its rank files, its shards
            manifest, payload = read_checkpoint(path, self.io)
            saved_world = int(manifest.get("world_size", 1))
            rank_states = read_rank_states(path, manifest, saved_world)
            shards = sharded_reader(path, manifest)  # written through DCP: loaded resharded
            in_shards = sharded_names(shards) & set(items)
            parts = dcp_parts({n: o for n, o in items.items() if n in in_shards})
            verify_sharded_reads(parts, shards)
        except CheckpointError as error:
            damage = error
        # Every rank takes this checkpoint, or none does: a rank alone going on to an older
        # one would wait for the others in the first collective of its load.
        if any_rank(damage is not None, "agreeing that a checkpoint is readable"):
            raise damage or CheckpointError(
                f"Checkpoint {str(path)!r} is damaged: another rank could not read or verify "
                "its part (see that rank's log). Restore an older checkpoint instead.")
        state = payload["state"]
        if not self.strict:
            state = {name: value for name, value in state.items() if name in items}
        try:
            load_stateful({n: o for n, o in items.items() if n not in in_shards}, state,
                          type(self._state).__name__ if isinstance(self._state, Module)
                          else "state")
        except CheckpointMismatchError as error:
            raise CheckpointMismatchError(f"Checkpoint {str(path)!r} does not fit: {error}") \
                from None
        if in_shards:
            missing = sorted(in_shards - set(parts))
            if missing:
                raise CheckpointMismatchError(
                    f"{str(path)!r} holds sharded state for {missing}, which is not a model or "
                    "an optimizer here.")
            load_sharded(parts, shards)
        for name, obj in self._tracked.items():
            if name in payload["tracked"]:
                obj.load_state_dict(payload["tracked"][name])
            else:
                logger.warning("Checkpoint %s has no state for %r: it starts fresh.", path, name)
        said = restore_rank_state(path, items, saved_world, rank_states)
        rank, world = _distributed()
        if saved_world != world and rank == 0:
            weights = ("the model and optimizer are resharded from their shards (DCP)"
                       if in_shards else "the model and optimizer are loaded whole on every "
                       "rank")
            logger.warning("Resuming checkpoint %s, written by %d process%s, with %d: %s.",
                           path.name, saved_world, "es" if saved_world > 1 else "", world,
                           "; ".join([weights, *said]))
        return int(manifest["step"])

    def _items(self) -> dict[str, Any]:
        """The stateful parts of `state`, by name."""
        if isinstance(self._state, Module):
            return self._state.checkpoint_items()
        return self._state.objects  # type: ignore[attr-defined]

    def restore_or_initialize(self) -> str | None:
        """Restores the newest good checkpoint; with none on disk, calls `init_fn`.

        A newer checkpoint that is damaged (truncated, changed bytes, unreadable, not cadence's)
        or does not fit the state (another model's) is skipped with a warning naming the
        problem; a manager that is not read-only moves it aside (renamed
        ``ckpt-<step>.damaged-<time>``, kept) so that its step can be saved again.

        Returns:
            The restored path, or None when `init_fn` ran (or there was nothing to do).

        A sound checkpoint that this job cannot continue from (`CheckpointIncompatibleError`:
        another number of processes where its data position cannot be dealt) stops the job
        instead: it is left where and as it was, and no older checkpoint is restored in its
        place -- a refusal is never a rollback.

        Raises:
            CheckpointIncompatibleError: as just said.
            CheckpointError: if there are checkpoints and none of them is good; the message
                lists what is wrong with each. Nothing is moved then.
            CheckpointMismatchError: the same, when the newest does not fit the state.
        """
        self.wait()
        candidates = self._directory.checkpoints()
        if not candidates:
            if self.init_fn is not None:
                self.init_fn()
            return None
        skipped: list[tuple[CheckpointInfo, CheckpointError]] = []
        for info in reversed(candidates):
            try:
                self.restore(info.path)
            except CheckpointIncompatibleError:
                raise  # sound, but not for this job: stop, move nothing, never roll back
            except CheckpointError as error:
                skipped.append((info, error))
                continue
            for bad, why in skipped:
                self._set_aside(bad, why, info)
            return str(info.path)
        first = skipped[0][1]
        if len(skipped) == 1:
            raise first
        listing = "\n  ".join(f"{info.path.name}: {error}" for info, error in skipped)
        error_type = (CheckpointMismatchError if isinstance(first, CheckpointMismatchError)
                      else CheckpointError)
        raise error_type(
            f"No checkpoint in {str(self.directory)!r} can be restored:\n  {listing}\nMove "
            "them away to start afresh, or use the model definition they were written with."
        )

    def _set_aside(self, bad: CheckpointInfo, why: CheckpointError,
                   restored: CheckpointInfo) -> None:
        reason = " ".join(line.strip().removeprefix("- ") for line in str(why).splitlines())
        if self.read_only or _distributed()[0] != 0:
            logger.warning("Skipped checkpoint %s: %s Restored %s (step %d) instead.", bad.path,
                           reason, restored.path, restored.step)
            return
        moved = self._directory.move_aside(bad.path, reason)
        logger.warning("Checkpoint %s is not usable: %s Moved it aside to %s (kept) and "
                       "restored %s (step %d) instead.", bad.path, reason, moved.name,
                       restored.path, restored.step)
