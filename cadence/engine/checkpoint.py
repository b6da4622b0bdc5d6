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

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cadence.core.checkpoint_dir import (
    DEFAULT_MAX_TO_KEEP,
    CheckpointDirectory,
    CheckpointInfo,
    read_manifest,
)
from cadence.core.errors import (
    CheckpointError,
    CheckpointIncompatibleError,
    CheckpointMismatchError,
)
from cadence.core.intervals import check_interval
from cadence.core.protocols import Stateful, is_stateful
from cadence.engine.checkpoint_io import (
    CheckpointIO,
    StateFileIO,
    read_checkpoint,
)
from cadence.engine.checkpoint_writer import CheckpointWriter, distributed
from cadence.engine.distributed import any_rank
from cadence.engine.external_metrics import checkpoint_part
from cadence.engine.module import Module, load_stateful
from cadence.engine.rank_state import (
    rank_payload,
    read_rank_states,
    restore_rank_state,
    saved_layout,
)
from cadence.engine.rng import capture_rng_state
from cadence.engine.runtime import current_runtime
from cadence.engine.sharded import (
    dcp_parts,
    load_sharded,
    sharded_names,
    sharded_reader,
    uses_dcp,
    verify_sharded_reads,
)
from cadence.engine.state_file import HostSnapshot

__all__ = ["CheckpointIO", "CheckpointManager", "HostSnapshot", "StateFileIO", "read_checkpoint"]

logger = logging.getLogger("cadence")

_RESERVED = frozenset({"state"})


class DictState:
    """A dict of stateful objects, saved and loaded as one (what a `CheckpointManager` of
    ``{"model": model, "optimizer": optimizer}`` saves)."""

    def __init__(self, objects: Mapping[str, Any]) -> None:
        for name, obj in objects.items():
            if not is_stateful(obj):
                raise TypeError(
                    f"state[{name!r}] (got {type(obj).__name__}) has no state_dict() and "
                    "load_state_dict(); pass modules, optimizers, schedulers or other stateful "
                    "objects."
                )
        # A torchmetrics metric is saved with its states (see cadence.engine.external_metrics).
        self.objects = {name: checkpoint_part(obj) for name, obj in objects.items()}

    def state_dict(self) -> dict[str, Any]:
        return {name: obj.state_dict() for name, obj in self.objects.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        load_stateful(self.objects, state_dict, "state")



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
        self.writes = writes
        self.writer = CheckpointWriter(self._directory, self.io, async_save, on_commit)
        """How the checkpoints are written and committed (`cadence.engine.checkpoint_writer`)."""
        self.logs_saves = True
        """The manager logs "Saved checkpoint ..." itself, after the commit (the Controller
        does not log a save whose files may still be being written)."""
        if distributed()[0] == 0 and not read_only:
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
            StorageError: if the machine fails the write -- a full disk, a read-only file
                system -- now or in a previous background write: the message says what failed
                and which checkpoint is still the newest good one; nothing is committed then.
            CheckpointError: if the manager is read-only, a write fails otherwise (the
                message says the same), or (distributed) the ranks do not all see the
                checkpoint directory.
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
        if self._saved_already(final):
            return str(final)
        items = self._items()
        sharded = dcp_parts(items) if uses_dcp(items) else {}  # FSDP2: every rank its shards
        payload = {
            "step": step,
            "state": ({name: obj.state_dict() for name, obj in items.items() if name not in sharded}
                      if sharded else self._state.state_dict()),
            "tracked": {name: obj.state_dict() for name, obj in self._tracked.items()},
        }
        self.writer.write(step, payload, rank_payload(items, capture_rng_state()), sharded)
        return str(final)

    def _saved_already(self, final: Path) -> bool:
        """Whether a complete checkpoint is at `final` (kept: the step is not saved again); an
        incomplete or damaged one is not -- the commit moves it aside."""
        if not final.is_dir():
            return False
        try:
            read_manifest(final)
        except CheckpointError:
            return False
        logger.info("Checkpoint %s exists already: kept.", final)
        return True

    @property
    def on_commit(self) -> Callable[[int, Path], None] | None:
        """Called with the step and the path of each checkpoint once it is committed."""
        return self.writer.on_commit

    @on_commit.setter
    def on_commit(self, callback: Callable[[int, Path], None] | None) -> None:
        self.writer.on_commit = callback

    @property
    def writing(self) -> bool:
        """Whether a background write (``async_save``) is still running."""
        return self.writer.writing

    def abandon(self) -> None:
        """On a rank failing while the others may train on: waits for its own background work
        and drops an uncommitted distributed checkpoint without a commit's collectives (they
        would meet the others' training ones and hang the job until the collective timeout).
        The previous checkpoint stays the newest. In one process this is `wait`."""
        self.writer.abandon()

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
        self.writer.wait(retention)

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
        said = restore_rank_state(path, items, saved_world, rank_states, manifest)
        rank, world = distributed()
        saved, now = saved_layout(manifest, saved_world), current_runtime().dims
        if (saved_world != world or saved != now) and rank == 0:
            weights = ("the model and optimizer are resharded from their shards (DCP)"
                       if in_shards else "the model and optimizer are loaded whole on every "
                       "rank")
            logger.warning("Resuming checkpoint %s, written at %s (%d process%s), at %s (%d): "
                           "%s.", path.name, saved.describe(), saved_world,
                           "es" if saved_world > 1 else "", now.describe(), world,
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
        if self.read_only or distributed()[0] != 0:
            logger.warning("Skipped checkpoint %s: %s Restored %s (step %d) instead.", bad.path,
                           reason, restored.path, restored.step)
            return
        moved = self._directory.move_aside(bad.path, reason)
        logger.warning("Checkpoint %s is not usable: %s Moved it aside to %s (kept) and "
                       "restored %s (step %d) instead.", bad.path, reason, moved.name,
                       restored.path, restored.step)
