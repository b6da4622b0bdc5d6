"""Token shards: a corpus tokenized once into flat arrays on disk, memory-mapped, read as
untrusted input.

On disk:

- a **token file** is a flat array of token ids, ``uint16`` or ``uint32``, little-endian, and
  nothing else: nanoGPT's ``train.bin`` (``np.array(ids, np.uint16).tofile(path)``) as it is;
- a **prepared folder** (``cadence prepare-data``, `write_token_folder`) holds token files, for
  each an index of where its documents start (an ``int64`` ``.npy``: offsets in tokens, the
  first 0), and ``manifest.json``, written last and renamed into place, which names them with
  their sizes and SHA-256s, the dtype, the tokenizer and the document count. A folder without
  its manifest was not finished and is never read.

`open_token_files` reads an ``input_path`` entry: a folder of prepared shards, a file (``uint16``
unless a ``manifest.json`` beside it lists it), or a glob of files. What a manifest says is
checked before anything is read: names that stay in its folder (`plain_name`), opened without
following a link; every file's size against the manifest; each document index's header, length,
order and bounds. A mistake is one `ConfigError` line that names the file and what to do.

`TokenShards` is those files as one source of samples: windows of ``sequence_length + 1``
tokens cut from each file end to end (nanoGPT's ``x = data[i:i+L]``, ``y = data[i+1:i+1+L]``,
without overlap), never across two files. With ``packing`` a window's documents are kept apart
(`cadence.data.packing`). It is a map-style dataset (evaluation reads it through a
``DataLoader``); `cadence.data.token_loader.TokenLoader` reads whole batches of it for training.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from cadence.core.errors import ConfigError
from cadence.core.files import open_regular, plain_name

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


class TokenShards(Dataset[Any]):
    """Token files read as one source of samples: windows of ``sequence_length + 1`` tokens.

    Sample ``i`` is a window of one file: the files end to end, each cut into
    ``(num_tokens - 1) // sequence_length`` windows that overlap by one token (the last
    target of one window is the first input of the next), never across two files.

    As a map-style dataset, item ``i`` is ``(inputs, labels)`` (``int64`` tensors of
    ``sequence_length``), or with `packing` ``({"input_ids", "position_ids"}, labels)`` with
    each window's documents kept apart (`cadence.data.packing`).

    Args:
        files: the token files (`open_token_files`).
        sequence_length: tokens of context per sample.
        packing: keep documents apart (position ids restart, no target across a boundary).
        name: how messages name this source (its ``input_path``).

    Raises:
        ConfigError: if no file holds one window.
    """

    def __init__(self, files: Sequence[TokenFile], sequence_length: int, packing: bool = False,
                 name: str = "") -> None:
        if sequence_length < 1:
            raise ValueError(f"sequence_length (got {sequence_length}) must be >= 1.")
        self.files = list(files)
        self.sequence_length = sequence_length
        self.packing = packing
        self.name = name or ", ".join(str(file.path) for file in self.files)
        windows = np.array([max(file.tokens.size - 1, 0) // sequence_length
                            for file in self.files], dtype=np.int64)
        self._first = np.concatenate([[0], np.cumsum(windows)])
        """The first sample of each file, and the number of samples last."""
        if packing and not any(file.documents is not None for file in self.files):
            raise ConfigError(
                f"input_path {self.name!r} has no document index (raw token files), so "
                "packing has no documents to keep apart. Prepare the text with cadence "
                "prepare-data (it writes the index), or set packing=false.")
        if not len(self):
            tokens = sum(file.tokens.size for file in self.files)
            raise ConfigError(
                f"input_path {self.name!r} holds {tokens} tokens in {len(self.files)} file(s): "
                f"not one window of sequence_length + 1 = {sequence_length + 1} tokens. Give it "
                "more data, or a shorter sequence_length.")
        self._window = np.arange(sequence_length + 1, dtype=np.int64)
        declared = {file.vocab_size for file in self.files}
        self.vocab_size: int | None = (max(declared) if None not in declared  # type: ignore[type-var]
                                       else None)
        """The tokenizer's vocabulary where every file's manifest says; else None."""

    @classmethod
    def open(cls, spec: str, sequence_length: int, packing: bool = False) -> TokenShards:
        """The files of an ``input_path`` entry or a comma-separated list of them, as one source.

        Raises:
            ConfigError: as `open_token_files`, or if they hold no window.
        """
        files = [file for part in split_paths(spec) for file in open_token_files(part)]
        return cls(files, sequence_length, packing, name=spec)

    def __len__(self) -> int:
        return int(self._first[-1])

    @property
    def digest(self) -> list[str]:
        """What identifies the files and their order (checked when a run resumes)."""
        return [file.digest for file in self.files]

    def check_vocabulary(self, vocab_size: int | None) -> None:
        """Refuses files tokenized with a larger vocabulary than `vocab_size` (the model's),
        where their manifest says; with `packing`, files without a document index.

        Raises:
            ValueError: saying which, and the fix.
        """
        if vocab_size is not None and (self.vocab_size or 0) > vocab_size:
            raise ValueError(f"input_path {self.name!r} was tokenized with a vocabulary of "
                             f"{self.vocab_size}, larger than the model's {vocab_size}: set the "
                             f"model's vocab_size to at least {self.vocab_size}.")

    def check_tokens(self, tokens: np.ndarray, vocab_size: int | None) -> None:
        """Refuses a token the model has no embedding for, in files that do not say their
        vocabulary (a raw ``train.bin``): on a GPU it would be a device-side assert instead.

        Raises:
            ValueError: naming the token and the vocab_size that holds it.
        """
        largest = int(tokens.max()) if tokens.size else 0
        if vocab_size is not None and largest >= vocab_size:
            raise ValueError(
                f"input_path {self.name!r} holds token {largest}, outside the model's "
                f"vocabulary of {vocab_size}: set the model's vocab_size to at least "
                f"{largest + 1} (GPT-2's tokens need 50304), or name token files of another "
                "tokenizer.")

    def read(self, samples: np.ndarray, with_documents: bool = False
             ) -> tuple[np.ndarray, np.ndarray | None]:
        """The windows of `samples` (``[n, sequence_length + 1]`` ``int64``), and with
        `with_documents` for each token the offset in its window where its document starts
        (0 where it started before the window)."""
        length = self.sequence_length
        tokens = np.empty((len(samples), length + 1), dtype=np.int64)
        starts = np.zeros_like(tokens) if with_documents else None
        owner = np.searchsorted(self._first, samples, side="right") - 1
        for index in np.unique(owner):
            rows = np.flatnonzero(owner == index)
            file = self.files[index]
            offsets = (samples[rows] - self._first[index]) * length
            for row, offset in zip(rows.tolist(), offsets.tolist()):
                tokens[row] = file.tokens[offset: offset + length + 1]
            if starts is not None and file.documents is not None:
                positions = offsets[:, None] + self._window
                document = np.searchsorted(file.documents, positions, side="right") - 1
                starts[rows] = np.maximum(file.documents[document] - offsets[:, None], 0)
        return tokens, starts

    def __getitem__(self, index: int) -> Any:
        from cadence.data.packing import make_batch

        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of a source of {len(self)}")
        tokens, starts = self.read(np.array([index]), self.packing)
        batch = make_batch(tokens, starts)
        return tuple(_first(part) for part in batch)


def _first(value: Any) -> Any:
    """Row 0 of a batch's tensors (a sample, for a DataLoader to collate)."""
    if isinstance(value, dict):
        return {key: tensor[0] for key, tensor in value.items()}
    return value[0]


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
    partial = folder.with_name(f".{folder.name}.partial-{os.getpid()}-{os.urandom(4).hex()}")
    partial.mkdir()
    return partial


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
