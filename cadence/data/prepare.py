"""``cadence prepare-data``: text files tokenized once into a folder of token shards.

Each input file becomes one token file of the folder (`cadence.data.token_shards`): a text file
is one document, a ``.jsonl`` file one document per line (its ``text`` field). The tokenizer is
given by path and read locally, nothing downloaded and no code run: a ``tokenizer.json`` (the
``tokenizers`` library, what every transformers fast tokenizer is saved as), a folder that
``transformers.AutoTokenizer.from_pretrained`` reads (``local_files_only``), or ``bytes`` (each
byte a token, vocabulary 256). Files are tokenized in parallel worker processes; the folder is
written under a hidden name, its manifest last, and renamed into place, so that a preparation
that dies leaves nothing that is read as prepared.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from cadence.core.errors import ConfigError
from cadence.data.token_format import (
    begin_token_folder,
    finish_token_folder,
    token_dtype,
    write_shard,
)

logger = logging.getLogger("cadence")


@dataclass(frozen=True)
class Prepared:
    """What `prepare_data` wrote.

    Attributes:
        folder: the prepared folder.
        num_tokens: tokens in all its files.
        num_documents: documents in all its files.
        dtype: the token dtype (``uint16`` up to 65,536 ids, else ``uint32``).
        tokenizer: what the manifest says of the tokenizer.
    """

    folder: Path
    num_tokens: int
    num_documents: int
    dtype: str
    tokenizer: dict[str, Any]


def input_files(inputs: Sequence[str]) -> list[Path]:
    """The files `inputs` name (paths or globs), in order, each once.

    Raises:
        ConfigError: for an input that names no file.
    """
    found: list[Path] = []
    for spec in inputs:
        matches = ([Path(match) for match in sorted(glob.glob(spec))]
                   if glob.has_magic(spec) else [Path(spec)])
        files = [match for match in matches if match.is_file()]
        if not files:
            raise ConfigError(f"{spec!r} names no file: give text files, .jsonl files or "
                              "globs of them.")
        found += [file for file in files if file not in found]
    return found


def describe_tokenizer(spec: str) -> dict[str, Any]:
    """What a manifest records of the tokenizer `spec` names (its kind, path, SHA-256 and
    vocabulary), loaded once here to check it.

    Raises:
        ConfigError: for a path that is neither a tokenizer file nor a tokenizer folder, or a
            library that is not installed.
    """
    if spec == "bytes":
        return {"kind": "bytes", "vocab_size": 256}
    path = Path(spec).expanduser()
    if path.is_file():
        kind, digest_of = "tokenizers", [path]
    elif path.is_dir():
        kind, digest_of = "transformers", sorted(  # the tokenizer's files, not a model's
            p for p in path.iterdir() if p.is_file() and (
                any(word in p.name for word in ("token", "vocab", "merges"))
                or p.suffix == ".model"))
    else:
        raise ConfigError(f"--tokenizer {spec!r} does not exist: give a tokenizer.json, a folder "
                          "saved by a transformers tokenizer's save_pretrained, or bytes.")
    digest = hashlib.sha256()
    for file in digest_of:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    described: dict[str, Any] = {"kind": kind, "path": str(path.resolve()),
                                 "sha256": digest.hexdigest()}
    described["vocab_size"] = _vocab_size(_load_tokenizer(described))
    return described


def _load_tokenizer(described: dict[str, Any]) -> Any:
    """The tokenizer a description names (None for bytes)."""
    kind, path = described["kind"], described.get("path", "")
    try:
        if kind == "tokenizers":
            from tokenizers import Tokenizer

            return Tokenizer.from_file(path)
        if kind == "transformers":
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except ImportError as error:
        raise ConfigError(f"--tokenizer {path!r} needs {error.name}: pip install "
                          "'cadence[lmdata]'.") from None
    except Exception as error:  # the libraries' own errors for a file that is not theirs
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"--tokenizer {path!r} cannot be read as a {kind} tokenizer "
                          f"({first}).") from None
    return None


def _vocab_size(tokenizer: Any) -> int:
    if hasattr(tokenizer, "get_vocab_size"):  # tokenizers
        return int(tokenizer.get_vocab_size(with_added_tokens=True))
    return len(tokenizer)  # transformers: the base vocabulary and the added tokens


def read_documents(path: Path, text_key: str) -> list[str] | list[bytes]:
    """The documents of one input file: its lines' `text_key` fields for ``.jsonl``, else the
    whole file (as bytes, decoded as UTF-8 where a tokenizer reads text).

    Raises:
        ConfigError: for a ``.jsonl`` line that is not an object with a string `text_key`.
    """
    if path.suffix != ".jsonl":
        return [path.read_bytes()]
    documents: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                raise ConfigError(f"{str(path)!r} line {number} is not JSON ({error}).") from None
            text = record.get(text_key) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ConfigError(f"{str(path)!r} line {number} has no string field "
                                  f"{text_key!r}: set --text-key to the field with the text.")
            documents.append(text)
    return documents


def tokenize_file(path: Path, partial: Path, name: str, tokenizer: dict[str, Any],
                  dtype: str, text_key: str) -> dict[str, Any]:
    """Tokenizes one input file into the token file `name` of a folder being prepared; returns
    its manifest entry. Runs in a worker process."""

    documents = read_documents(path, text_key)
    if tokenizer["kind"] == "bytes":
        pieces = [np.frombuffer(document if isinstance(document, bytes) else document.encode(),
                                dtype=np.uint8) for document in documents]
    else:
        loaded = _load_tokenizer(tokenizer)
        texts = [document.decode("utf-8", errors="replace") if isinstance(document, bytes)
                 else document for document in documents]
        if tokenizer["kind"] == "tokenizers":
            pieces = [np.asarray(encoding.ids) for encoding in loaded.encode_batch(texts)]
        else:
            pieces = [np.asarray(ids) for ids in loaded(texts, add_special_tokens=False)[
                "input_ids"]]
    pieces = [piece for piece in pieces if piece.size]
    lengths = [piece.size for piece in pieces]
    tokens = (np.concatenate(pieces).astype(dtype) if pieces else np.empty(0, dtype=dtype))
    starts = np.cumsum([0, *lengths[:-1]], dtype=np.int64) if pieces else np.empty(0, np.int64)
    entry = write_shard(partial, name, tokens, starts)
    entry["source"] = path.name
    return entry


def prepare_data(inputs: Sequence[str], out: str | os.PathLike[str], tokenizer: str = "bytes",
                 workers: int = 1, text_key: str = "text",
                 progress: Callable[[str], None] | None = None) -> Prepared:
    """Tokenizes the files `inputs` names into a new folder `out` of token shards (see the
    module docstring).

    Args:
        inputs: text or ``.jsonl`` files, or globs of them; each becomes one token file.
        out: the folder to write; it must not exist.
        tokenizer: a ``tokenizer.json``, a transformers tokenizer folder, or ``bytes``.
        workers: processes that tokenize files at once (1: in this process).
        text_key: the field of a ``.jsonl`` line that holds its text.
        progress: called with each input file's name once it is written.

    Raises:
        ConfigError: for inputs that name no file, a tokenizer that cannot be read, an `out`
            that exists, or `workers` < 1 -- all before anything is written.
    """
    if workers < 1:
        raise ConfigError(f"--workers (got {workers}) must be at least 1.")
    files = input_files(inputs)
    described = describe_tokenizer(tokenizer)
    dtype = token_dtype(described["vocab_size"])
    folder = Path(out)
    partial = begin_token_folder(folder)
    jobs = [(path, partial, f"{number:05d}", described, dtype, text_key)
            for number, path in enumerate(files)]
    entries: list[dict[str, Any]] = []
    if workers == 1 or len(files) == 1:
        for job in jobs:
            entries.append(tokenize_file(*job))
            if progress is not None:
                progress(job[0].name)
    else:
        with ProcessPoolExecutor(min(workers, len(files)), mp_context=get_context("spawn")
                                 ) as pool:
            for job, entry in zip(jobs, pool.map(tokenize_file, *zip(*jobs))):
                entries.append(entry)
                if progress is not None:
                    progress(job[0].name)
    finish_token_folder(partial, folder, entries, dtype, described)
    prepared = Prepared(folder, sum(e["num_tokens"] for e in entries),
                        sum(e["num_documents"] for e in entries), dtype, described)
    logger.info("Prepared %d tokens in %d documents from %d files into %s (%s).",
                prepared.num_tokens, prepared.num_documents, len(files), folder, dtype)
    return prepared
