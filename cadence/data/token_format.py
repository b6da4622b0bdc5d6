"""The on-disk format of token shards, read as untrusted input and written atomically.

On disk:

- a **token file** is a flat array of token ids, ``uint16`` or ``uint32``, little-endian, and
  nothing else: nanoGPT's ``train.bin`` (``np.array(ids, np.uint16).tofile(path)``) as it is;
- a **prepared folder** (``cadence prepare-data``, `begin_token_folder` ... `finish_token_folder`)
  holds token files, for each an index of where its documents start (an ``int64`` ``.npy``:
  offsets in tokens, the first 0), and ``manifest.json``, written last, which names them with
  their sizes and SHA-256s, the dtype, the tokenizer and the document count. The folder is
  written under a hidden name and renamed into place after its manifest: a preparation that
  dies leaves nothing that is read as prepared.

`open_token_files` reads an ``input_path`` entry: a folder of prepared shards, a file (``uint16``
unless a ``manifest.json`` beside it lists it), or a glob of files. What a manifest says is
checked before anything is read: names that stay in its folder (`plain_name`), opened without
following a link; every file's size against the manifest; each document index's header, length,
order and bounds. A mistake is one `ConfigError` line that names the file and what to do.

It needs NumPy, not torch: ``cadence prepare-data``'s worker processes start light.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cadence.core.errors import ConfigError
from cadence.core.files import open_regular, plain_name

logger = logging.getLogger("cadence")

MANIFEST = "manifest.json"
FORMAT = "cadence-token-shards"
VERSION = 1
TOKEN_DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
"""The dtypes of token files, by the name a manifest gives them."""
_MAX_MANIFEST = 64 << 20
"""A manifest larger than this is not one cadence wrote (an entry is ~300 bytes: 64 MB holds
~200,000 files)."""


@dataclass(frozen=True)
class TokenFile:
    """One token file, memory-mapped, with where its documents start.

    Attributes:
        path: where it was read from.
        tokens: the token ids (a read-only memory map; an empty array for an empty file).
        documents: the offsets where its documents start (``int64``, the first 0, increasing),
            or None: one document (a raw ``train.bin``).
        vocab_size: the tokenizer's vocabulary, where a manifest says; None for a raw file.
        digest: what identifies its content in a checkpoint: its manifest's SHA-256, or its
            name and size for a raw file.
    """

    path: Path
    tokens: np.ndarray
    documents: np.ndarray | None
    vocab_size: int | None
    digest: str


def _problem(path: Path | str, what: str, fix: str) -> ConfigError:
    return ConfigError(f"{str(path)!r} {what}. {fix}")


_PREPARE_AGAIN = "Prepare the data again (cadence prepare-data), or name another input_path."


def _open_read(path: Path, follow: bool) -> Any:
    """A binary file object of `path`; through a link only where `follow` (a path the user
    named), else refused as `open_regular` refuses it (a name read from a manifest)."""
    if follow:
        return open(path, "rb")  # closed by the caller
    try:
        return os.fdopen(open_regular(path, os.O_RDONLY, where="data folder"), "rb")
    except FileNotFoundError:
        raise _problem(path, "is listed in its folder's manifest but does not exist",
                       _PREPARE_AGAIN) from None


def _memmap(handle: Any, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    """`count` items of `dtype` from `offset` of an open file, memory-mapped read-only."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(handle, dtype=dtype, mode="r", offset=offset, shape=(count,))


