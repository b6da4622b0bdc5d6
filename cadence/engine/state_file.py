"""The checkpoint payload file: nested state as a safetensors file, no pickle.

``torch.save`` pickles: every tensor costs Python work that holds the GIL, so a background save
slows the training thread well beyond its stall, and loading a pickle is only safe because
``weights_only=True`` restricts it. This format has neither problem. A file is a safetensors
file (https://huggingface.co/docs/safetensors), which other tools open as it is
(``safetensors.safe_open``, ``safetensors.torch.load_file``)::

    header length                      8 bytes, little-endian
    header                             JSON: each tensor by its path in the state
                                       (``model.0.weight``) with its dtype, shape and place;
                                       ``__metadata__`` holds the structure and every other
                                       value (JSON), the tensors' names in order, and
                                       ``cadence`` (the format version)
    tensor bytes                       end to end, the largest elements first

The tensor bytes are laid out in the file exactly as in a `HostSnapshot`'s arena: an
asynchronous save copies every tensor into one reused host buffer (the stall), and the
background write is then one ``write`` of that buffer and one ``update`` of the SHA-256, both of
which release the GIL -- the Python work left for the background thread does not grow with the
number of tensors (the header's table of tensors is made once per layout). Reading parses JSON
and reads bytes into new tensors, so nothing in the file can run code. The structure holds dicts
(any plain keys), lists, tuples, None, bools, ints, floats (NaN and infinities included),
strings, bytes, tensors (complex ones as their real view), NumPy arrays, ``torch.Size``, dtypes
and devices: what ``state_dict()`` returns. Anything else is a `TypeError` naming its path.
Files of version 1 (cadence's own layout behind ``CADENCE-STATE`` magic bytes) are still read:
``tests/fixtures/state_format_1`` is a user's checkpoint of that format, and it must restore.

>>> import io, torch
>>> buffer = io.BytesIO()
>>> digest = write_state({"w": torch.ones(2), "step": 3, "lr": [0.1]}, buffer)
>>> _ = buffer.seek(0)
>>> read_state(buffer)
{'w': tensor([1., 1.]), 'step': 3, 'lr': [0.1]}
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import math
import os
import struct
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np
import torch

from cadence.engine.runtime import on_accelerator, synchronize

MAGIC = b"CADENCE-STATE\0\0\0"
"""What version 1 files begin with (read still; written no more)."""
VERSION = 2
"""Version 2 is a safetensors file; version 1 was cadence's own layout."""
_ALIGN = 64
_MAX_HEADER = 1 << 30

_DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
                  torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8,
                  torch.uint8, torch.bool)
}
for _name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class StateFileError(ValueError):
    """A state file is truncated, damaged or not a state file."""


def _padding(offset: int) -> int:
    return -offset % _ALIGN


class _Unsupported(TypeError):
    def __init__(self, value: Any, problem: str) -> None:
        super().__init__(problem)
        self.value, self.problem = value, problem


def _path_to(node: Any, target: Any, path: str = "") -> str | None:
    """Where `target` is inside `node` (a slow walk, for error messages only)."""
    if node is target:
        return path
    if isinstance(node, Mapping):
        children: Any = ((f"{path}/{k}", v) for k, v in node.items())
    elif isinstance(node, (list, tuple)) and not isinstance(node, torch.Size):
        children = ((f"{path}/{i}", v) for i, v in enumerate(node))
    else:
        return None
    for child_path, child in children:
        found = _path_to(child, target, child_path)
        if found is not None:
            return found
    return None


