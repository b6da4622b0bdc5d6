"""Damaged checkpoints and exports: cadence never trains on them, never loses a good one, and is
never stuck because of one.

Faults are injected into the files a run wrote: truncation, flipped bits in tensor data, a
planted foreign checkpoint, a manifest without its step. The helpers find the bytes to damage
by content, so the tests do not depend on the file format.
"""

import json
import logging
import shutil
import struct

import pytest
import torch
from torch import nn

import cadence
from cadence import CheckpointError, CheckpointManager, CheckpointMismatchError
from cadence.engine.exporter import BestCheckpointExporter, load_weights, read_weights

MARK = 1.2345  # a weight value whose bytes are easy to find in a file
MARK32 = torch.tensor(MARK).item()  # the same value after a round trip through float32


def linear(value, n_in=3):
    model = nn.Linear(n_in, 2)
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.zero_()
    return model


def state_file(checkpoint):
    (path,) = [p for p in checkpoint.iterdir() if p.name.startswith("state.")]
    return path


def flip_a_bit_of(path, value):
    """Flips one bit inside the bytes of a float32 tensor filled with `value`."""
    data = bytearray(path.read_bytes())
    at = data.find(struct.pack("<f", value) * 4)
    assert at >= 0, "the tensor's bytes are not in the file"
    data[at + 1] ^= 0x04
    path.write_bytes(bytes(data))


def truncate(path, keep=0.5):
    with open(path, "r+b") as handle:
        handle.truncate(int(path.stat().st_size * keep))


def names(directory):
    return sorted(p.name.split(".damaged")[0] + (".damaged" if ".damaged" in p.name else "")
                  for p in directory.iterdir())


def two_checkpoints(tmp_path):
    """ckpt-1 with weights 0.5, ckpt-2 with weights MARK, both good."""
    directory = tmp_path / "ckpts"
    CheckpointManager({"model": linear(0.5)}, directory).save(1)
    CheckpointManager({"model": linear(MARK)}, directory).save(2)
    return directory


# ---------------------------------------------------------------------------- 1. never stuck


def test_a_truncated_newest_checkpoint_is_moved_aside_and_its_step_saved_again(tmp_path,
                                                                            caplog):
    directory = two_checkpoints(tmp_path)
    truncate(state_file(directory / "ckpt-2"))
    model = linear(0.0)
    manager = CheckpointManager({"model": model}, directory)
    assert manager.restore_or_initialize() == str(directory / "ckpt-1")
    assert model.weight[0, 0].item() == 0.5
    for _ in range(2):  # the save of that step works, and again after another restart
        assert manager.save(2) == str(directory / "ckpt-2")
        assert [c.step for c in manager.checkpoints] == [1, 2]
        manager = CheckpointManager({"model": model}, directory)
        assert manager.restore_or_initialize() == str(directory / "ckpt-2")
    assert names(directory) == ["ckpt-1", "ckpt-2", "ckpt-2.damaged"]  # kept, renamed


def test_a_damaged_directory_in_the_way_of_a_save_is_moved_aside_not_an_errno_39(tmp_path):
    directory = tmp_path / "ckpts"
    (directory / "ckpt-5").mkdir(parents=True)
    (directory / "ckpt-5" / "state.cadence").write_bytes(b"half a write")  # no manifest
    manager = CheckpointManager({"model": linear(MARK)}, directory)
    assert manager.save(5) == str(directory / "ckpt-5")
    assert [c.step for c in manager.checkpoints] == [5]
    assert names(directory) == ["ckpt-5", "ckpt-5.damaged"]


# ---------------------------------------------------------------------------- 2. flipped bytes


def test_flipped_bits_in_tensor_data_are_found_and_the_previous_checkpoint_restored(
        tmp_path, caplog):
    directory = two_checkpoints(tmp_path)
    flip_a_bit_of(state_file(directory / "ckpt-2"), MARK)
    model = linear(0.0)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        restored = CheckpointManager({"model": model}, directory).restore_or_initialize()
    assert restored == str(directory / "ckpt-1")
    assert model.weight[0, 0].item() == 0.5  # never the damaged weights
    assert "ckpt-2" in caplog.text and "SHA-256" in caplog.text  # the damage is named


def test_a_flipped_bit_in_the_only_checkpoint_is_one_clear_error_not_wrong_weights(tmp_path):
    directory = tmp_path / "ckpts"
    path = CheckpointManager({"model": linear(MARK)}, directory).save(1)
    flip_a_bit_of(state_file(directory / "ckpt-1"), MARK)
    model = linear(0.0)
    with pytest.raises(CheckpointError, match=r"ckpt-1.*(checksum|SHA-256)"):
        CheckpointManager({"model": model}, directory).restore(path)
    with pytest.raises(CheckpointError, match="SHA-256"):
        CheckpointManager({"model": model}, directory).restore_or_initialize()
    assert model.weight[0, 0].item() == 0.0
    assert (directory / "ckpt-1").is_dir()  # with no good one, nothing is moved


def test_load_weights_checks_checkpoints_and_falls_back_to_an_older_one(tmp_path, caplog):
    directory = tmp_path / "ckpts"
    CheckpointManager({"model": linear(0.5)}, directory).save(1)
    CheckpointManager({"model": linear(MARK)}, directory).save(2)
    flip_a_bit_of(state_file(directory / "ckpt-2"), MARK)
    with pytest.raises(CheckpointError, match="SHA-256|checksum"):
        read_weights(directory / "ckpt-2")
    model = linear(0.0)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        load_weights(model, directory)
    assert model.weight[0, 0].item() == 0.5 and "ckpt-2" in caplog.text


