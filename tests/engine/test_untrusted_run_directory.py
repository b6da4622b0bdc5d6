"""A run directory is untrusted input: nothing cadence reads from it reaches outside it, and
nothing cadence writes goes through a link planted in it.

Each test plants what someone sharing or copying a run directory could plant -- a manifest or
export-ledger entry naming ``../..``, a symbolic link where cadence appends or locks -- and
shows that the file outside is neither read, written, truncated nor deleted.
"""

import json
import os

import pytest
import torch
from torch import nn

from cadence import CheckpointError, CheckpointManager, ConfigError
from cadence.core.run_dir import RunDirectory, RunLock
from cadence.engine.exporter import BestCheckpointExporter, load_weights
from cadence.task.cli import main
from cadence.writers.csv import CSVWriter
from cadence.writers.jsonl import JSONLWriter


@pytest.fixture
def victim(tmp_path):
    """A file outside the run, which nothing may touch."""
    path = tmp_path / "outside" / "precious.txt"
    path.parent.mkdir()
    path.write_text("precious\n")
    return path


def test_a_manifest_naming_a_file_outside_the_checkpoint_is_refused(tmp_path, victim):
    manager = CheckpointManager({"model": nn.Linear(2, 2)}, tmp_path / "run" / "ckpts")
    checkpoint = tmp_path / "run" / "ckpts" / os.path.basename(manager.save(1))
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    escape = os.path.relpath(victim, checkpoint)
    manifest["files"][escape] = victim.stat().st_size
    manifest["sha256"][escape] = "0" * 64
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="names files outside the checkpoint"):
        CheckpointManager({"model": nn.Linear(2, 2)}, tmp_path / "run" / "ckpts").restore(
            checkpoint)
    absolute = {**manifest, "files": {str(victim): 9}, "sha256": {str(victim): "0" * 64}}
    (checkpoint / "manifest.json").write_text(json.dumps(absolute))
    with pytest.raises(CheckpointError, match="names files outside the checkpoint"):
        load_weights(nn.Linear(2, 2), checkpoint)
    assert victim.read_text() == "precious\n"


def test_an_export_ledger_entry_naming_elsewhere_is_never_read_or_deleted(tmp_path, victim):
    """The report: a ``best/info.json`` entry whose path is ``../../elsewhere`` was removed with
    ``rmtree`` when a better export pushed it out."""
    export_dir = tmp_path / "run" / "best"
    export_dir.mkdir(parents=True)
    escape = os.path.relpath(victim.parent, export_dir)
    ledger = {"metric": "accuracy", "exports": [
        {"step": 1, "value": 0.5, "path": escape, "logs": {"accuracy": 0.5}}]}
    (export_dir / "info.json").write_text(json.dumps(ledger))
    (victim.parent / "model.safetensors").write_bytes(b"planted")  # as an export would be
    exporter = BestCheckpointExporter(export_dir, "accuracy", "higher", max_to_keep=1)
    assert exporter.best_exports == []  # the planted entry is ignored
    assert exporter.maybe_export_checkpoint(nn.Linear(2, 2), {"accuracy": 0.9}, global_step=2)
    assert victim.read_text() == "precious\n"
    assert (victim.parent / "model.safetensors").read_bytes() == b"planted"
    assert [e["path"] for e in exporter.best_exports] == ["best-2"]
    with pytest.raises(CheckpointError):  # reading weights: the planted path is not a candidate
        load_weights(nn.Linear(3, 3), export_dir)


def test_a_train_lock_that_is_a_link_or_a_directory_is_refused_and_its_target_untouched(
        tmp_path, victim):
    """The report: a ``train.lock`` that was a symlink was followed and its target truncated."""
    run = RunDirectory(tmp_path / "run")
    run.root.mkdir()
    run.lock_file.symlink_to(victim)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        RunLock(run.lock_file).acquire()
    assert victim.read_text() == "precious\n"
    run.lock_file.unlink()
    run.lock_file.mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        RunLock(run.lock_file).acquire()


def test_cadence_train_with_a_linked_lock_is_one_line_and_exit_2(tmp_path, victim, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.lock").symlink_to(victim)
    assert main(["train", "-m", str(run), "--set", "trainer.train_steps=2"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("cadence: error: ")]
    assert len(errors) == 1 and "is a symbolic link" in errors[0] and "Traceback" not in err
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("writer", ["jsonl", "csv"])
def test_a_metrics_file_that_is_a_link_is_never_appended_to(tmp_path, victim, writer):
    """The report: a symlinked ``eval/metrics.jsonl`` was appended to."""
    directory = tmp_path / "run" / "eval"
    directory.mkdir(parents=True)
    if writer == "jsonl":
        (directory / "metrics.jsonl").symlink_to(victim)
        instance = JSONLWriter(directory)
    else:
        (directory / "metrics.csv").symlink_to(victim)
        instance = CSVWriter(directory)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        instance.write(1, {"accuracy": torch.tensor(0.5).item()})
    assert victim.read_text() == "precious\n"


def test_a_resume_record_is_never_appended_through_a_link(tmp_path, victim):
    run = RunDirectory(tmp_path / "run")
    run.root.mkdir()
    run.resumes.symlink_to(victim)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        run.record_resume(10, None)
    assert victim.read_text() == "precious\n"
