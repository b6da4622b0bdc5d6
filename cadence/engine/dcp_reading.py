"""Reading ``torch.distributed.checkpoint`` (DCP) folders without running code from them.

DCP unpickles twice when it loads: the folder's ``.metadata`` with a plain ``pickle.load``,
and every non-tensor value (an optimizer's hyper-parameters, a step count) with
``torch.load(weights_only=False)``. A run directory is untrusted input -- copied from
elsewhere, on a shared filesystem -- so a pickle planted in either place would run when a
checkpoint is restored or its weights exported. Here both go through restricted readers:

- `SafeFileSystemReader` reads ``.metadata`` with `MetadataUnpickler`, which admits DCP's own
  metadata classes (and ``torch.Size``, dtypes, layouts, paths) and nothing else, and refuses a
  storage entry whose file is not a plain name inside the folder, or not one of `allowed` (the
  files the checkpoint's manifest lists and verified).
- `SafeLoadPlanner` and `SafeFullStateLoadPlanner` read non-tensor values with
  ``torch.load(weights_only=True)``: tensors, numbers, strings and containers only.

A refusal is a `CheckpointError` that says what was found; nothing was executed.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

from cadence.core.checkpoint_dir import verify_files
from cadence.core.errors import CheckpointError
from cadence.core.files import plain_name

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED_GLOBALS = {
    (_METADATA_MODULE, "Metadata"),
    (_METADATA_MODULE, "MetadataIndex"),
    (_METADATA_MODULE, "StorageMeta"),
    (_METADATA_MODULE, "TensorStorageMetadata"),
    (_METADATA_MODULE, "BytesStorageMetadata"),
    (_METADATA_MODULE, "ChunkStorageMetadata"),
    (_METADATA_MODULE, "TensorProperties"),
    (_METADATA_MODULE, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}
"""What a DCP ``.metadata`` pickle may name: DCP's plain data classes and the few values they
hold. Every one of them only stores what it is given."""


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler for DCP's ``.metadata`` that refuses every global but `_ALLOWED_GLOBALS`
    and torch's dtypes, so that loading it can build DCP's metadata and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"{module}.{name} is not part of DCP's checkpoint metadata")


def read_dcp_metadata(stream: Any, where: str) -> Any:
    """The DCP metadata pickled in `stream`, through `MetadataUnpickler`.

    Raises:
        CheckpointError: if the pickle names anything but DCP's metadata classes (it would
            run code), or is not a DCP metadata pickle at all.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = MetadataUnpickler(stream).load()
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{where} is not DCP checkpoint metadata: {error}. cadence refused to unpickle it "
            "(it would run code). Do not restore from this run directory; if you did not put "
            "this file there, someone else did.") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError) as error:
        raise CheckpointError(f"{where} is damaged: {type(error).__name__}: {error}. Restore "
                              "an older checkpoint instead.") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{where} holds a {type(metadata).__name__}, not DCP checkpoint "
                              "metadata. Restore an older checkpoint instead.")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """DCP's `FileSystemReader`, reading ``.metadata`` with `MetadataUnpickler` and only the
    shard files named in `digests` (relative to the folder), each checked against its size and
    SHA-256 before its first byte is used -- only the files this process reads: at 1,024 ranks
    a rank resuming at the same world size checks its own shards, not the whole model.

    Args:
        path: the DCP folder.
        digests: the SHA-256 of each file that may be read (the manifest's); every shard file
            the metadata names must be one of them.
        sizes: their sizes in bytes (the manifest's), checked first.
    """

    def __init__(self, path: str, digests: Mapping[str, str],
                 sizes: Mapping[str, int] | None = None) -> None:
        super().__init__(path)
        self._allowed = set(digests)
        self._manifest = {"sha256": dict(digests), "files": dict(sizes or {})}
        self._verified: set[str] = set()
        self._metadata: dict[str, Any] = {}  # by file name: read and checked once

    def verify(self, names: Iterable[str]) -> None:
        """Checks the size and SHA-256 of each file in `names` not checked before.

        Raises:
            CheckpointError: naming a file that is not the manifest's, missing, truncated, or
                whose bytes changed after it was written.
        """
        for name in sorted(set(names) - self._verified):
            if name not in self._allowed:
                raise CheckpointError(f"{str(self.path)!r}/{name} is not listed in the "
                                      "checkpoint's manifest: it is not read.")
            verify_files(Path(self.path), self._manifest, [name])
            self._verified.add(name)

    @property
    def verified(self) -> set[str]:
        """The files checked so far (names relative to the folder)."""
        return set(self._verified)

    def files_of(self, plan: Any) -> set[str]:
        """The shard files that the read items of load `plan` are in."""
        storage = self.read_metadata().storage_data
        return {storage[item.storage_index].relative_path for item in plan.items}

    def read_data(self, plan: Any, planner: Any) -> Any:
        self.verify(self.files_of(plan))  # all of them before the first byte is copied
        return super().read_data(plan, planner)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        metadata = self._metadata.get(name)
        if metadata is None:
            metadata = self._metadata[name] = self._read_metadata(name)
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _read_metadata(self, name: str) -> Any:
        where = f"{str(self.path)!r}/{name}"
        if name not in self._allowed:
            raise CheckpointError(f"{where} is not listed in the checkpoint's manifest: it was "
                                  "not written with this checkpoint, and is not read.")
        self.verify([name])  # its bytes, before they are unpickled
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "rb") as stream:
            metadata = read_dcp_metadata(stream, where)
        from torch.distributed.checkpoint.metadata import StorageMeta

        for info in (metadata.storage_data or {}).values():
            relative = getattr(info, "relative_path", "")
            if relative not in self._allowed or not plain_name(relative):
                raise CheckpointError(
                    f"{where} names a shard file {relative!r} that is not a file of this "
                    "checkpoint's manifest. The checkpoint was tampered with or damaged; "
                    "restore an older one.")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        return metadata


