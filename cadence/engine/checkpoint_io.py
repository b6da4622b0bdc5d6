"""How a checkpoint's files are written and read: the `CheckpointIO` interface, `StateFileIO`
(the default: ``state.cadence``, no pickle), and `read_checkpoint`, which verifies every file
before its content is trusted.

The payload of earlier cadence versions written with ``torch.save`` (``state.pt``, by the
``TorchSaveIO`` that issue 30 removed) is refused in words: no saved checkpoint in the tests
(``tests/fixtures``) shows a user who needs it read. State files of format 1 are still read
(`cadence.engine.state_file`): ``tests/fixtures/state_format_1`` is such a checkpoint.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Protocol

from cadence.core.checkpoint_dir import read_manifest, verify_files
from cadence.core.errors import CheckpointError, CheckpointIncompatibleError
from cadence.engine.sharded import SHARDED_DIR
from cadence.engine.state_file import PackedState, StateFileError, read_state, write_state

logger = logging.getLogger("cadence")

STATE_FILE = "state.cadence"
_TORCH_SAVE_FILE = "state.pt"
"""The payload of checkpoints that earlier versions wrote with ``torch.save``: refused."""


class CheckpointIO(Protocol):
    """Writes and reads the payload of one checkpoint inside its (staging) directory.

    ``save`` may return the SHA-256 digests of the files it wrote (computed while writing);
    the commit reads back and hashes any file it does not get a digest for.
    """

    def save(self, payload: dict[str, Any], directory: Path) -> dict[str, str] | None: ...

    def load(self, directory: Path) -> dict[str, Any]: ...


def read_state_file(path: Path, sha256: str | None) -> Any:
    """The content of a state file, checked against `sha256` as it is read."""
    try:
        return read_state(path, sha256)
    except StateFileError as error:
        raise CheckpointError(f"Checkpoint file {str(path)!r} is damaged: {error}. Restore an "
                              "older checkpoint instead.") from None
    except OSError as error:
        raise CheckpointError(f"Cannot read {str(path)!r}: {error}.") from error


class StateFileIO:
    """The default `CheckpointIO`: one ``state.cadence`` (`cadence.engine.state_file`).

    Writing is one large write per tensor, hashed on the way (the GIL is released for nearly
    all of it); reading checks the SHA-256 in the same pass and executes nothing.

    Raises:
        CheckpointIncompatibleError: from `load`, for a checkpoint of an earlier cadence whose
            payload is ``torch.save``'s ``state.pt``, which is not read (nothing unpickled).
    """

    filename = STATE_FILE
    verified_files = (STATE_FILE,)
    """Files whose checksum `load` checks itself (the manager does not read them twice)."""

    def save(self, payload: dict[str, Any] | PackedState, directory: Path) -> dict[str, str]:
        return {self.filename: write_state(payload, directory / self.filename)}

    def load(self, directory: Path) -> dict[str, Any]:
        path = directory / self.filename
        if not path.is_file() and (directory / _TORCH_SAVE_FILE).is_file():
            raise CheckpointIncompatibleError(
                f"{str(directory)!r} was written by an earlier cadence with torch.save "
                f"({_TORCH_SAVE_FILE}), a format this version does not read. Continue that run "
                "with the cadence that wrote it, or load its weights in an `init_fn` "
                f"(torch.load(<checkpoint>/{_TORCH_SAVE_FILE}, weights_only=True)).")
        manifest = read_manifest(directory, sizes_of=(self.filename,))
        payload = read_state_file(path, manifest.get("sha256", {}).get(self.filename))
        if not isinstance(payload, dict):
            raise CheckpointError(f"{str(directory)!r} does not hold a cadence checkpoint payload.")
        return payload


_RANK_FILE = re.compile(r"^rank-\d+\.cadence$")


def checked_by_its_reader(name: str) -> bool:
    """Whether checkpoint file `name` is verified by whoever reads it, when it is read: a rank
    file (a state file, checked as it is read) or a shard (checked before DCP reads it)."""
    return bool(_RANK_FILE.match(name)) or name.startswith(f"{SHARDED_DIR}/")


def read_checkpoint(path: str | os.PathLike[str],
                    io: CheckpointIO | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reads and verifies a checkpoint without loading it into anything.

    Every file is checked against its size and SHA-256 in the manifest before its content is
    trusted -- by the process that reads it, and only the files it reads: the payload here;
    the rank files (``rank-<r>.cadence``) as each rank reads its own (`read_state_file`); the
    shards (``sharded/``) as DCP's plan reads them (`cadence.engine.dcp_reading`). At 1,024
    ranks no rank reads, hashes or `stat`s the others' shares.

    Returns:
        ``(manifest, payload)``: the payload has ``state`` and ``tracked`` sections.

    Raises:
        CheckpointError: naming the checkpoint and what is wrong with it: missing, incomplete,
            truncated, changed bytes, unreadable, not cadence's.
    """
    path = Path(path)
    io = io or StateFileIO()
    manifest = read_manifest(path, sizes_of=())  # each file's size is checked as it is read
    verified = getattr(io, "verified_files", ())
    verify_files(path, manifest, [name for name in manifest["files"]
                                  if name not in verified and not checked_by_its_reader(name)])
    try:
        payload = io.load(path)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, EOFError, RuntimeError, OSError) as error:
        raise CheckpointError(f"Cannot read checkpoint {str(path)!r}: {type(error).__name__}: "
                              f"{error}. It is damaged or not cadence's.") from error
    for key in ("state", "tracked"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(f"{str(path)!r} has no {key!r} section: not a cadence "
                                  "checkpoint, or written by an incompatible version.")
    return manifest, payload


def save_with_digests(io: CheckpointIO, payload: Any, directory: Path) -> dict[str, str]:
    """`io.save(payload, directory)`, returning the SHA-256 of every file it wrote, by name.

    `io` writes into a folder of its own first, so that its files are known whatever `io` is;
    a digest it did not return (a custom `CheckpointIO` may return none) is computed here, by
    the process that wrote the file. A distributed commit lists, hashes and fsyncs no file
    itself: a file without a digest would be left out of the manifest, and never verified."""
    from cadence.core.checkpoint_dir import file_sha256

    own = directory / ".payload"
    own.mkdir()
    digests = io.save(payload, own) or {}
    written: dict[str, str] = {}
    for path in sorted(p for p in own.rglob("*") if p.is_file()):
        name = str(path.relative_to(own))
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, directory / name)
        written[name] = digests.get(name) or file_sha256(directory / name)
    shutil.rmtree(own)
    return written
