"""The Runtime: a process's place in the job -- the degrees of its named dimensions, its
coordinates, its data coordinate -- and the layouts it refuses before anything is built."""

import pytest

from cadence.core import rank as place
from cadence.core.errors import ConfigError
from cadence.engine.parallel_dims import (
    DIMENSIONS,
    ParallelDims,
    check_layout,
    resolve_layout_strategy,
)
from cadence.engine.runtime import Runtime, current_runtime, setup_runtime


def test_dp_shard_minus_one_takes_what_the_other_degrees_leave():
    dims = ParallelDims.resolve(8, dp_replicate=2, tp=2)
    assert dims.degrees == {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2}
    assert (dims.world_size, dims.dp_size) == (8, 4)
    assert dims.describe() == "dp_replicate=2 x dp_shard=2 x tp=2"
    assert ParallelDims.resolve(1).describe() == "one process"


def test_tensor_parallel_peers_are_neighbours_and_read_one_data_shard():
    """tp varies fastest: ranks 2k and 2k+1 share a batch (one machine's GPUs)."""
    dims = ParallelDims.resolve(8, tp=2)  # dp_shard=4
    assert [dims.dp_rank(rank) for rank in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [dims.coordinates(rank)["tp"] for rank in range(8)] == [0, 1] * 4
    assert dims.ranks_of_data_shard(2) == [4, 5]
    hsdp = ParallelDims.resolve(4, dp_replicate=2, dp_shard=2)
    assert [hsdp.dp_rank(rank) for rank in range(4)] == [0, 1, 2, 3]
    pipeline = ParallelDims.resolve(4, pp=2, tp=2)  # dp 1: every rank reads the one shard
    assert {pipeline.dp_rank(rank) for rank in range(4)} == {0}
    assert [pipeline.coordinates(rank)["pp"] for rank in range(4)] == [0, 0, 1, 1]


def test_every_coordinate_is_one_rank():
    dims = ParallelDims.resolve(24, pp=2, dp_replicate=2, tp=2)  # dp_shard=3
    seen = {tuple(dims.coordinates(rank).values()) for rank in range(24)}
    assert len(seen) == 24 and list(dims.coordinates(0)) == list(DIMENSIONS)


@pytest.mark.parametrize(("world", "degrees", "message"), [
    (4, {"tp": 3}, r"^runtime\.parallelism: pp=1 x dp_replicate=1 x dp_shard=-1 x cp=1 x tp=3 "
                   r"leaves no whole dp_shard for 4 processes: pp=1 x dp_replicate=1 x cp=1 x "
                   r"tp=3 = 3 must divide the world size\."),
    (4, {"dp_shard": 2, "tp": 4}, r"= 8 processes, and this job has 4: the degrees' product "
                                  r"must be the world size\."),
    (4, {"tp": 0}, r"^runtime\.parallelism\.tp \(got 0\) must be a positive int\.$"),
    (4, {"dp_shard": -2}, r"dp_shard \(got -2\) must be a positive int or -1"),
    (4, {"pp": 2.0}, r"pp \(got 2\.0\) must be a positive int"),
])
def test_degrees_that_do_not_make_the_world_size_are_one_line(world, degrees, message):
    with pytest.raises(ConfigError, match=message):
        ParallelDims.resolve(world, setting="runtime.parallelism", **degrees)


def test_a_layout_that_cannot_work_is_refused_before_anything_is_built():
    with pytest.raises(ConfigError, match=r"tp=2 with runtime\.strategy=ddp: DDP holds a whole "
                                          r"replica"):
        check_layout(ParallelDims.resolve(4, tp=2), "ddp")
    with pytest.raises(ConfigError, match=r"dp_shard=2 shards the model, which "
                                          r"runtime\.strategy=none does not"):
        check_layout(ParallelDims.resolve(4, tp=2), "none")
    with pytest.raises(ConfigError, match=r"context parallelism is not supported yet"):
        check_layout(ParallelDims.resolve(2, cp=2), "fsdp2")
    check_layout(ParallelDims.resolve(4, dp_replicate=4, dp_shard=1), "ddp")


def test_auto_is_fsdp2_over_shards_ddp_over_replicas_alone():
    assert resolve_layout_strategy("auto", ParallelDims.resolve(4, tp=2)) == "fsdp2"
    assert resolve_layout_strategy("auto", ParallelDims.resolve(4, dp_replicate=2,
                                                                dp_shard=1, tp=2)) == "fsdp2"
    assert resolve_layout_strategy("auto", ParallelDims.resolve(4, dp_replicate=4,
                                                                dp_shard=1)) == "ddp"
    assert resolve_layout_strategy("auto", ParallelDims.resolve(2, dp_shard=1, tp=2)) == "none"


def test_one_process_runtime_and_what_the_torch_free_engine_reads():
    runtime = setup_runtime("cpu")
    assert (runtime.rank, runtime.world_size, runtime.dp_rank, runtime.dp_size) == (0, 1, 0, 1)
    assert runtime.strategy == "none" and runtime.mesh is None
    assert runtime.device_module is None and runtime.backend == "gloo"
    assert current_runtime() is runtime
    assert (place.process_rank(), place.world_size(), place.data_rank(),
            place.data_size()) == (0, 1, 0, 1)
    assert runtime.describe() == "one process on cpu, rank 0 of 1, data shard 0 of 1"
    with pytest.raises(ValueError, match=r"\['model'\] \(got \('model',\)\) are not dimensions"):
        runtime.mesh_of("model")


def test_the_place_of_a_runtime_is_what_the_torch_free_engine_reads(monkeypatch):
    """Rank 5 of 8 at dp_shard=4 x tp=2 reads data shard 2 of 4; a place that is not the
    job's (another world size: a group made since) is not believed."""
    import torch

    monkeypatch.setattr(place, "_process_group", lambda: None)  # torchrun's environment only
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert (place.data_rank(), place.data_size()) == (5, 8)  # no runtime: every rank a shard
    runtime = Runtime(ParallelDims.resolve(8, tp=2), torch.device("cpu"), rank=5,
                      strategy="fsdp2")
    try:
        assert (place.process_rank(), place.world_size(), place.data_rank(),
                place.data_size(), place.is_chief()) == (5, 8, 2, 4, False)
        assert runtime.mesh_dimensions() == ["dp_shard", "tp"]
        monkeypatch.setenv("WORLD_SIZE", "16")
        assert (place.world_size(), place.data_size()) == (16, 16)
    finally:
        place.set_place(None)


def test_no_module_but_the_runtime_asks_the_rank_or_the_world_size_or_names_cuda():
    """One object says where a process sits: every other module asks it (or, torch-free,
    `cadence.core.rank`, which it keeps); an accelerator is a device type, not a name. Code
    only: docstrings may say "CUDA"."""
    import ast
    from pathlib import Path

    package = Path(__file__).parents[2] / "cadence"
    owners = {"engine/runtime.py", "core/rank.py",
              "core/slurm.py"}  # the launch seam: it sets torchrun's variables from Slurm's
    found = []
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        if name in owners:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            asks = (
                (isinstance(node, ast.Attribute) and node.attr in ("get_rank", "get_world_size")
                and isinstance(node.value, ast.Name) and node.value.id == "dist")
                or (isinstance(node, ast.Attribute) and node.attr == "cuda"
                and isinstance(node.value, ast.Name) and node.value.id == "torch")
                or (isinstance(node, ast.Constant) and node.value in ("cuda", "RANK",
                                                                      "WORLD_SIZE")))
            if asks:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