def test_flipped_bits_in_an_exported_safetensors_file_are_refused(tmp_path, caplog):
    exporter = BestCheckpointExporter(tmp_path / "best", "accuracy", max_to_keep=2)
    exporter.maybe_export_checkpoint(linear(0.5), {"accuracy": 0.8}, 10)
    exporter.maybe_export_checkpoint(linear(MARK), {"accuracy": 0.9}, 20)
    best = tmp_path / "best" / "best-20" / "model.safetensors"
    flip_a_bit_of(best, MARK)
    model = linear(0.0)
    for named in (best, best.parent):  # the file itself, or its export directory
        with pytest.raises(CheckpointError, match="damaged"):
            load_weights(model, named)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        load_weights(model, tmp_path / "best")  # the ledger: the next best instead
    assert model.weight[0, 0].item() == 0.5 and "best-20" in caplog.text


# ---------------------------------------------------------------------------- 3. unreadable


def test_a_planted_foreign_model_as_the_newest_checkpoint_is_set_aside(tmp_path, caplog):
    directory = two_checkpoints(tmp_path)
    CheckpointManager({"model": linear(0.1, n_in=7)}, directory).save(3)  # another model's
    model = linear(0.0)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        restored = CheckpointManager({"model": model}, directory).restore_or_initialize()
    assert restored == str(directory / "ckpt-2") and model.weight[0, 0].item() == MARK32
    assert "ckpt-3" in caplog.text and "shape" in caplog.text
    assert names(directory) == ["ckpt-1", "ckpt-2", "ckpt-3.damaged"]


def test_a_mismatch_names_the_checkpoint_and_with_no_good_one_nothing_is_moved(tmp_path):
    directory = tmp_path / "ckpts"
    CheckpointManager({"model": linear(0.1, n_in=7)}, directory).save(3)
    with pytest.raises(CheckpointMismatchError, match="ckpt-3") as raised:
        CheckpointManager({"model": linear(0.0)}, directory).restore_or_initialize()
    assert "'weight' has shape (2, 7) in the checkpoint, (2, 3) in the model" in str(raised.value)
    assert names(directory) == ["ckpt-3"]


def test_an_unreadable_newest_checkpoint_falls_back_instead_of_stopping(tmp_path):
    directory = two_checkpoints(tmp_path)
    newest = state_file(directory / "ckpt-2")
    newest.write_bytes(b"\x80\x04not a pickle" + bytes(newest.stat().st_size - 14))
    manifest_path = directory / "ckpt-2" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.pop("sha256", None)  # as if written by a version without checksums
    manifest_path.write_text(json.dumps(manifest))
    model = linear(0.0)
    assert CheckpointManager({"model": model}, directory).restore_or_initialize() == str(
        directory / "ckpt-1")
    assert model.weight[0, 0].item() == 0.5


def test_a_planted_checkpoint_whose_manifest_lacks_its_step_is_no_keyerror(tmp_path):
    directory = two_checkpoints(tmp_path)
    shutil.copytree(directory / "ckpt-2", directory / "ckpt-9")
    manifest_path = directory / "ckpt-9" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["step"]
    manifest_path.write_text(json.dumps(manifest))
    model = linear(0.0)
    manager = CheckpointManager({"model": model}, directory)
    assert manager.restore_or_initialize() == str(directory / "ckpt-2")
    assert model.weight[0, 0].item() == MARK32


def test_a_read_only_manager_falls_back_without_moving_anything(tmp_path, caplog):
    directory = two_checkpoints(tmp_path)
    flip_a_bit_of(state_file(directory / "ckpt-2"), MARK)
    model = linear(0.0)
    reader = CheckpointManager({"model": model}, directory, read_only=True)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        assert reader.restore_or_initialize() == str(directory / "ckpt-1")
    assert "ckpt-2" in caplog.text
    assert names(directory) == ["ckpt-1", "ckpt-2"]  # a trainer may own this directory


def test_every_file_of_a_checkpoint_has_a_checksum_in_its_manifest(tmp_path):
    path = CheckpointManager({"model": linear(MARK)}, tmp_path).save(1)
    manifest = json.loads((tmp_path / "ckpt-1" / "manifest.json").read_text())
    assert set(manifest["sha256"]) == set(manifest["files"]) == {
        p.name for p in (tmp_path / "ckpt-1").iterdir() if p.name != "manifest.json"}
    assert cadence.CheckpointManager({"model": linear(0.0)}, tmp_path).restore(path) == 1


@pytest.mark.parametrize("newer", [["ckpt-2"], ["ckpt-1", "ckpt-2"]])
def test_a_checkpoint_a_newer_cadence_wrote_stops_the_run_never_an_older_one_or_step_0(
        tmp_path, newer):
    """Skipping it would restore an older checkpoint in its place, or -- with no other --
    start the run afresh over its checkpoints. The refusal leaves everything where it was."""
    directory = two_checkpoints(tmp_path)
    for name in newer:
        manifest = directory / name / "manifest.json"
        record = json.loads(manifest.read_text())
        record["version"] = 99
        manifest.write_text(json.dumps(record))
    started = []
    manager = CheckpointManager({"model": linear(0.0)}, directory,
                                init_fn=lambda: started.append("afresh"))
    with pytest.raises(cadence.CheckpointIncompatibleError,
                       match=r"written by a newer cadence \(format version 99.*Upgrade cadence"):
        manager.restore_or_initialize()
    assert started == [] and names(directory) == ["ckpt-1", "ckpt-2"]
