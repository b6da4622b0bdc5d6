"""What each rank of a job saves for itself: its random state and its rank-local parts.

Most of a checkpoint is the same on every rank (the model and optimizer of data-parallel
training) and rank 0 writes it once. Some state differs per rank: the random number generators,
and the parts that declare ``rank_local = True`` -- the position in the training data, whose
shard is the rank's own. Every rank writes those to ``rank-<r>.cadence`` (a state file: no
pickle, its SHA-256 in the manifest, checked as it is read).

On restore at the same world size each rank takes its own file back: resume is exact, mid-pass
too. At another world size, each rank-local part with a ``load_resharded(states, rank,
world_size)`` method rebuilds its state from the old ranks' (the data position covers the
rest of the pass with the new ranks, or refuses in words); random states are taken from the old
rank of the same number where there is one, else from rank 0.

At another world size a rank reads one old file -- the one its random state comes from: the
old rank of its number, else rank 0 -- when every rank-local state in that file says it is
enough alone (it holds ``reshards_alone``, the number of data shards that saved it: a data
position at a pass boundary, or in a shard of one global order, `DataIterator.state_dict`);
``load_resharded`` is then given that one state. Otherwise (a metric's states, which are merged,
a loader's own state, a data order saved per rank) it reads one file per old data shard.

**Layouts.** Rank-local parts are positions in the data, whose shard is a *data* shard: tensor-
and pipeline-parallel peers read the same batches and save the same position. A checkpoint's
manifest records the layout it was written at (the runtime's degrees; a checkpoint without one
was written by data parallelism alone). At the same layout each rank takes its own file back;
at another -- other degrees, even at the same world size -- the positions are resharded over the
data coordinate: ``load_resharded(states, dp_rank, dp_size)`` with one state per old data shard
(the file of its lowest rank), the same rule that other world sizes follow.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from cadence.core.errors import CheckpointError, CheckpointIncompatibleError
from cadence.core.rank import data_rank, data_size, process_rank, world_size
from cadence.engine.checkpoint_io import read_state_file
from cadence.engine.rng import restore_rng_state
from cadence.engine.runtime import DIMENSIONS, ParallelDims, current_runtime, data_parallel_dims
from cadence.engine.state_file import PackedState, write_state

logger = logging.getLogger("cadence")


def rank_file(directory: Path, rank: int) -> Path:
    """The file rank `rank` writes in a checkpoint directory."""
    return directory / f"rank-{rank}.cadence"


def is_rank_local(obj: Any) -> bool:
    """Whether a stateful part's state is this rank's own (it says ``rank_local = True``)."""
    return bool(getattr(obj, "rank_local", False))


def rank_payload(items: dict[str, Any], rng: dict[str, Any]) -> dict[str, Any]:
    """This rank's file: its random state and the state of its rank-local parts."""
    return {"rank": process_rank(), "world_size": world_size(), "dp_rank": data_rank(),
            "dp_size": data_size(), "rng": rng,
            "state": {name: obj.state_dict() for name, obj in items.items()
                      if is_rank_local(obj)}}


def saved_layout(manifest: dict[str, Any], saved_world: int) -> ParallelDims:
    """The layout a checkpoint was written at: its manifest's degrees, else -- a checkpoint of
    data parallelism alone, or from before layouts were recorded -- every process a data
    shard."""
    degrees = manifest.get("layout")
    if isinstance(degrees, dict):
        try:
            dims = ParallelDims(**{name: int(degrees.get(name, 1)) for name in DIMENSIONS})
        except (TypeError, ValueError):
            dims = None
        if dims is not None and dims.world_size == saved_world:
            return dims
    return data_parallel_dims(saved_world, "none")


def _same_layout(saved: ParallelDims) -> bool:
    """Whether this job's layout is the one `saved` was written at (then every rank takes its
    own file back). Only the data coordinate matters to the positions: a layout with the same
    data shards, each read by the same ranks, is the same."""
    dims = current_runtime().dims
    if saved.world_size != dims.world_size or saved.dp_size != dims.dp_size:
        return False
    return all(saved.dp_rank(rank) == dims.dp_rank(rank) for rank in range(dims.world_size))


def write_rank_state(payload: dict[str, Any] | PackedState, directory: Path, rank: int) -> str:
    """Writes rank `rank`'s file into `directory`; returns its SHA-256."""
    return write_state(payload, rank_file(directory, rank))


