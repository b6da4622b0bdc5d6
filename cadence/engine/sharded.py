"""Sharded state: models and optimizers whose tensors are split over the ranks (FSDP2), saved
and loaded through ``torch.distributed.checkpoint`` (DCP).

When a checkpointed model's parameters are DTensors, every rank writes its own shards of the
models and optimizers into the checkpoint's ``sharded/`` folder, and nothing is gathered on one
rank. DCP reshards on load: a checkpoint written by 2 processes loads into 2 processes, into 1
(a plain model: the full tensors), or into 4. The other parts of the state (counters, data
positions, schedules, callbacks) are saved as usual. Model state is keyed by parameter name and
optimizer state by the name of its parameter (``torch.distributed.checkpoint.state_dict``), so
that both load into a model sharded differently, or not at all.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cadence.engine.runtime import GlooGroup

SHARDED_DIR = "sharded"
"""The folder of a checkpoint that DCP writes into."""


def is_sharded_module(module: Any) -> bool:
    """Whether `module`'s parameters are DTensors (sharded with FSDP2)."""
    if not isinstance(module, nn.Module):
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


class _ModelPart:
    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.module)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.module, state)


class _OptimizerPart:
    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.module, self.optimizer = module, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.module, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.module, self.optimizer, state)


def dcp_parts(items: dict[str, Any]) -> dict[str, Any]:
    """The parts of `items` that go through DCP -- every ``nn.Module``, and every optimizer
    paired with the module that owns its parameters -- as DCP-friendly views of them."""
    modules = {name: obj for name, obj in items.items() if isinstance(obj, nn.Module)}
    parts: dict[str, Any] = {name: _ModelPart(module) for name, module in modules.items()}
    for name, obj in items.items():
        if isinstance(obj, torch.optim.Optimizer):
            params = {id(p) for group in obj.param_groups for p in group["params"]}
            owner = next((m for m in modules.values()
                          if params & {id(p) for p in m.parameters()}), None)
            if owner is not None:
                parts[name] = _OptimizerPart(owner, obj)
    return parts


def uses_dcp(items: dict[str, Any]) -> bool:
    """Whether a checkpoint of `items` is sharded: some model's parameters are DTensors, or the
    job is a pipeline -- each stage holds a part of the model (`cadence.engine.pipeline`), which
    its ranks write themselves, under the model's own names."""
    from cadence.engine.runtime import current_runtime

    return current_runtime().dims.pp > 1 or any(is_sharded_module(obj)
                                                for obj in items.values())


