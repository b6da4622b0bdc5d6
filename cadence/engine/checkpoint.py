"""`CheckpointManager`: saves and restores everything needed to continue a run exactly.

A checkpoint holds the state of every tracked object (a `Module` contributes the parts it
declares in `Module.checkpoint_items`: models, optimizers, schedulers, scalers, a runner's step
counter and data position), the
states of the random number generators of every rank, and, when a Controller drives it, the
callbacks' and the Controller's own state.

Files are committed atomically by `cadence.core.checkpoint_dir.CheckpointDirectory` and read
with ``torch.load(weights_only=True)``: loading never unpickles arbitrary objects. The bytes go
through a small `CheckpointIO` interface, so a sharded writer (``torch.distributed.checkpoint``)
can replace the default one without changing callers.
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from cadence.core.checkpoint_dir import (
    DEFAULT_MAX_TO_KEEP,
    CheckpointDirectory,
    CheckpointInfo,
    read_manifest,
)
from cadence.core.errors import CheckpointError, CheckpointMismatchError
from cadence.core.intervals import check_interval
from cadence.core.protocols import Stateful, is_stateful
from cadence.engine.distributed import any_rank
from cadence.engine.module import Module, load_stateful
from cadence.engine.rank_state import rank_file, rank_payload, restore_rank_state
from cadence.engine.rng import capture_rng_state
from cadence.engine.sharded import dcp_parts, load_sharded, save_sharded, sharded_names, uses_dcp

logger = logging.getLogger("cadence")

_RESERVED = frozenset({"state"})


class CheckpointIO(Protocol):
    """Writes and reads the payload of one checkpoint inside its (staging) directory."""

    def save(self, payload: dict[str, Any], directory: Path) -> None: ...

    def load(self, directory: Path) -> dict[str, Any]: ...


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{str(path)!r} holds objects other than tensors and plain values; cadence loads "
            "checkpoints with weights_only=True and never unpickles arbitrary objects. Make "
            f"state_dict() return tensors, numbers, strings, lists and dicts. ({error})"
        ) from error
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise CheckpointError(
            f"Cannot read {str(path)!r}: {error}. The file is corrupt; restore an older "
            "checkpoint instead."
        ) from error


class TorchSaveIO:
    """The default `CheckpointIO`: one ``state.pt`` written by ``torch.save``."""

    filename = "state.pt"

    def save(self, payload: dict[str, Any], directory: Path) -> None:
        torch.save(payload, directory / self.filename)

    def load(self, directory: Path) -> dict[str, Any]:
        payload = _torch_load(directory / self.filename)
        if not isinstance(payload, dict):
            raise CheckpointError(f"{str(directory)!r} does not hold a cadence checkpoint payload.")
        return payload


class HostSnapshot:
    """Copies the tensors of a (nested) state into host buffers that are reused from one
    snapshot to the next when shapes and dtypes match: the copy is the whole stall of an
    asynchronous save. On CUDA the buffers are pinned, so the copy runs at full bandwidth."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, value: Any, path: str = "") -> Any:
        """A copy of `value` whose tensors live in this snapshot's buffers."""
        if isinstance(value, torch.Tensor):
            source = value.detach()
            buffer = self._buffers.get(path)
            if (buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype
                    or buffer.layout != source.layout):
                buffer = torch.empty(source.shape, dtype=source.dtype, device="cpu",
                                     pin_memory=source.is_cuda)
                self._buffers[path] = buffer
            buffer.copy_(source, non_blocking=source.is_cuda)
            if source.is_cuda:
                torch.cuda.current_stream(source.device).synchronize()
            return buffer
        if isinstance(value, dict):
            return {k: self.take(v, f"{path}/{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self.take(v, f"{path}/{i}") for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return copy.deepcopy(value)


class _DictState:
    """A dict of stateful objects, saved and loaded as one."""

    def __init__(self, objects: Mapping[str, Any]) -> None:
        for name, obj in objects.items():
            if not is_stateful(obj):
                raise TypeError(
                    f"state[{name!r}] (got {type(obj).__name__}) has no state_dict() and "
                    "load_state_dict(); pass modules, optimizers, schedulers or other stateful "
                    "objects."
                )
        self.objects = dict(objects)

    def state_dict(self) -> dict[str, Any]:
        return {name: obj.state_dict() for name, obj in self.objects.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        load_stateful(self.objects, state_dict, "state")


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
        io: how payloads are written; defaults to `TorchSaveIO`.
        strict: restoring requires the checkpoint to hold exactly the state's objects. False
            ignores objects the checkpoint has but `state` does not track (an evaluation job
            restores only the model from a training checkpoint); missing ones are still errors.
        read_only: only read checkpoints: `save` raises, and leftovers of interrupted writes are
            not cleaned up (they may be a training job's write in progress).
        async_save: `save` returns once the state is copied into host buffers (reused from one
            save to the next); the files are written and committed in a background thread. A
            second save, a restore, or `wait` first waits for the pending write and raises its
            error. The commit stays atomic: a crash during the write leaves the previous
            checkpoint as the newest. Single-process jobs only (a distributed job saves
            synchronously).

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
    ) -> None:
        if isinstance(state, Module):
            self._state: Stateful = state
        elif isinstance(state, Mapping):
            self._state = _DictState(state)
        else:
            raise TypeError(
                f"`state` (got {type(state).__name__}) must be a cadence.Module or a dict of "
                "stateful objects, e.g. {'model': model, 'optimizer': optimizer}."
            )
        if init_fn is not None and not callable(init_fn):
            raise TypeError(f"`init_fn` (got {type(init_fn).__name__}) must be callable or None.")
        self.checkpoint_interval = check_interval("checkpoint_interval", checkpoint_interval)
        self._directory = CheckpointDirectory(directory, max_to_keep)
        self.init_fn = init_fn
        self.io: CheckpointIO = io or TorchSaveIO()
        self._tracked: dict[str, Stateful] = {}
        self.strict = strict
        self.read_only = read_only
        self.async_save = async_save
        self._snapshot = HostSnapshot()
        self._pending: threading.Thread | None = None
        self._pending_error: BaseException | None = None
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

        If a complete checkpoint of `step` exists already, it is kept and its path returned.
        Every rank of a distributed job must call this; rank 0 writes the shared state, each rank
        its own random state and rank-local parts (``rank-<r>.pt``: its data position).

        Raises:
            CheckpointError: read-only, or (distributed) a checkpoint directory that the ranks do
                not all see.
        """
        if self.read_only:
            raise CheckpointError(
                f"This CheckpointManager of {str(self.directory)!r} is read-only (an evaluation "
                "job): it does not save."
            )
        self.wait()
        final = self._directory.path_for(step)
        rank, world = _distributed()
        if final.is_dir():
            try:
                read_manifest(final)
                return str(final)
            except CheckpointError:
                pass  # an unreadable leftover of another run: written anew below
        items = self._items()
        sharded = dcp_parts(items) if uses_dcp(items) else {}  # FSDP2: every rank its shards
        payload = {
            "step": step,
            "state": ({name: obj.state_dict() for name, obj in items.items() if name not in sharded}
                      if sharded else self._state.state_dict()),
            "tracked": {name: obj.state_dict() for name, obj in self._tracked.items()},
        }
        rng = rank_payload(items, capture_rng_state())
        if world == 1 and self.async_save and not sharded:
            payload = self._snapshot.take(payload)  # the only part the training loop waits for
            rng = self._snapshot.take(rng, "rank")
            self._pending = threading.Thread(target=self._write_in_background,
                                             args=(payload, rng, step),
                                             name=f"cadence-checkpoint-{step}")
            self._pending.start()
            return str(final)
        if world == 1:
            self._write(payload, rng, step, sharded)
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
            torch.save(rng, rank_file(staging, rank))
            if sharded:
                save_sharded(sharded, staging)
            if rank == 0:
                self.io.save(payload, staging)
            dist.barrier()
            if rank == 0:
                self._directory.commit(staging, step, extra={"world_size": world})
            dist.barrier()
            if rank == 0:
                self._prune()
        return str(final)

    def _write(self, payload: dict[str, Any], rng: dict[str, Any], step: int,
               sharded: dict[str, Any] | None = None) -> None:
        """Writes and commits the checkpoint of a single process, then applies retention."""
        with self._directory.staging(step) as staging:
            self.io.save(payload, staging)
            torch.save(rng, rank_file(staging, 0))
            if sharded:
                save_sharded(sharded, staging)
        self._prune()

    def _prune(self) -> None:
        for deleted in self._directory.prune():
            logger.info("Deleted old checkpoint %s (max_to_keep=%s).", deleted,
                        self.max_to_keep)

    def _write_in_background(self, payload: dict[str, Any], rng: dict[str, Any],
                             step: int) -> None:
        try:
            self._write(payload, rng, step)
        except BaseException as error:  # handed to the training thread by wait()
            self._pending_error = error

    @property
    def writing(self) -> bool:
        """Whether a background write (``async_save``) is still running."""
        return self._pending is not None and self._pending.is_alive()

    def wait(self) -> None:
        """Waits for a background write to be committed.

        Raises:
            CheckpointError: if the background write failed (the previous checkpoint is still
                the newest complete one).
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.join()
        error, self._pending_error = self._pending_error, None
        if error is not None:
            raise CheckpointError(
                f"Writing a checkpoint in the background failed: {error}. The previous "
                "checkpoint is still the newest complete one.") from error

    def restore(self, path: str | os.PathLike[str]) -> int:
        """Restores the checkpoint at `path`; returns its step.

        Raises:
            CheckpointError: if `path` is not a complete cadence checkpoint, or a file is
                corrupt or holds anything but tensors and plain values.
            CheckpointMismatchError: if the checkpoint does not fit the tracked objects; the
                message lists every difference. Nothing is loaded in that case.
        """
        self.wait()
        path = Path(path)
        manifest = read_manifest(path)
        payload = self.io.load(path)
        for key in ("state", "tracked"):
            if not isinstance(payload.get(key), dict):
                raise CheckpointError(f"{str(path)!r} has no {key!r} section: not a cadence "
                                      "checkpoint, or written by an incompatible version.")
        state = payload["state"]
        items = self._items()
        if not self.strict:
            state = {name: value for name, value in state.items() if name in items}
        in_shards = sharded_names(path) & set(items)  # written through DCP: loaded resharded
        load_stateful({n: o for n, o in items.items() if n not in in_shards}, state,
                      type(self._state).__name__ if isinstance(self._state, Module) else "state")
        if in_shards:
            parts = dcp_parts({n: o for n, o in items.items() if n in in_shards})
            missing = sorted(in_shards - set(parts))
            if missing:
                raise CheckpointMismatchError(
                    f"{str(path)!r} holds sharded state for {missing}, which is not a model or "
                    "an optimizer here.")
            load_sharded(parts, path)
        for name, obj in self._tracked.items():
            if name in payload["tracked"]:
                obj.load_state_dict(payload["tracked"][name])
            else:
                logger.warning("Checkpoint %s has no state for %r: it starts fresh.", path, name)
        restore_rank_state(path, self._items(), int(manifest.get("world_size", 1)),
                           _torch_load)
        return int(manifest["step"])

    def _items(self) -> dict[str, Any]:
        """The stateful parts of `state`, by name."""
        if isinstance(self._state, Module):
            return self._state.checkpoint_items()
        return self._state.objects  # type: ignore[attr-defined]

    def restore_or_initialize(self) -> str | None:
        """Restores the newest complete checkpoint; with none, calls `init_fn`.

        Returns:
            The restored path, or None when `init_fn` ran (or there was nothing to do).
        """
        self.wait()
        latest = self._directory.latest()
        if latest is None:
            if self.init_fn is not None:
                self.init_fn()
            return None
        self.restore(latest.path)
        return str(latest.path)