def _read(directory: Path, rank: int, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """Rank `rank`'s file, verified against the manifest; None when there is none.

    Only ``rank-<r>.cadence`` is read: the per-rank files of earlier versions (``rank-<r>.pt``,
    ``rng-<r>.cadence``, ``rng-<r>.pt``) went with issue 30, no saved checkpoint in the tests
    needing them (``tests/fixtures/state_format_1`` has ``rank-0.cadence``)."""
    path = rank_file(directory, rank)
    if path.name not in manifest.get("files", {}) or not path.is_file():
        return None  # a file the manifest does not list was not written with the checkpoint
    payload = read_state_file(path, manifest.get("sha256", {}).get(path.name))
    if (not isinstance(payload, dict) or not isinstance(payload.get("rng"), dict)
            or not isinstance(payload.get("state"), dict)):
        raise CheckpointError(f"{str(path)!r} is not a cadence rank file: the checkpoint is "
                              "damaged or not cadence's.")
    return payload


def read_rank_states(directory: Path, manifest: dict[str, Any],
                     saved_world: int) -> list[dict[str, Any] | None]:
    """The rank files `restore_rank_state` needs, read and verified before anything is loaded:
    at the same world size this rank's own; at another, the file of the old rank of this
    rank's number (else rank 0's) alone where its rank-local states say that is enough (see
    the module docstring), else every old rank's (None where missing).

    Raises:
        CheckpointError: a file is damaged or not cadence's.
    """
    rank = process_rank()
    saved = saved_layout(manifest, saved_world)
    if _same_layout(saved):
        return [_read(directory, rank, manifest)]
    first = rank if rank < saved_world else 0
    own = _read(directory, first, manifest)
    if own is not None and all(isinstance(state, dict) and state.get("reshards_alone")
                               for state in own["state"].values()):
        return [own]
    # one file per old data shard (its lowest rank's): its peers saved the same position
    return [own if r == first else _read(directory, r, manifest)
            for r in (saved.ranks_of_data_shard(shard)[0] for shard in range(saved.dp_size))]


def _restore_rng(directory: Path, rng: dict[str, Any]) -> None:
    try:
        restore_rng_state(rng)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
        raise CheckpointError(f"The random state in {str(directory)!r} is damaged ({error}); "
                              "the weights were restored, the random state was not.") from error


def _file_of(files: list[dict[str, Any] | None], rank: int) -> dict[str, Any] | None:
    """The file `rank` wrote, among those read."""
    return next((f for f in files if f is not None and f.get("rank") == rank), None)


def restore_rank_state(directory: Path, items: dict[str, Any], saved_world: int,
                       files: list[dict[str, Any] | None],
                       manifest: dict[str, Any]) -> list[str]:
    """Gives this rank its random state and rank-local parts back from checkpoint `directory`
    (written by `saved_world` processes), out of the `files` that `read_rank_states` read.

    Returns:
        At another world size, what happened, in phrases for the one line the caller logs
        (how each rank-local part was resharded; where the random states came from); else
        nothing.

    Raises:
        CheckpointError: when a rank-local part cannot be resharded to this world size, or a
            rank file is missing at the same world size.
    """
    rank, world = process_rank(), world_size()
    local = {name: obj for name, obj in items.items() if is_rank_local(obj)}
    saved_dims = saved_layout(manifest, saved_world)
    if _same_layout(saved_dims):
        own = files[0]
        if own is None:
            raise CheckpointError(f"Checkpoint {str(directory)!r} has no file for rank {rank} "
                                  f"(it was written by {saved_world} processes): it is "
                                  "incomplete; restore an older one.")
        for name, obj in local.items():
            if name in own["state"]:
                obj.load_state_dict(own["state"][name])
        _restore_rng(directory, own["rng"])
        return []
    states = files
    said: list[str] = []
    alone = len(states) < saved_dims.dp_size  # the one file of the old rank of this number
    own = (states[0] if alone else _file_of(states, rank)) if rank < saved_world else None
    if any(state is None for state in states):
        raise CheckpointError(f"Checkpoint {str(directory)!r} lacks the files of some of its "
                              f"{saved_world} ranks: it is incomplete; restore an older one.")
    for name, obj in local.items():
        reshard = getattr(obj, "load_resharded", None)
        saved = [state["state"].get(name) for state in states if state is not None]
        if reshard is None or any(s is None for s in saved):
            raise CheckpointIncompatibleError(
                f"Checkpoint {str(directory)!r} was written at {saved_dims.describe()} "
                f"({saved_world} processes) and this job is {current_runtime().dims.describe()} "
                f"({world}): {name!r} cannot be resharded. Resume at the same layout.")
        said.append(str(reshard(saved, data_rank(), data_size())).rstrip("."))
    if world > saved_world:
        said.append(f"ranks {saved_world} to {world - 1} take rank 0's random state, offset by "
                    "their rank" if world - saved_world > 1 else
                    f"rank {saved_world} takes rank 0's random state, offset by its rank")
    source = own if own is not None else states[0]
    assert source is not None
    _restore_rng(directory, source["rng"])
    if own is None:
        torch.manual_seed(int(torch.randint(0, 2**62, ())) + rank)
    return said