class _Encoder:
    """Turns a nested state into a JSON-able tree plus the list of its tensors.

    It runs in the training thread's stall for an asynchronous save, once per node: the fast
    path does no string work (paths are found only to explain an error).
    """

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.entries: list[dict[str, Any]] = []
        self._seen: dict[int, int] = {}  # the same tensor object twice is stored once
        self.size = 0
        """Bytes of tensor data."""

    def encode_state(self, state: Any) -> Any:
        try:
            tree = self.encode(state)
        except _Unsupported as error:
            where = _path_to(state, error.value) or ""
            raise TypeError(f"{where or 'the state'} {error.problem}") from None
        self._lay_out()
        return tree

    def _lay_out(self) -> None:
        """Places the tensors end to end, as safetensors requires (no gaps), the largest
        elements first: each tensor's offset is then a multiple of its element size, so that
        a view of it into one byte buffer (`HostSnapshot`) is aligned."""
        position = 0
        for index in sorted(range(len(self.entries)),
                            key=lambda i: -self.tensors[i].element_size()):
            entry = self.entries[index]
            entry["offset"] = position
            position += entry["nbytes"]
        self.size = position

    def tensor(self, value: torch.Tensor) -> int:
        index = self._seen.get(id(value))
        if index is not None:
            return index
        dtype = _DTYPE_NAMES.get(value.dtype)
        if value.layout != torch.strided or value.is_quantized:
            raise _Unsupported(value, f"is a {value.layout} tensor; checkpoints hold dense "
                               "tensors. Convert it with .to_dense() in state_dict().")
        if dtype is None:
            raise _Unsupported(value, f"has dtype {value.dtype}, which checkpoints cannot "
                               f"hold; supported: {', '.join(_DTYPES)}.")
        self.entries.append({"dtype": dtype, "shape": list(value.shape), "offset": 0,
                             "nbytes": value.nbytes})
        self.tensors.append(value)
        index = self._seen[id(value)] = len(self.tensors) - 1
        return index

    def encode(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return {"T": self.tensor(value)}
        if isinstance(value, Mapping):
            encode = self.encode
            node = {"d": [[encode(k), encode(v)] for k, v in value.items()]}
            metadata = getattr(value, "_metadata", None)  # nn.Module state_dict() versions
            if isinstance(metadata, dict):
                node["m"] = encode(dict(metadata))
            return node
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else {"f": repr(value)}
        if isinstance(value, list):
            if all(type(v) is int for v in value):  # already JSON: e.g. a sampler's indices
                return list(value)
            return [self.encode(v) for v in value]
        if isinstance(value, torch.Size):
            return {"S": [int(v) for v in value]}
        if isinstance(value, tuple):
            if all(type(v) is int for v in value):  # e.g. Python's random state, 625 ints
                return {"t": list(value)}
            return {"t": [self.encode(v) for v in value]}
        if isinstance(value, np.ndarray):
            return {"N": self.tensor(torch.from_numpy(np.ascontiguousarray(value)))}
        if isinstance(value, np.generic):
            return self.encode(value.item())
        if isinstance(value, torch.dtype):
            return {"dt": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"dev": str(value)}
        if isinstance(value, bytes):
            return {"b": base64.b64encode(value).decode("ascii")}
        raise _Unsupported(
            value, f"is a {type(value).__name__}; checkpoints hold tensors, NumPy arrays, "
            "numbers, strings, bytes, None, and lists, tuples and dicts of them. Make "
            "state_dict() return those.")


def _decode(node: Any, tensors: list[torch.Tensor]) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(v, tensors) for v in node]
    if isinstance(node, dict) and "d" in node and set(node) <= {"d", "m"}:
        items = {_decode(k, tensors): _decode(v, tensors) for k, v in node["d"]}
        if "m" not in node:
            return items
        ordered = OrderedDict(items)
        ordered._metadata = _decode(node["m"], tensors)  # type: ignore[attr-defined]
        return ordered
    if not isinstance(node, dict) or len(node) != 1:
        raise StateFileError(f"unknown node {str(node)[:80]!r}")
    ((tag, value),) = node.items()
    if tag == "T":
        return tensors[value]
    if tag == "N":
        return tensors[value].numpy()
    if tag == "t":
        return tuple(_decode(v, tensors) for v in value)
    if tag == "f":
        if value not in ("nan", "inf", "-inf"):
            raise StateFileError(f"bad float {value!r}")
        return float(value)
    if tag == "S":
        return torch.Size(int(v) for v in value)
    if tag == "dt":
        return _DTYPES[value]
    if tag == "dev":
        return torch.device(value)
    if tag == "b":
        return base64.b64decode(value)
    raise StateFileError(f"unknown tag {tag!r}")


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (any dtype, NumPy's or not)."""
    try:
        return tensor.numpy().data.cast("B")  # the cheap way, for NumPy's dtypes
    except (TypeError, ValueError, RuntimeError):
        return tensor.reshape(-1).view(torch.uint8).numpy().data


def _write_all(handle: BinaryIO, data: memoryview | bytes) -> None:
    view = memoryview(data)
    while len(view):
        written = handle.write(view)
        if written is None:  # a non-blocking stream: never the case for files
            raise OSError("the file did not accept the write")
        view = view[written:]


class PackedState:
    """A state whose tensors all sit in one host buffer, laid out as in a state file: what
    `HostSnapshot.pack` returns, and what `write_state` writes in one call.

    Attributes:
        tree: the encoded structure (JSON-able).
        entries: each tensor's dtype, shape, offset and size.
        arena: the tensor bytes (uint8, at least `size` long; padding is zeros).
        size: how many bytes of `arena` are data.
    """

    def __init__(self, tree: Any, entries: list[dict[str, Any]], arena: torch.Tensor,
                 size: int, views: list[torch.Tensor],
                 table: tuple[bytes, dict[str, str]]) -> None:
        self.tree, self.entries, self.arena, self.size = tree, entries, arena, size
        self.table = table
        self._views = views
        self._value: Any = None

    @property
    def value(self) -> Any:
        """The state itself: the same structure, its tensors views into `arena`."""
        if self._value is None:
            self._value = _decode(self.tree, self._views)
        return self._value


class HostSnapshot:
    """Copies the tensors of a (nested) state into one host buffer, reused from one snapshot
    to the next while the tensors' dtypes and shapes stay the same: the copy is the whole stall
    of an asynchronous save. On CUDA the buffer is pinned, so the copy runs at full bandwidth.
    """

    def __init__(self) -> None:
        self._layout: list[dict[str, Any]] = []
        self._arena: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        self._buffers: dict[str, torch.Tensor] = {}  # take's, by path in the state
        self._table: tuple[bytes, dict[str, str]] = (b"", {})

    def pack(self, state: Any) -> PackedState:
        """A copy of `state` whose tensors live in this snapshot's buffer."""
        encoder = _Encoder()
        tree = encoder.encode_state(state)
        accelerated = any(on_accelerator(t) for t in encoder.tensors)
        if encoder.entries != self._layout or self._arena is None or (
                accelerated and not self._arena.is_pinned()):
            arena = torch.zeros(max(encoder.size, 1), dtype=torch.uint8, pin_memory=accelerated)
            self._views = [
                arena[e["offset"]:e["offset"] + e["nbytes"]].view(_DTYPES[e["dtype"]])
                .view(e["shape"]) for e in encoder.entries
            ]
            self._arena, self._layout = arena, encoder.entries
            # The tensors' names are their paths in the state as it is now: made again only
            # when the layout changes (a state whose keys change with the same tensors keeps
            # its first names -- they label tensors for other tools; cadence reads by index).
            self._table = _tensor_table(tree, encoder.entries)
        with torch.no_grad():  # parameters are copied, not recorded by autograd
            for view, source in zip(self._views, encoder.tensors):
                view.copy_(source, non_blocking=on_accelerator(source))
        if accelerated:  # the copies were queued on each device's current stream: wait
            for device in {t.device for t in encoder.tensors if on_accelerator(t)}:
                synchronize(device)
        return PackedState(tree, encoder.entries, self._arena, encoder.size, self._views,
                           self._table)

    def take(self, value: Any, path: str = "") -> Any:
        """A copy of `value` whose tensors each have a host buffer of their own (reused from one
        snapshot to the next): for writers other than `write_state` -- ``torch.save`` refuses
        tensors of different dtypes that share one buffer, as `pack`'s do."""
        if isinstance(value, torch.Tensor):
            source = value.detach()
            buffer = self._buffers.get(path)
            if (buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype
                    or buffer.layout != source.layout):
                buffer = torch.empty(source.shape, dtype=source.dtype, device="cpu",
                                     pin_memory=on_accelerator(source))
                self._buffers[path] = buffer
            buffer.copy_(source, non_blocking=on_accelerator(source))
            if on_accelerator(source):
                synchronize(source.device)
            return buffer
        if isinstance(value, dict):
            return {k: self.take(v, f"{path}/{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
            items = [self.take(v, f"{path}/{i}") for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return copy.deepcopy(value)


_SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "uint16": "U16", "uint32": "U32",
    "uint64": "U64",
}
"""safetensors' names of the dtypes it holds. Complex tensors are stored as their real view (a
trailing dimension of 2: the same bytes), their dtype in the metadata's ``complex``."""
_COMPLEX_PARTS = {"complex64": "F32", "complex128": "F64"}
FROM_SAFETENSORS = {name: _DTYPES[dtype] for dtype, name in _SAFETENSORS_DTYPES.items()
                     if dtype in _DTYPES}
"""The torch dtype of each safetensors dtype name a state file uses."""


def _key_text(node: Any) -> str:
    return node if isinstance(node, str) else json.dumps(node, separators=(",", ":"))


def _tensor_names(tree: Any, count: int) -> list[str]:
    """A name for each tensor of an encoded `tree`: its path of keys (``model.0.weight``), as
    ``safetensors.safe_open(...).keys()`` lists them; unique (``#<index>`` added on a clash)."""
    names: list[str | None] = [None] * count
    taken = {"__metadata__"}
    stack: list[tuple[Any, str]] = [(tree, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):  # only containers can hold a tensor: no name for the rest
            stack.extend((v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(node)
                         if isinstance(v, (list, dict)))
        elif isinstance(node, dict) and "d" in node and set(node) <= {"d", "m"}:
            for key, value in node["d"]:
                text = _key_text(key)
                stack.append((value, f"{path}.{text}" if path else text))
        elif isinstance(node, dict) and len(node) == 1:
            ((tag, value),) = node.items()
            if tag in ("T", "N") and names[value] is None:
                name = path or "tensor"
                name = name if name not in taken else f"{name}#{value}"
                names[value] = name
                taken.add(name)
            elif tag == "t":
                stack.append((value, path))
    return [name if name is not None else f"#{index}" for index, name in enumerate(names)]


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _tensor_table(tree: Any, entries: list[dict[str, Any]]) -> tuple[bytes, dict[str, str]]:
    """The per-tensor part of a state file's safetensors header -- each tensor by its path,
    its dtype, shape and place -- as JSON without its braces, and the metadata that names them.
    It depends on the layout only, so a `HostSnapshot` makes it once, not at every save."""
    names = _tensor_names(tree, len(entries))
    complex_dtypes = {}
    header: dict[str, Any] = {}
    for name, entry in zip(names, entries):
        shape = list(entry["shape"])
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            dtype = _COMPLEX_PARTS[entry["dtype"]]
            complex_dtypes[name] = entry["dtype"]
            shape.append(2)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [entry["offset"], entry["offset"] + entry["nbytes"]]}
    metadata = {"names": _compact_json(names)}
    if complex_dtypes:
        metadata["complex"] = _compact_json(complex_dtypes)
    return _compact_json(header).encode("utf-8")[1:-1], metadata


def _safetensors_header(tree: Any, table: tuple[bytes, dict[str, str]]) -> bytes:
    """The safetensors header of a state file: the tensors of `table` (`_tensor_table`), the
    structure and the other values (JSON) in ``__metadata__``; padded with spaces to a
    multiple of 8 bytes, as safetensors writes it."""
    tensors, names = table
    metadata = {"format": "pt", "cadence": str(VERSION), "tree": _compact_json(tree), **names}
    text = (b'{"__metadata__":' + _compact_json(metadata).encode("utf-8")
            + (b"," + tensors if tensors else b"") + b"}")
    return text + b" " * (-(8 + len(text)) % 8)


def write_state(state: Any, file: str | os.PathLike[str] | BinaryIO) -> str:
    """Writes `state` to `file` (a path or a binary stream) as a safetensors file; returns the
    SHA-256 of its bytes.

    A `PackedState` is written with two writes whatever the number of tensors; any other
    state is encoded here (tensors on a device are copied to the host one by one).

    Raises:
        TypeError: if the state holds something other than the values listed above.
    """
    if isinstance(state, PackedState):
        tree, entries, tensors, size = state.tree, state.entries, None, state.size
        table = state.table
    else:
        encoder = _Encoder()
        tree = encoder.encode_state(state)
        entries, tensors, size = encoder.entries, encoder.tensors, encoder.size
        table = _tensor_table(tree, entries)
    header = _safetensors_header(tree, table)
    digest = hashlib.sha256()
    prefix = struct.pack("<Q", len(header)) + header

    def emit(handle: BinaryIO, data: memoryview | bytes) -> None:
        digest.update(data)  # releases the GIL for large buffers, as the write does
        _write_all(handle, data)

    def body(handle: BinaryIO) -> None:
        emit(handle, prefix)
        if tensors is None:  # packed: the arena is the file's data
            if size:
                emit(handle, _byte_view(state.arena[:size]))
            return
        for index in sorted(range(len(entries)), key=lambda i: entries[i]["offset"]):
            if entries[index]["nbytes"]:
                emit(handle, _byte_view(tensors[index].detach().cpu().contiguous()))

    if isinstance(file, (str, os.PathLike)):
        with open(file, "wb", buffering=1 << 20) as handle:  # small tensors coalesce
            body(handle)
    else:
        body(file)
    return digest.hexdigest()


def _read_safetensors(header: dict[str, Any], take_into: Any) -> Any:
    """The state of a state file (safetensors, cadence's metadata) whose header was read."""
    metadata = header.pop("__metadata__", None)
    if not isinstance(metadata, dict) or "cadence" not in metadata:
        raise StateFileError("it is a safetensors file without cadence's metadata, not a "
                             "cadence state file (read it with safetensors.torch.load_file)")
    if int(metadata["cadence"]) > VERSION:
        raise StateFileError(f"it was written by a newer cadence (version "
                             f"{metadata['cadence']})")
    tree, names = json.loads(metadata["tree"]), json.loads(metadata["names"])
    complex_dtypes = json.loads(metadata.get("complex", "{}"))
    if not isinstance(names, list) or len(names) != len(header) or set(names) != set(header):
        raise StateFileError("its header does not name the tensors its metadata does")
    tensors: list[torch.Tensor] = [torch.empty(0)] * len(names)
    position = 0
    for index in sorted(range(len(names)), key=lambda i: header[names[i]]["data_offsets"][0]):
        info = header[names[index]]
        begin, end = (int(n) for n in info["data_offsets"])
        shape = [int(n) for n in info["shape"]]
        if names[index] in complex_dtypes:
            dtype = _DTYPES[complex_dtypes[names[index]]]
            if shape[-1:] != [2] or _COMPLEX_PARTS[complex_dtypes[names[index]]] != info["dtype"]:
                raise StateFileError("its header describes a complex tensor inconsistently")
            shape = shape[:-1]
        else:
            dtype = FROM_SAFETENSORS[info["dtype"]]
        tensor = torch.empty(shape, dtype=dtype)
        if (begin != position or min(shape, default=0) < 0
                or end - begin != tensor.numel() * tensor.element_size()):
            raise StateFileError("its header describes the tensors inconsistently")
        if end > begin:
            take_into(tensor)
        position = end
        tensors[index] = tensor
    return _decode(tree, tensors)


def read_state(file: str | os.PathLike[str] | BinaryIO, sha256: str | None = None) -> Any:
    """Reads what `write_state` wrote; nothing in the file is executed. Files of earlier
    versions (cadence's own layout, behind ``CADENCE-STATE`` magic bytes) are read too.

    Args:
        file: a path or a binary stream positioned at the start of a state file.
        sha256: the expected SHA-256 of the file; when given, the bytes are hashed as they are
            read (no second pass) and a difference raises.

    Raises:
        StateFileError: if the file is not a state file, is truncated, or does not match
            `sha256`.
    """
    if isinstance(file, (str, os.PathLike)):
        with open(file, "rb", buffering=0) as handle:
            return read_state(handle, sha256)
    digest = hashlib.sha256() if sha256 is not None else None

    def take(size: int) -> bytes:
        data = file.read(size)
        if data is None or len(data) != size:
            raise StateFileError("the file is truncated")
        if digest is not None:
            digest.update(data)
        return data

    def take_into(tensor: torch.Tensor) -> None:
        view = _byte_view(tensor)
        done = 0
        while done < len(view):
            read = file.readinto(view[done:])  # type: ignore[attr-defined]
            if not read:
                raise StateFileError("the file is truncated")
            done += read
        if digest is not None:
            digest.update(view)

    first = take(8)
    legacy = first == MAGIC[:8]
    if legacy and take(len(MAGIC) - 8) != MAGIC[8:]:
        raise StateFileError("it is not a cadence state file (wrong magic bytes)")
    (length,) = struct.unpack("<Q", take(8) if legacy else first)
    if length > _MAX_HEADER:
        raise StateFileError("it is not a cadence state file (its first bytes are not a "
                             "safetensors header)" if not legacy else
                             f"its header length ({length} bytes) is implausible")
    try:
        header = json.loads(take(length).decode("utf-8"))
        if not isinstance(header, dict):
            raise StateFileError("it is not a cadence state file (its header is not an object)")
        state = (_read_legacy(header, length, take, take_into) if legacy
                 else _read_safetensors(header, take_into))
    except (KeyError, TypeError, ValueError, IndexError, UnicodeDecodeError,
            RuntimeError) as error:
        if isinstance(error, StateFileError):
            raise
        if not legacy and isinstance(error, (UnicodeDecodeError, json.JSONDecodeError)):
            raise StateFileError("it is not a cadence state file (its first bytes are not a "
                                 "safetensors header)") from None
        raise StateFileError(f"its header is damaged ({type(error).__name__}: {error})") from None
    if digest is not None:
        if file.read(1):
            raise StateFileError("it has bytes after its end")
        if digest.hexdigest() != sha256:
            raise StateFileError("its bytes do not match its SHA-256 checksum (they changed "
                                 "after it was written)")
    return state


def _read_legacy(header: dict[str, Any], length: int, take: Any, take_into: Any) -> Any:
    """The state of a version 1 file (magic bytes, cadence's header, 64-byte aligned data)."""
    entries, tree = header["tensors"], header["tree"]
    if header.get("version", 0) > 1:
        raise StateFileError(f"it was written by a newer cadence (version {header['version']})")
    take(_padding(len(MAGIC) + 8 + length))
    tensors: list[torch.Tensor] = []
    position = 0
    for entry in entries:
        dtype, shape = _DTYPES[entry["dtype"]], [int(n) for n in entry["shape"]]
        offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        tensor = torch.empty(shape, dtype=dtype)
        if (offset < position or min(shape, default=0) < 0
                or nbytes != tensor.numel() * tensor.element_size()):
            raise StateFileError("its header describes the tensors inconsistently")
        take(offset - position)
        if nbytes:
            take_into(tensor)
        position = offset + nbytes
        tensors.append(tensor)
    return _decode(tree, tensors)
