"""`TokenShards`: token files (`cadence.data.token_format`) read as one source of samples.

Samples are windows of ``sequence_length + 1`` tokens cut from each file end to end (nanoGPT's
``x = data[i:i+L]``, ``y = data[i+1:i+1+L]``, without overlap), never across two files. With
``packing`` a window's documents are kept apart (`cadence.data.packing`). It is a map-style
dataset (evaluation reads it through a ``DataLoader``); `cadence.data.token_loader.TokenLoader`
reads whole batches of it for training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from cadence.core.errors import ConfigError
from cadence.data.packing import make_batch
from cadence.data.token_format import TokenFile, open_token_files, split_paths


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
            ConfigError: saying which, and the fix.
        """
        if vocab_size is not None and (self.vocab_size or 0) > vocab_size:
            raise ConfigError(f"input_path {self.name!r} was tokenized with a vocabulary of "
                             f"{self.vocab_size}, larger than the model's {vocab_size}: set the "
                             f"model's vocab_size to at least {self.vocab_size}.")

    def check_tokens(self, tokens: np.ndarray, vocab_size: int | None) -> None:
        """Refuses a token the model has no embedding for, in files that do not say their
        vocabulary (a raw ``train.bin``): on a GPU it would be a device-side assert instead.

        Raises:
            ConfigError: naming the token and the vocab_size that holds it (a user's data and
                config disagree: the ``cadence`` command's exit 2).
        """
        largest = int(tokens.max()) if tokens.size else 0
        if vocab_size is not None and largest >= vocab_size:
            raise ConfigError(
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
