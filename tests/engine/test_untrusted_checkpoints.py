"""A run directory is untrusted input: nothing read from a checkpoint runs code.

DCP (``torch.distributed.checkpoint``) unpickles its ``.metadata`` and every non-tensor value it
saved. A pickle planted in either place -- beside a checkpoint, or in place of its files with a
forged manifest -- must never run when a checkpoint is restored or its weights are read. Each
planted pickle here would create a marker file if it ran.
"""

import contextlib
import hashlib
import json
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
)

import cadence.engine.checkpoint as checkpoint_module
from cadence import CheckpointError, CheckpointManager
from cadence.engine.exporter import read_weights
from cadence.task.cli import main

# The sharded checkpoints here are written by DCP in one process (under FSDP2 every rank writes).
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Planted:
    """Unpickling this runs ``os.system`` (a pickle's usual payload)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(path, marker):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(Planted(marker)))


def forge_manifest(checkpoint):
    """Rewrites the manifest to fit the files as they are now (what someone who planted a
    file would do, so that the checksums do not give it away)."""
    manifest_path = checkpoint / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for name in manifest["files"]:
        data = (checkpoint / name).read_bytes()
        manifest["files"][name] = len(data)
        manifest["sha256"][name] = hashlib.sha256(data).hexdigest()
    manifest_path.write_text(json.dumps(manifest))


def trained():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def sharded_checkpoint(tmp_path, monkeypatch):
    """A checkpoint whose model and optimizer went through DCP (as under FSDP2; in one process
    DCP writes the full tensors). Returns (checkpoint path, model, optimizer)."""
    model, optimizer = trained()
    monkeypatch.setattr(checkpoint_module, "uses_dcp", lambda items: True)
    manager = CheckpointManager({"model": model, "optimizer": optimizer}, tmp_path / "ckpts")
    path = manager.save(1)
    monkeypatch.undo()
    return tmp_path / "ckpts" / os.path.basename(path), model, optimizer


def fresh_manager(tmp_path):
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return CheckpointManager({"model": model, "optimizer": optimizer}, tmp_path / "ckpts"), model


def test_a_sharded_checkpoint_restores_through_the_restricted_readers(tmp_path, monkeypatch):
    checkpoint, model, _ = sharded_checkpoint(tmp_path, monkeypatch)
    assert (checkpoint / "sharded" / ".metadata").is_file()
    manager, restored = fresh_manager(tmp_path)
    assert manager.restore(checkpoint) == 1
    assert torch.equal(restored.weight, model.weight)
    assert read_weights(checkpoint).keys() == model.state_dict().keys()


def test_a_restore_unpickles_the_dcp_metadata_once(tmp_path, monkeypatch):
    """DCP's metadata grows with the model and the ranks (123 MB at 7B on 1,024 ranks,
    docs/scale.md): finding what is sharded and loading it share one read."""
    import cadence.engine.dcp_reading as dcp_reading

    checkpoint, _, _ = sharded_checkpoint(tmp_path, monkeypatch)
    reads = []
    read = dcp_reading.read_dcp_metadata
    monkeypatch.setattr(dcp_reading, "read_dcp_metadata",
                        lambda stream, where: reads.append(where) or read(stream, where))
    manager, _ = fresh_manager(tmp_path)
    manager.restore(checkpoint)
    assert len(reads) == 1


def test_dcp_metadata_planted_beside_a_checkpoint_is_never_read(tmp_path):
    model, optimizer = trained()
    manager = CheckpointManager({"model": model, "optimizer": optimizer}, tmp_path / "ckpts")
    checkpoint = tmp_path / "ckpts" / os.path.basename(manager.save(1))
    marker = tmp_path / "ran"
    plant(checkpoint / "sharded" / ".metadata", marker)  # not in the manifest
    again, restored = fresh_manager(tmp_path)
    assert again.restore(checkpoint) == 1
    assert torch.equal(restored.weight, model.weight)
    read_weights(checkpoint)
    assert not marker.exists()


def test_planted_dcp_metadata_with_a_forged_manifest_is_refused_without_running(
        tmp_path, monkeypatch):
    checkpoint, _, _ = sharded_checkpoint(tmp_path, monkeypatch)
    marker = tmp_path / "ran"
    plant(checkpoint / "sharded" / ".metadata", marker)
    forge_manifest(checkpoint)
    manager, _ = fresh_manager(tmp_path)
    with pytest.raises(CheckpointError, match="refused to unpickle it"):
        manager.restore(checkpoint)
    with pytest.raises(CheckpointError, match="refused to unpickle it"):
        read_weights(checkpoint)
    assert not marker.exists()


def test_a_pickle_planted_in_a_shard_file_is_refused_without_running(tmp_path, monkeypatch):
    """A non-tensor value in a shard (an optimizer's learning rate) whose pickle runs code."""
    checkpoint, model, optimizer = sharded_checkpoint(tmp_path, monkeypatch)
    marker = tmp_path / "ran"
    state = {"model": get_model_state_dict(model),
             "optimizer": get_optimizer_state_dict(model, optimizer)}
    state["optimizer"]["param_groups"][0]["lr"] = Planted(marker)
    for stale in (checkpoint / "sharded").iterdir():
        stale.unlink()
    dcp.save(state, checkpoint_id=str(checkpoint / "sharded"))
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    for file in (checkpoint / "sharded").iterdir():
        manifest["files"][f"sharded/{file.name}"] = file.stat().st_size
        manifest["sha256"][f"sharded/{file.name}"] = "0"
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    forge_manifest(checkpoint)
    manager, _ = fresh_manager(tmp_path)
    with pytest.raises(CheckpointError, match="never unpickles arbitrary objects"):
        manager.restore(checkpoint)
    with pytest.raises(CheckpointError, match="never unpickles arbitrary objects"):
        read_weights(checkpoint)
    assert not marker.exists()


def test_dcp_metadata_naming_a_file_outside_the_checkpoint_is_refused(tmp_path, monkeypatch):
    checkpoint, _, _ = sharded_checkpoint(tmp_path, monkeypatch)
    outside = tmp_path / "outside.distcp"
    metadata_path = checkpoint / "sharded" / ".metadata"
    metadata = pickle.loads(metadata_path.read_bytes())
    for info in metadata.storage_data.values():
        outside.write_bytes((checkpoint / "sharded" / info.relative_path).read_bytes())
        info.relative_path = "../../../outside.distcp"
    metadata_path.write_bytes(pickle.dumps(metadata))
    forge_manifest(checkpoint)
    manager, _ = fresh_manager(tmp_path)
    with pytest.raises(CheckpointError, match="not a file of this checkpoint's manifest"):
        manager.restore(checkpoint)


@pytest.mark.slow
def test_cadence_eval_and_train_of_a_run_with_planted_dcp_metadata_run_no_code(
        tmp_path, monkeypatch, capsys):
    """The reproduction of the report: ``sharded/.metadata`` planted in every checkpoint of a
    finished run, then ``cadence eval -m RUN`` and ``cadence train -m RUN``."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    fast = ["--set", "trainer.train_steps=20", "--set", "trainer.steps_per_loop=10",
            "--set", "trainer.checkpoint_interval=10", "--set", "trainer.validation_interval=20"]
    assert main(["train", "-m", str(run), *fast]) == 0
    marker = tmp_path / "ran"
    for checkpoint in (run / "checkpoints").glob("ckpt-*"):
        plant(checkpoint / "sharded" / ".metadata", marker)
    assert main(["eval", "-m", str(run)]) == 0
    assert main(["train", "-m", str(run), *fast, "--set", "trainer.train_steps=30",
                 "--allow-config-change"]) == 0
    assert "Evaluation: accuracy=" in capsys.readouterr().out
    assert not marker.exists()


def test_a_pickle_planted_in_any_file_of_a_run_never_runs(tmp_path, monkeypatch, capsys):
    """Every file a run directory holds -- each checkpoint's manifest, state file, rank file,
    DCP metadata and shard; the config and its backup; the lock; the summaries of every writer;
    the best export, its metrics and the ledger; the record of resumes -- replaced in turn by a
    pickle (the checkpoint's manifest forged to fit, so that no checksum gives it away); then
    ``cadence eval``, ``cadence train`` and ``cadence plot`` of the run, and `load_weights` of
    its exports. None runs the pickle, and each command ends in its own way: it works, or it
    says in one line what is wrong.

    ``cadence plot`` reads every file of the run whatever it draws; it draws one scalar here,
    ``accuracy`` -- a train and an eval curve, the best export's star and the resume's line:
    every kind of mark -- rather than all eight (a second of matplotlib per file)."""
    import gc
    import shutil

    from cadence import load_weights
    from cadence.task.experiments.digits import DigitsTask, DigitsTaskConfig

    monkeypatch.chdir(tmp_path)
    fast = ["--no-progress", "--set", "trainer.steps_per_loop=10", "--set",
            "trainer.checkpoint_interval=10", "--set", "trainer.validation_interval=10",
            "--set", "task.model.hidden_sizes=[16]", "--set", "runtime.strategy=fsdp2",
            "--set", "runtime.writers=[tensorboard,jsonl,csv]"]
    assert main(["train", "-m", "made", *fast, "--set", "trainer.train_steps=20"]) == 0
    assert main(["train", "-m", "made", *fast, "--set", "trainer.train_steps=30",
                 "--allow-config-change"]) == 0  # a resume, and the old config kept
    files = sorted(p.relative_to(tmp_path / "made") for p in (tmp_path / "made").rglob("*")
                   if p.is_file())
    kinds = {p.name.split(".")[-1] if "." in p.name else p.name for p in files}
    assert {"manifest", "cadence", "metadata", "distcp", "yaml", "lock", "jsonl", "csv",
            "safetensors"} <= kinds | {"manifest"}, kinds
    assert any(p.name.startswith("events.out.tfevents") for p in files)
    assert any(p.name == "resumes.jsonl" for p in files) and len(files) >= 25, files
    marker = tmp_path / "ran"
    model = DigitsTask(DigitsTaskConfig()).build_model()
    # Each command of this FSDP2 run ends in `gc.collect()` (cadence.engine.runtime.shutdown:
    # 0.2 s in a process that imported the whole suite): with the objects made so far frozen,
    # it goes through those each command makes.
    gc.collect()
    gc.freeze()
    try:
        for name in files:
            shutil.rmtree(tmp_path / "run", ignore_errors=True)
            shutil.copytree(tmp_path / "made", tmp_path / "run")
            plant(tmp_path / "run" / name, marker)
            if name.parts[0] == "checkpoints" and name.name != "manifest.json":
                forge_manifest(tmp_path / "run" / name.parts[0] / name.parts[1])
            statuses = [main(["eval", "-m", "run"]),
                        main(["train", "-m", "run", "--no-progress"]),
                        main(["plot", "run", "--out", "plots", "--metrics", "accuracy"])]
            for weights in ("run/best", "run/best/best-30"):
                with contextlib.suppress(CheckpointError, ValueError):  # refused: nothing ran
                    load_weights(model, weights)
            err = capsys.readouterr().err
            assert not marker.exists(), f"planted in {name}: it ran"
            assert set(statuses) <= {0, 2}, (name, statuses, err[-2000:])
            assert "Traceback" not in err, (name, err[-2000:])
    finally:
        gc.unfreeze()