def read_token_file(path: Path, dtype: np.dtype, num_tokens: int | None = None,
                    follow: bool = True) -> np.ndarray:
    """The tokens of `path` as a memory map: its size a whole number of `dtype` items, and
    `num_tokens` of them where a manifest says how many.

    Raises:
        ConfigError: if the file's size does not fit (truncated, or not a token file), or it is
            a link where `follow` is false.
    """
    with _open_read(path, follow) as handle:
        size = os.fstat(handle.fileno()).st_size
        if num_tokens is not None and size != num_tokens * dtype.itemsize:
            raise _problem(path, f"holds {size} bytes where its manifest says {num_tokens} "
                           f"tokens of {dtype.name} ({num_tokens * dtype.itemsize} bytes): it "
                           "is truncated or not the file that was prepared", _PREPARE_AGAIN)
        if size % dtype.itemsize:
            raise _problem(path, f"holds {size} bytes, not a whole number of {dtype.name} "
                           f"tokens ({dtype.itemsize} bytes each): it is truncated or not a "
                           "token file", "Name a token file (nanoGPT's train.bin: uint16), or "
                           "a folder prepared by cadence prepare-data.")
        return _memmap(handle, dtype, 0, size // dtype.itemsize)


def read_document_index(path: Path, num_documents: int, num_tokens: int) -> np.ndarray:
    """The document starts of a token file of `num_tokens` tokens: an ``.npy`` of `num_documents`
    ``int64`` offsets, the first 0, increasing, each below `num_tokens`. Its header is parsed by
    NumPy's own reader (no pickle), and the file is opened without following a link.

    Raises:
        ConfigError: for a file that is not such an index (truncated, forged, out of bounds).
    """
    def forged(what: str) -> ConfigError:
        return _problem(path, f"is not a document index of its token file: {what}",
                        _PREPARE_AGAIN)

    with _open_read(path, follow=False) as handle:
        size = os.fstat(handle.fileno()).st_size
        try:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
            else:
                raise ValueError(f"unknown .npy version {version}")
        except (ValueError, OSError, SyntaxError) as error:
            raise forged(f"its .npy header cannot be read ({error})") from None
        if dtype != np.dtype("<i8") or fortran or shape != (num_documents,):
            raise forged(f"it holds {dtype} of shape {shape}, its manifest says int64 of shape "
                         f"({num_documents},)")
        offset = handle.tell()
        if size != offset + 8 * num_documents:
            raise forged(f"it holds {size - offset} bytes of offsets where {num_documents} "
                         f"documents take {8 * num_documents} (truncated?)")
        starts = _memmap(handle, np.dtype("<i8"), offset, num_documents)
    if num_documents and (starts[0] != 0 or starts[-1] >= max(num_tokens, 1)
                          or bool(np.any(np.diff(starts) <= 0))):
        raise forged(f"its offsets must start at 0, increase, and stay below the file's "
                     f"{num_tokens} tokens")
    if num_tokens and not num_documents:
        raise forged(f"it lists no document for {num_tokens} tokens")
    return starts


def _check_manifest(manifest: Any, path: Path) -> dict[str, Any]:
    """`manifest` (parsed JSON) if it is a manifest cadence writes, every value of the type and
    range it must have."""
    def forged(what: str) -> ConfigError:
        return _problem(path, f"is not a manifest of prepared token shards: {what}",
                        _PREPARE_AGAIN)

    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise forged(f"it has no \"format\": \"{FORMAT}\"")
    if manifest.get("version") != VERSION:
        raise forged(f"its version is {manifest.get('version')!r}; this cadence reads {VERSION}")
    if manifest.get("dtype") not in TOKEN_DTYPES:
        raise forged(f"its dtype {manifest.get('dtype')!r} is not one of {sorted(TOKEN_DTYPES)}")
    tokenizer = manifest.get("tokenizer")
    vocab = tokenizer.get("vocab_size") if isinstance(tokenizer, dict) else None
    if not _count(vocab) or vocab > 2 ** (8 * TOKEN_DTYPES[manifest["dtype"]].itemsize):
        raise forged(f"its tokenizer's vocab_size ({vocab!r}) is not a count its dtype holds")
    files = manifest.get("files")
    if not isinstance(files, list):
        raise forged("it has no list of \"files\"")
    for entry in files:
        if not isinstance(entry, dict) or not plain_name(entry.get("tokens")):
            raise forged(f"an entry {str(entry)[:80]!r} names no token file in its folder")
        documents = entry.get("documents")
        if documents is not None and not plain_name(documents):
            raise forged(f"{entry['tokens']!r}'s document index {documents!r} is not a name in "
                         "its folder")
        for key in ("num_tokens", "num_documents"):
            if not _count(entry.get(key), zero=True):
                raise forged(f"{entry['tokens']!r} has no count {key!r}")
    return manifest


def _count(value: Any, zero: bool = False) -> bool:
    """Whether `value` is an int (not a bool) >= 1 (>= 0 with `zero`)."""
    return type(value) is int and value >= (0 if zero else 1)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The checked manifest of a prepared folder, or None where it has none.

    Raises:
        ConfigError: for a manifest that is not one cadence writes (see `_check_manifest`), or
            a link in its place.
    """
    path = folder / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None
    with _open_read(path, follow=False) as handle:
        text = handle.read(_MAX_MANIFEST + 1)
    if len(text) > _MAX_MANIFEST:
        raise _problem(path, f"is larger than {_MAX_MANIFEST >> 20} MB: not a manifest cadence "
                       "wrote", _PREPARE_AGAIN)
    try:
        manifest = json.loads(text)
    except (UnicodeDecodeError, ValueError) as error:
        raise _problem(path, f"is not JSON ({error})", _PREPARE_AGAIN) from None
    checked = _check_manifest(manifest, path)
    checked["_sha256"] = hashlib.sha256(text).hexdigest()
    return checked


def _from_manifest(folder: Path, manifest: dict[str, Any],
                   entries: Iterable[dict[str, Any]]) -> list[TokenFile]:
    dtype = TOKEN_DTYPES[manifest["dtype"]]
    vocab = int(manifest["tokenizer"]["vocab_size"])
    files = []
    for entry in entries:
        tokens = read_token_file(folder / entry["tokens"], dtype, entry["num_tokens"],
                                 follow=False)
        documents = (read_document_index(folder / entry["documents"], entry["num_documents"],
                                         entry["num_tokens"])
                     if entry.get("documents") is not None else None)
        files.append(TokenFile(folder / entry["tokens"], tokens, documents, vocab,
                               f"{manifest['_sha256']}:{entry['tokens']}"))
    return files


def _one_file(path: Path) -> TokenFile:
    """A file the user named (or a glob matched): as the manifest beside it lists it, else a
    raw ``uint16`` file (nanoGPT's)."""
    manifest = read_manifest(path.parent)
    if manifest is not None:
        listed = [entry for entry in manifest["files"] if entry["tokens"] == path.name]
        if listed:
            return _from_manifest(path.parent, manifest, listed)[0]
    dtype = TOKEN_DTYPES["uint16"]
    tokens = read_token_file(path, dtype)
    return TokenFile(path, tokens, None, None, f"{path.name}:{tokens.size}")


def open_token_files(spec: str) -> list[TokenFile]:
    """The token files one ``input_path`` entry names: a folder of prepared shards (as its
    manifest lists them), a file, or a glob of files (sorted).

    Raises:
        ConfigError: for a path that does not exist, a glob that matches nothing, a folder
            without a manifest, or any file that is not what it must be.
    """
    path = Path(spec).expanduser()
    if glob.has_magic(spec):
        matches = sorted(Path(match) for match in glob.glob(str(path)))
        files = [match for match in matches if match.is_file()]
        if not files:
            raise ConfigError(f"input_path {spec!r} matches no file. Name token files (a glob "
                              "such as data/*.bin), or a folder prepared by cadence "
                              "prepare-data.")
        return [_one_file(match) for match in files]
    if path.is_dir():
        manifest = read_manifest(path)
        if manifest is None:
            raise _problem(path, f"is a folder without a {MANIFEST}: not prepared token shards "
                           "(or its preparation did not finish)", "Prepare it with cadence "
                           "prepare-data, or name its token files with a glob (data/*.bin).")
        return _from_manifest(path, manifest, manifest["files"])
    if not path.exists():
        raise ConfigError(f"input_path {spec!r} does not exist. Name a token file (nanoGPT's "
                          "train.bin), a glob of them, or a folder prepared by cadence "
                          "prepare-data.")
    return [_one_file(path)]


def split_paths(spec: str) -> list[str]:
    """The entries of a comma-separated ``input_path`` (TF Model Garden's spelling), stripped.

    >>> split_paths("data/web, data/code")
    ['data/web', 'data/code']
    """
    return [part.strip() for part in spec.split(",") if part.strip()]


# ---------------------------------------------------------------------------- writing


def token_dtype(vocab_size: int) -> str:
    """The smallest token dtype that holds a vocabulary: ``uint16`` up to 65,536 ids.

    >>> token_dtype(50257), token_dtype(128256)
    ('uint16', 'uint32')
    """
    return "uint16" if vocab_size <= 2 ** 16 else "uint32"


def begin_token_folder(folder: Path) -> Path:
    """A new hidden folder beside `folder` to prepare it in (`finish_token_folder` renames it
    into place): what a preparation that dies leaves is never read as `folder`.

    Raises:
        ConfigError: if `folder` exists already.
    """
    if folder.exists() or folder.is_symlink():
        raise ConfigError(f"{str(folder)!r} exists already: prepared shards are written once. "
                          "Choose another output folder, or remove it first.")
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(folder)
    partial = folder.with_name(f".{folder.name}.partial-{os.getpid()}-{os.urandom(4).hex()}")
    partial.mkdir()
    return partial


def _remove_stale_partials(folder: Path) -> None:
    """Removes what preparations of `folder` that died left (their process is gone)."""
    import shutil

    for partial in folder.parent.glob(f".{glob.escape(folder.name)}.partial-*"):
        pid = partial.name.rsplit(".partial-", 1)[1].split("-")[0]
        if not pid.isdigit() or partial.is_symlink() or not partial.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(partial, ignore_errors=True)
            logger.info("Removed %s, left by a preparation that did not finish.", partial)
        except PermissionError:
            pass  # another user's process: alive


def write_shard(partial: Path, name: str, tokens: np.ndarray, documents: np.ndarray
                ) -> dict[str, Any]:
    """Writes one token file (`tokens`, already of its dtype) and its document index into a
    folder being prepared, flushed to disk; returns its manifest entry (sizes, SHA-256s)."""
    from cadence.core.checkpoint_dir import file_sha256

    entry: dict[str, Any] = {"tokens": f"{name}.bin", "num_tokens": int(tokens.size),
                             "documents": f"{name}.documents.npy",
                             "num_documents": int(documents.size)}
    for file, array in ((entry["tokens"], tokens),
                        (entry["documents"], documents.astype("<i8", copy=False))):
        with open(partial / file, "wb") as handle:
            if file.endswith(".npy"):
                np.lib.format.write_array(handle, array, allow_pickle=False)
            else:
                array.astype(array.dtype.newbyteorder("<"), copy=False).tofile(handle)
            handle.flush()
            os.fsync(handle.fileno())
    entry["sha256"] = file_sha256(partial / entry["tokens"])
    entry["documents_sha256"] = file_sha256(partial / entry["documents"])
    return entry


def finish_token_folder(partial: Path, folder: Path, entries: Sequence[dict[str, Any]],
                        dtype: str, tokenizer: dict[str, Any]) -> Path:
    """Writes the manifest of a prepared folder last, then renames the folder into place. If
    another process finished the same folder first (ranks preparing one cache), its folder is
    kept and this one removed. Returns `folder`."""
    import shutil

    from cadence.core.checkpoint_dir import fsync_path, write_atomically

    manifest = {"format": FORMAT, "version": VERSION, "dtype": dtype, "tokenizer": tokenizer,
                "num_tokens": sum(entry["num_tokens"] for entry in entries),
                "num_documents": sum(entry["num_documents"] for entry in entries),
                "files": list(entries)}
    write_atomically(partial / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    fsync_path(partial)
    try:
        os.rename(partial, folder)
    except OSError:
        if not (folder / MANIFEST).is_file():
            raise
        shutil.rmtree(partial, ignore_errors=True)  # another process prepared it first
    fsync_path(folder.parent)
    return folder
