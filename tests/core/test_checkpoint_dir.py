import json
import os

import pytest

from cadence.core.checkpoint_dir import MANIFEST, CheckpointDirectory, read_manifest
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