def _load_plain(value: io.BytesIO) -> Any:
    """A non-tensor value DCP saved with ``torch.save``, read with ``weights_only=True``."""
    try:
        return torch.load(value, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            "A sharded checkpoint holds a value that is not a tensor or a plain value; cadence "
            "loads with weights_only=True and never unpickles arbitrary objects. Make "
            f"state_dict() return tensors, numbers, strings, lists and dicts. ({error})"
        ) from None


def _store_plain(planner: DefaultLoadPlanner, read_item: Any, value: io.BytesIO) -> None:
    """`DefaultLoadPlanner.load_bytes`, reading the value with `_load_plain`."""
    from torch.distributed.checkpoint._traverse import set_element

    loaded = _load_plain(value)
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn],
                    loaded)
    else:
        planner.state_dict[read_item.dest_index.fqn] = loaded


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, with non-tensor values read by `_load_plain`."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        _store_plain(self, read_item, value)


class SafeFullStateLoadPlanner(_EmptyStateDictLoadPlanner):
    """The planner that rebuilds a whole state dict from the metadata (no model needed), with
    non-tensor values read by `_load_plain`. After ``dcp.load``, `loaded` holds it (``dcp.load``
    copies back only the keys its caller passed in, and a caller of this planner passes none).
    """

    loaded: dict[str, Any]

    def set_up_planner(self, state_dict: Any, *args: Any, **kwargs: Any) -> None:
        super().set_up_planner(state_dict, *args, **kwargs)
        self.loaded = state_dict

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        _store_plain(self, read_item, value)


@contextlib.contextmanager
def dcp_read_errors(where: str) -> Iterator[None]:
    """Turns DCP's `CheckpointException` (a `BaseException` carrying each rank's failure) into
    one `CheckpointError`: a refusal of ours keeps its message; any other failure to read the
    shards is damage."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as failure:
        errors = [wrapped[0] for wrapped in failure.failures.values()]
        ours = next((error for error in errors if isinstance(error, CheckpointError)), None)
        if ours is not None:
            raise CheckpointError(str(ours)) from None
        first = errors[0] if errors else failure
        raise CheckpointError(
            f"Cannot read the sharded state of {where}: {type(first).__name__}: {first}. It is "
            "damaged or was written for another model; restore an older checkpoint.") from None
