"""What each rank of a job saves for itself: its random state and its rank-local parts.

Most of a checkpoint is the same on every rank (the model and optimizer of data-parallel
training) and rank 0 writes it once. Some state differs per rank: the random number generators,
and the parts that declare ``rank_local = True`` -- the position in the training data, whose
shard is the rank's own. Every rank writes those to ``rank-<r>.pt``.

On restore at the same world size each rank takes its own file back: resume is exact, mid-pass
too. At another world size, each rank-local part with a ``load_resharded(states, rank,
world_size)`` method rebuilds its state from every old rank's (the data position covers the
rest of the pass with the new ranks, or refuses in words); random states are taken from the old
rank of the same number where there is one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from cadence.core.errors import CheckpointError
from cadence.core.rank import process_rank, world_size
from cadence.engine.rng import restore_rng_state

logger = logging.getLogger("cadence")


def rank_file(directory: Path, rank: int) -> Path:
    """The file rank `rank` writes in a checkpoint directory."""
    return directory / f"rank-{rank}.pt"


def is_rank_local(obj: Any) -> bool:
    """Whether a stateful part's state is this rank's own (it says ``rank_local = True``)."""
    return bool(getattr(obj, "rank_local", False))


def rank_payload(items: dict[str, Any], rng: dict[str, Any]) -> dict[str, Any]:
    """This rank's file: its random state and the state of its rank-local parts."""
    return {"rank": process_rank(), "world_size": world_size(), "rng": rng,
            "state": {name: obj.state_dict() for name, obj in items.items()
                      if is_rank_local(obj)}}


def _read(path: Path, load: Any) -> dict[str, Any] | None:
    if path.is_file():
        payload = load(path)
        if not isinstance(payload, dict):
            raise CheckpointError(f"{str(path)!r} is not a cadence rank file.")
        return payload
    legacy = path.with_name(path.name.replace("rank-", "rng-"))  # written before rank files
    if legacy.is_file():
        return {"rng": load(legacy), "state": {}}
    return None


def restore_rank_state(directory: Path, items: dict[str, Any], saved_world: int,
                       load: Any) -> None:
    """Gives this rank its random state and rank-local parts back from checkpoint `directory`
    (written by `saved_world` processes); `load` reads a file safely.

    Raises:
        CheckpointError: when a rank-local part cannot be resharded to this world size, or a
            rank file is missing at the same world size.
    """
    rank, world = process_rank(), world_size()
    local = {name: obj for name, obj in items.items() if is_rank_local(obj)}
    own = _read(rank_file(directory, rank), load) if rank < saved_world else None
    if saved_world == world:
        if own is None:
            raise CheckpointError(f"Checkpoint {str(directory)!r} has no file for rank {rank} "
                                  f"(it was written by {saved_world} processes): it is "
                                  "incomplete; restore an older one.")
        for name, obj in local.items():
            if name in own["state"]:
                obj.load_state_dict(own["state"][name])
        restore_rng_state(own["rng"])
        return
    states = [_read(rank_file(directory, r), load) for r in range(saved_world)]
    if any(state is None for state in states):
        raise CheckpointError(f"Checkpoint {str(directory)!r} lacks the files of some of its "
                              f"{saved_world} ranks: it is incomplete; restore an older one.")
    for name, obj in local.items():
        reshard = getattr(obj, "load_resharded", None)
        saved = [state["state"].get(name) for state in states if state is not None]
        if reshard is None or any(s is None for s in saved):
            raise CheckpointError(
                f"Checkpoint {str(directory)!r} was written by {saved_world} processes and this "
                f"job has {world}: {name!r} cannot be resharded. Resume with "
                f"--nproc_per_node={saved_world} (the same world size)."
            )
        how = reshard(saved, rank, world)
        if rank == 0:
            logger.warning("Resuming a checkpoint of %d processes with %d: %s", saved_world,
                           world, how)
    source = own if own is not None else states[0]
    assert source is not None
    if own is None:
        logger.warning("Checkpoint %s has no random state for rank %d (it was written by %d "
                       "processes): rank %d continues from rank 0's, offset by its rank.",
                       directory, rank, saved_world, rank)
    restore_rng_state(source["rng"])
    if own is None:
        torch.manual_seed(int(torch.randint(0, 2**62, ())) + rank)
