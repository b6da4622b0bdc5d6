"""What a checkpoint holds, in words: its step, files, tensors and values, and the run's config.

`describe_checkpoint` is what ``cadence inspect`` prints. It reads headers, not tensors:
state files are safetensors files (`cadence.engine.state_file`), whose tensors it lists with
``safetensors.safe_open``; sharded state is listed from DCP's ``.metadata``, read with the
restricted unpickler of `cadence.engine.dcp_reading`. Nothing it reads runs code, and with
``verify=True`` every file is checked against the SHA-256 in the manifest.

>>> print("\\n".join(describe_checkpoint("runs/mine")))  # doctest: +SKIP
checkpoint runs/mine/checkpoints/ckpt-300: step 300, 1 process, written 2026-11-26 02:40 UTC
...
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from cadence.core.checkpoint_dir import CheckpointDirectory, read_manifest, verify_files
from cadence.core.errors import CheckpointError

_MAX_VALUES = 40


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"  # unreachable; for the type checker


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The checkpoint `path` names: a ``ckpt-<step>`` directory itself, or the newest
    complete one of a checkpoints directory or of a run directory (its ``checkpoints/``).

    Raises:
        CheckpointError: when there is none, saying what was found.
    """
    path = Path(path)
    if (path / "manifest.json").is_file():
        return path
    for directory in (path / "checkpoints", path):
        if directory.is_dir():
            latest = CheckpointDirectory(directory, None).latest()
            if latest is not None:
                return latest.path
    raise CheckpointError(f"{str(path)!r} is not a checkpoint, and holds no complete one: pass "
                          "a ckpt-<step> directory, a checkpoints directory or a run directory.")


def _leaves(node: Any, path: str) -> list[tuple[str, Any]]:
    """The non-tensor values of an encoded state tree (`state_file`), by path."""
    if isinstance(node, list):
        return [leaf for i, v in enumerate(node) for leaf in _leaves(v, f"{path}.{i}")]
    if isinstance(node, dict) and "d" in node and set(node) <= {"d", "m"}:
        found = []
        for key, value in node["d"]:
            text = key if isinstance(key, str) else json.dumps(key)
            found += _leaves(value, f"{path}.{text}" if path else text)
        return found
    if isinstance(node, dict) and len(node) == 1:
        ((tag, value),) = node.items()
        if tag in ("T", "N"):
            return []
        if tag == "t":
            return _leaves(value, path)
        return [(path, _plain(tag, value))]
    return [(path, node)]


def _plain(tag: str, value: Any) -> Any:
    """A tagged value of a state tree, as it is shown."""
    if tag == "f":
        return float(value)
    if tag == "S":
        return tuple(value)
    if tag == "b":
        return f"<{len(value) * 3 // 4} bytes>"
    return str(value)


def _state_file_lines(file: Path) -> list[str]:
    """The tensors and values of one state file, from its header."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as opened:
            metadata = opened.metadata() or {}
            rows = []
            for name in opened.keys():  # noqa: SIM118 - a safe_open handle, not a dict
                part = opened.get_slice(name)
                rows.append((name, part.get_dtype(), part.get_shape()))
    except (SafetensorError, OSError):
        return [f"  {file.name}: not a safetensors file (a state file of an earlier cadence, "
                "or not cadence's); restore it to read it"]
    from cadence.engine.state_file import FROM_SAFETENSORS

    def element(dtype: str) -> int:
        known = FROM_SAFETENSORS.get(dtype)
        return known.itemsize if known is not None else 1
    total = sum(element(dtype) * _numel(shape) for _, dtype, shape in rows)
    lines = [f"  {file.name}: {len(rows)} tensors, {_size(total)}"]
    for name, dtype, shape in sorted(rows):
        lines.append(f"    {name}  {dtype}  {list(shape)}  "
                     f"{_size(element(dtype) * _numel(shape))}")
    values = _leaves(json.loads(metadata["tree"]), "") if "tree" in metadata else []
    random = [path for path, _ in values if path.startswith("rng.")]
    values = [(path, value) for path, value in values if not path.startswith("rng.")]
    if random:
        lines.append(f"  {file.name}: random states ({len(random)} values: "
                     f"{', '.join(sorted({p.split('.')[1] for p in random}))})")
    if values:
        lines.append(f"  {file.name}: {len(values)} other values")
        for path, value in values[:_MAX_VALUES]:
            lines.append(f"    {path} = {value!r}")
        if len(values) > _MAX_VALUES:
            lines.append(f"    ... {len(values) - _MAX_VALUES} more")
    return lines


def _numel(shape: Any) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def _sharded_lines(folder: Path, manifest: dict[str, Any]) -> list[str]:
    """The tensors of a checkpoint's DCP folder, from its ``.metadata``."""
    from cadence.engine.dcp_reading import read_dcp_metadata

    if "sharded/.metadata" not in manifest.get("files", {}):
        return []
    with open(folder / ".metadata", "rb") as stream:
        metadata = read_dcp_metadata(stream, str(folder / ".metadata"))
    rows = []
    for name, entry in metadata.state_dict_metadata.items():
        size = getattr(entry, "size", None)
        if size is None:  # a value DCP pickled (read with weights_only=True at restore)
            continue
        dtype = str(entry.properties.dtype).removeprefix("torch.")
        rows.append((name, dtype, list(size), _numel(size) * entry.properties.dtype.itemsize))
    lines = [f"  sharded/ (DCP, {sum(1 for n in manifest['files'] if n.endswith('.distcp'))} "
             f"shard files): {len(rows)} tensors, {_size(sum(r[3] for r in rows))}"]
    lines += [f"    {name}  {dtype}  {shape}  {_size(nbytes)}"
              for name, dtype, shape, nbytes in sorted(rows)]
    return lines


def describe_checkpoint(path: str | os.PathLike[str], verify: bool = False,
                        config: bool = True) -> list[str]:
    """What the checkpoint at `path` (`find_checkpoint`) holds, as lines of text: its step,
    the processes that wrote it, when; its files and sizes (checked against their SHA-256
    with `verify`); the tensors of its state files and shards (name, dtype, shape, bytes)
    and its other values; with `config`, the run's ``params.yaml``.

    Raises:
        CheckpointError: if there is no checkpoint there, it is damaged (with `verify`), or
            its manifest is not cadence's.
    """
    checkpoint = find_checkpoint(path)
    manifest = read_manifest(checkpoint)
    when = datetime.datetime.fromtimestamp(manifest.get("time", 0), datetime.timezone.utc)
    world = int(manifest.get("world_size", 1))
    lines = [f"checkpoint {checkpoint}: step {manifest['step']}, {world} process"
             f"{'es' if world > 1 else ''}, written {when:%Y-%m-%d %H:%M} UTC"]
    files = manifest["files"]
    if verify:
        verify_files(checkpoint, manifest)
    lines.append(f"files: {len(files)}, {_size(sum(files.values()))}"
                 + (", every one matches its SHA-256" if verify else
                    " (sizes as listed; --verify checks their SHA-256)"))
    for name in sorted(files):
        lines.append(f"  {name}  {_size(files[name])}")
    lines.append("state:")
    for name in sorted(files):
        if name.endswith(".cadence"):
            lines += _state_file_lines(checkpoint / name)
    lines += _sharded_lines(checkpoint / "sharded", manifest)
    params = checkpoint.parent.parent / "params.yaml"
    if config and checkpoint.parent.name == "checkpoints" and params.is_file():
        lines.append(f"config ({params}):")
        lines += [f"  {line}" for line in params.read_text(encoding="utf-8").splitlines()]
    return lines
