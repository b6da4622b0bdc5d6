"""Which old rank files a rank reads when a job resumes at another world size: one -- that of the
old rank of its number, else rank 0's -- where every rank-local state in it says it is enough
alone (a data position in a shard of one global order, or at a pass boundary); every old rank's
where a part needs them all (a metric's states, merged on rank 0)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import cadence.engine.rank_state as rank_state
from cadence.data.iterator import DataIterator
from cadence.engine.rank_state import (
    rank_file,
    rank_payload,
    read_rank_states,
    restore_rank_state,
    write_rank_state,
)
from cadence.engine.rng import capture_rng_state

OLD = 4


def loader_of(rank: int, world: int) -> DataIterator:
    data = list(range(100))
    return DataIterator(DataLoader(data, batch_size=4, sampler=DistributedSampler(
        data, num_replicas=world, rank=rank, seed=7)))


class Counts:
    """A rank-local part whose states are merged on rank 0 (as a metric's): it needs them all."""

    rank_local = True

    def __init__(self, count: int = 0) -> None:
        self.count = count

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]

    def load_resharded(self, states, rank, world_size):
        self.count = sum(state["count"] for state in states) if rank == 0 else 0
        return "the counts are merged on rank 0"


def save(directory, monkeypatch, batches: int, with_counts: bool) -> dict:
    """A checkpoint's rank files as `OLD` ranks write them after `batches` batches; its
    manifest."""
    manifest: dict = {"files": {}, "sha256": {}}
    monkeypatch.setenv("WORLD_SIZE", str(OLD))
    for rank in range(OLD):
        monkeypatch.setenv("RANK", str(rank))
        data = loader_of(rank, OLD)
        for _ in range(batches):
            next(data)
        items: dict = {"train_data": data}
        if with_counts:
            items["counts"] = Counts(rank + 1)
        torch.manual_seed(100 + rank)  # each rank's own random state
        digest = write_rank_state(rank_payload(items, capture_rng_state()), directory, rank)
        name = rank_file(directory, rank).name
        manifest["files"][name] = rank_file(directory, rank).stat().st_size
        manifest["sha256"][name] = digest
    return manifest


@pytest.fixture
def reads(monkeypatch):
    """The names of the files `cadence.engine.rank_state` reads."""
    names: list[str] = []
    read = rank_state.read_state_file

    def counting(path, sha256):
        names.append(path.name)
        return read(path, sha256)

    monkeypatch.setattr(rank_state, "read_state_file", counting)
    return names


@pytest.mark.parametrize("batches", [0, 3], ids=["at a pass boundary", "in mid-pass"])
@pytest.mark.parametrize("new", [2, 3, 6])
def test_a_resharding_rank_reads_one_old_file_and_resumes_as_from_all(
        tmp_path, monkeypatch, reads, batches, new):
    manifest = save(tmp_path, monkeypatch, batches, with_counts=False)
    monkeypatch.setenv("WORLD_SIZE", str(new))
    every = [rank_state._read(tmp_path, rank, manifest) for rank in range(OLD)]
    for rank in range(new):
        monkeypatch.setenv("RANK", str(rank))
        reads.clear()
        files = read_rank_states(tmp_path, manifest, OLD)
        assert reads == [f"rank-{rank if rank < OLD else 0}.cadence"]  # one file, not 4
        data = loader_of(rank, new)
        said = restore_rank_state(tmp_path, {"train_data": data}, OLD, files, manifest)
        expected = loader_of(rank, new)
        line = expected.load_resharded([f["state"]["train_data"] for f in every], rank, new)
        assert said[0] == line.rstrip(".")
        assert [batch.tolist() for batch in data] == [batch.tolist() for batch in expected]


def test_the_random_states_come_from_the_old_rank_of_the_same_number(tmp_path, monkeypatch):
    manifest = save(tmp_path, monkeypatch, 3, with_counts=False)
    monkeypatch.setenv("WORLD_SIZE", "3")
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        files = read_rank_states(tmp_path, manifest, OLD)
        restore_rank_state(tmp_path, {"train_data": loader_of(rank, 3)}, OLD, files, manifest)
        restored = torch.get_rng_state()
        torch.manual_seed(100 + rank)
        assert torch.equal(restored, torch.get_rng_state())


def test_a_part_that_needs_every_old_rank_makes_every_file_read(tmp_path, monkeypatch, reads):
    manifest = save(tmp_path, monkeypatch, 3, with_counts=True)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    files = read_rank_states(tmp_path, manifest, OLD)
    assert sorted(reads) == [f"rank-{rank}.cadence" for rank in range(OLD)]
    monkeypatch.setenv("RANK", "0")
    counts = Counts()
    restore_rank_state(tmp_path, {"train_data": loader_of(0, 3), "counts": counts}, OLD,
                       read_rank_states(tmp_path, manifest, OLD), manifest)
    assert counts.count == 1 + 2 + 3 + 4 and len(files) == OLD


def test_at_the_same_world_size_a_rank_reads_its_own_file(tmp_path, monkeypatch, reads):
    manifest = save(tmp_path, monkeypatch, 3, with_counts=True)
    monkeypatch.setenv("RANK", "2")
    read_rank_states(tmp_path, manifest, OLD)
    assert reads == ["rank-2.cadence"]


def test_at_another_layout_the_positions_are_resharded_over_the_data_coordinate(
        tmp_path, monkeypatch, reads):
    """4 data shards resumed at dp_shard=2 x tp=2 (the same 4 processes): each pair of tensor-
    parallel peers continues one new data shard, the same one, as 2 processes of data
    parallelism alone would -- not each its old rank's position."""
    from cadence.engine.runtime import ParallelDims, Runtime

    manifest = save(tmp_path, monkeypatch, 3, with_counts=False)
    every = [rank_state._read(tmp_path, rank, manifest) for rank in range(OLD)]
    dims = ParallelDims.resolve(4, tp=2)  # dp_shard=2
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        runtime = Runtime(dims, torch.device("cpu"), rank, "fsdp2")
        monkeypatch.setattr(rank_state, "current_runtime", lambda runtime=runtime: runtime)
        files = read_rank_states(tmp_path, manifest, OLD)
        data = loader_of(runtime.dp_rank, 2)
        said = restore_rank_state(tmp_path, {"train_data": data}, OLD, files, manifest)
        expected = loader_of(runtime.dp_rank, 2)
        line = expected.load_resharded([f["state"]["train_data"] for f in every],
                                       runtime.dp_rank, 2)
        assert said[0] == line.rstrip(".")
        assert [batch.tolist() for batch in data] == [batch.tolist() for batch in expected]
    # and back: the files of a tp=2 layout hold one position per data shard, read once each
    manifest["layout"] = dims.degrees
    monkeypatch.setattr(rank_state, "current_runtime",
                        lambda: Runtime(ParallelDims.resolve(4, dp_shard=4), torch.device("cpu"),
                                        1, "fsdp2"))
    monkeypatch.setenv("RANK", "1")
    reads.clear()
    assert rank_state.saved_layout(manifest, OLD) == dims
    read_rank_states(tmp_path, manifest, OLD)
    assert reads == ["rank-1.cadence"]  # its state says it is enough alone
