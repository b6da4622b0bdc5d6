import json
import os

import pytest

from cadence.core.checkpoint_dir import (
    DAMAGED_NOTE,
    MANIFEST,
    CheckpointDirectory,
    read_manifest,
    verify_files,
)
from cadence.core.errors import CheckpointError


def write(directory: CheckpointDirectory, step: int, payload: bytes = b"x" * 10):
    with directory.staging(step) as staging:
        (staging / "state.bin").write_bytes(payload)
    return directory.path_for(step)


def test_commit_writes_a_manifest_and_lists_complete_checkpoints(tmp_path):
    directory = CheckpointDirectory(tmp_path, max_to_keep=None)
    write(directory, 5)
    write(directory, 10)
    assert [c.step for c in directory.checkpoints()] == [5, 10]
    manifest = read_manifest(directory.path_for(10))
    assert manifest["step"] == 10 and manifest["files"] == {"state.bin": 10}


def test_a_crash_between_writing_and_renaming_leaves_the_previous_checkpoint_latest(
    tmp_path, monkeypatch
):
    directory = CheckpointDirectory(tmp_path)
    write(directory, 1)

    def crash(*args):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(OSError, match="simulated"):
        write(directory, 2)
    monkeypatch.undo()
    assert directory.latest().step == 1
    # A process killed there leaves its staging directory behind; it is never listed,
    # and it is removed on the next start.
    (tmp_path / ".tmp-ckpt-2-deadbeef").mkdir()
    assert [c.step for c in directory.checkpoints()] == [1]
    directory.remove_stale()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-1"]


def test_incomplete_corrupt_and_foreign_directories_are_not_listed(tmp_path):
    directory = CheckpointDirectory(tmp_path)
    good = write(directory, 1)
    (tmp_path / "ckpt-2").mkdir()  # no manifest: never committed
    truncated = write(directory, 3)
    (truncated / "state.bin").write_bytes(b"x")  # size no longer matches the manifest
    foreign = tmp_path / "ckpt-4"
    foreign.mkdir()
    (foreign / MANIFEST).write_text(json.dumps({"format": "something-else"}))
    assert [c.path for c in directory.checkpoints()] == [good]
    with pytest.raises(CheckpointError, match="truncated"):
        read_manifest(truncated)
    with pytest.raises(CheckpointError, match="not a cadence checkpoint"):
        read_manifest(foreign)
    with pytest.raises(CheckpointError, match="no manifest.json"):
        read_manifest(tmp_path / "ckpt-2")


def test_retention_keeps_the_newest_and_never_deletes_the_newest_good_one(tmp_path):
    directory = CheckpointDirectory(tmp_path, max_to_keep=2)
    for step in (1, 2, 3):
        write(directory, step)
        directory.prune()
    assert [c.step for c in directory.checkpoints()] == [2, 3]
    (tmp_path / "ckpt-9").mkdir()  # a newer but incomplete checkpoint does not count
    directory.prune()
    assert [c.step for c in directory.checkpoints()] == [2, 3]


def test_failed_write_commits_nothing(tmp_path):
    directory = CheckpointDirectory(tmp_path)
    with pytest.raises(RuntimeError), directory.staging(7) as staging:
        (staging / "half").write_bytes(b"x")
        raise RuntimeError("serialization failed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_max_to_keep_must_be_positive(tmp_path, bad):
    with pytest.raises(ValueError, match="max_to_keep"):
        CheckpointDirectory(tmp_path, max_to_keep=bad)


def test_the_manifest_records_each_files_sha256_and_verify_files_checks_the_content(tmp_path):
    import hashlib

    directory = CheckpointDirectory(tmp_path)
    path = write(directory, 1, b"0123456789")
    manifest = read_manifest(path)
    assert manifest["sha256"] == {"state.bin": hashlib.sha256(b"0123456789").hexdigest()}
    verify_files(path, manifest)
    (path / "state.bin").write_bytes(b"0123456788")  # same size: only the content differs
    assert directory.checkpoints()[0].path == path  # listing checks sizes only (it is cheap)
    with pytest.raises(CheckpointError, match="state.bin does not match its SHA-256"):
        verify_files(path, read_manifest(path))


def test_a_leftover_at_the_committed_name_is_moved_aside_and_kept(tmp_path):
    directory = CheckpointDirectory(tmp_path)
    (tmp_path / "ckpt-3").mkdir()
    (tmp_path / "ckpt-3" / "junk").write_text("left by a crash")
    write(directory, 3)
    (moved,) = tmp_path.glob("ckpt-3.damaged-*")
    assert (moved / "junk").read_text() == "left by a crash"
    assert "in the way of a new checkpoint" in (moved / DAMAGED_NOTE).read_text()
    assert [c.step for c in directory.checkpoints()] == [3]
    directory.remove_stale()  # not a temporary directory: kept
    assert moved.is_dir()