def _save_planner() -> Any:
    """DCP's save planner, writing each replicated value (an optimizer's step and settings:
    small next to the shards) into rank 0's file rather than balancing them over every rank's.
    A rank that restores reads -- and checks, whole -- its own shard files and rank 0's; with
    the values spread, every rank would read a few bytes of every rank's file and check them
    all: the whole model, on each of 1,024 ranks."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    return DefaultSavePlanner(dedup_save_to_lowest_rank=True)


def save_sharded(parts: dict[str, Any], directory: Path) -> None:
    """Every rank writes its shards of `parts` into ``directory/sharded`` (a collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.save({name: part.state_dict() for name, part in parts.items()},
             checkpoint_id=str(directory / SHARDED_DIR), planner=_save_planner())


_background_writes = GlooGroup()
"""A gloo group of its own for DCP's background writes: their collectives run in another
thread, and must not interleave with the training thread's on the other groups. Created on the
first asynchronous save (a collective: every rank saves at the same step)."""


def save_sharded_async(parts: dict[str, Any], directory: Path) -> Any:
    """`save_sharded` in the background: the shards are copied to host memory now (the
    stall), written by DCP's thread; returns the future of the write."""
    import torch.distributed.checkpoint as dcp

    return dcp.async_save({name: part.state_dict() for name, part in parts.items()},
                          checkpoint_id=str(directory / SHARDED_DIR),
                          process_group=_background_writes.get(), planner=_save_planner())


def own_shard_digests(directory: Path, rank: int) -> dict[str, str]:
    """The SHA-256 of the files of ``directory/sharded`` this rank wrote -- DCP's writer names
    them ``__<rank>_<n>.distcp``; rank 0 also writes ``.metadata`` -- by their names in the
    checkpoint. Each rank hashes its own share, in parallel, so that the commit reads nothing
    back."""
    from cadence.core.checkpoint_dir import file_sha256

    folder = directory / SHARDED_DIR
    if not folder.is_dir():
        return {}
    names = [path.name for path in folder.iterdir()
             if path.name.startswith(f"__{rank}_") and path.name.endswith(".distcp")]
    if rank == 0 and (folder / ".metadata").is_file():
        names.append(".metadata")
    return {f"{SHARDED_DIR}/{name}": file_sha256(folder / name) for name in names}


def sharded_files(manifest: dict[str, Any]) -> set[str]:
    """The files of a checkpoint's ``sharded/`` folder that its manifest lists with a SHA-256
    (names relative to the folder): the only ones DCP may read. Files on disk that the
    manifest does not list were not written with the checkpoint and are never opened."""
    prefix = f"{SHARDED_DIR}/"
    return {name[len(prefix):] for name in manifest.get("sha256", {})
            if isinstance(name, str) and name.startswith(prefix)}


def sharded_reader(directory: Path, manifest: dict[str, Any]) -> Any:
    """The reader of checkpoint `directory`'s ``sharded/`` folder, or None when its manifest
    lists no DCP metadata (whatever is on disk). It reads only the files `manifest` lists, and
    unpickles nothing but DCP's metadata -- once, however many times it is asked -- and plain
    values (`cadence.engine.dcp_reading`)."""
    files = sharded_files(manifest)
    if ".metadata" not in files:
        return None
    from cadence.engine.dcp_reading import SafeFileSystemReader

    prefix = f"{SHARDED_DIR}/"
    digests, sizes = manifest.get("sha256", {}), manifest.get("files", {})
    return SafeFileSystemReader(str(directory / SHARDED_DIR),
                                {name: digests[prefix + name] for name in files},
                                {name: sizes[prefix + name] for name in files
                                 if prefix + name in sizes})


def verify_sharded_reads(parts: dict[str, Any], reader: Any) -> None:
    """Checks, before anything is loaded, the shard files that this rank's load of `parts`
    will read (DCP's local load plan, made here without collectives). A plan that cannot be
    made (the shards do not fit `parts`) is left to the load itself to report."""
    if reader is None or not parts:
        return
    from cadence.engine.dcp_reading import SafeLoadPlanner

    planner = SafeLoadPlanner()
    try:
        planner.set_up_planner({name: part.state_dict() for name, part in parts.items()},
                               reader.read_metadata(), False)
        plan = planner.create_local_plan()
    except (RuntimeError, KeyError, ValueError):
        return
    reader.verify(reader.files_of(plan))


def load_sharded(parts: dict[str, Any], reader: Any) -> None:
    """Loads the shards `reader` reads (`sharded_reader`) into `parts`, resharded to this job
    (a collective under torchrun; a single process reads the full tensors)."""
    import torch.distributed.checkpoint as dcp

    from cadence.engine.dcp_reading import SafeLoadPlanner, dcp_read_errors

    state = {name: part.state_dict() for name, part in parts.items()}
    with warnings.catch_warnings(), dcp_read_errors(str(reader.path)):
        # "assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner())
    for name, part in parts.items():
        part.load_state_dict(state[name])


def sharded_names(reader: Any) -> set[str]:
    """The top-level names saved in the shards `reader` reads; none without a reader."""
    if reader is None:
        return set()
    return {key.split(".", 1)[0] for key in reader.read_metadata().state_dict_metadata}


def full_model_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s whole state on every rank, gathered when it is sharded (a collective: every
    rank must call it); its own state dict otherwise."""
    if not is_sharded_module(module):
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    return {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}


def load_full_model_state(module: nn.Module, state: dict[str, torch.Tensor],
                          strict: bool = True) -> None:
    """Loads whole tensors into `module`: each rank takes its shards of them where the module
    is sharded (a collective: every rank must call it, with the same `state`); its own
    ``load_state_dict`` otherwise."""
    if not is_sharded_module(module):
        module.load_state_dict(state, strict=strict)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    whole: dict[str, Any] = dict(state)  # the value type torch declares is wider than Tensor
    set_model_state_dict(module, whole, options=StateDictOptions(full_state_dict=True,
                                                                  strict=strict))


def read_sharded(reader: Any, name: str) -> dict[str, torch.Tensor]:
    """The full tensors of part `name` of the shards `reader` reads (`sharded_reader`), read in
    this process alone (to load the weights of a sharded run into a plain model)."""
    import torch.distributed.checkpoint as dcp

    from cadence.engine.dcp_reading import SafeFullStateLoadPlanner, dcp_read_errors

    planner = SafeFullStateLoadPlanner()
    with warnings.catch_warnings(), dcp_read_errors(str(reader.path)):
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.load({}, storage_reader=reader, planner=planner, no_dist=True)
    part = planner.loaded.get(name, {})
    return {key: value for key, value in part.items() if isinstance(value, torch.Tensor)}
