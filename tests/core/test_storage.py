"""A full disk, as every writer of a run meets it on a real tmpfs, is one `StorageError`
(`cadence.core.storage`): safetensors' `SafetensorError`, DCP's `CheckpointException` (a
BaseException), TensorBoard's, MLflow's file store's, JSON lines' and CSV's `OSError`, cadence's
checkpoints (synchronous and in the background), exports, lock, config and resume record. The
timeline falls silent instead, as documented. A read-only file system is the same error with
its own fix; anything else passes through as it is."""

import contextlib
import errno
import logging
import warnings

import pytest
import torch
from disks import fill, open_files_under, read_only, small_tmpfs
from torch import nn

import cadence
from cadence.core.errors import StorageError
from cadence.core.run_dir import RunDirectory, RunLock
from cadence.core.storage import storage_cause, storage_error, writing
from cadence.core.summary import SummaryManager
from cadence.engine.exporter import BestCheckpointExporter
from cadence.records.timeline import Timeline


@pytest.fixture
def disk(tmp_path):
    with small_tmpfs(tmp_path / "disk", "2m") as path:
        yield path


def full(disk):
    fill(disk)
    return disk


def mapped(call):
    """The `StorageError` that `call`'s failure maps to (`storage_error`), with its cause."""
    try:
        call()
    except BaseException as error:  # DCP's CheckpointException is a BaseException
        found = storage_error("Writing", error)
        assert found is not None, repr(error)
        return found, error
    raise AssertionError("no error: the disk was not full")


def test_safetensors_error_is_a_full_disk(disk):
    from safetensors.torch import save_file

    found, raised = mapped(lambda: save_file({"w": torch.zeros(100_000)},
                                             str(full(disk) / "w.safetensors")))
    assert type(raised).__name__ == "SafetensorError"
    assert found.errno == errno.ENOSPC and found.fix == "free some space"


def test_a_dcp_checkpoint_exception_is_a_full_disk(disk):
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns that it saves without a process group
        found, raised = mapped(lambda: dcp.save({"w": torch.zeros(100_000)},
                                                checkpoint_id=str(full(disk) / "dcp"),
                                                no_dist=True))
    assert type(raised).__name__ == "CheckpointException" and not isinstance(raised, Exception)
    assert found.errno == errno.ENOSPC


@pytest.mark.parametrize("writer", ["tensorboard", "jsonl", "csv", "mlflow"])
def test_each_metric_writer_on_a_full_disk_is_one_storage_error(disk, writer):
    manager = SummaryManager(disk / "run" / "train", lambda: 0, writers=[writer],
                             run_dir=disk / "run")
    manager.write_summaries({"loss": 1.0}, step=0)
    manager.write_hparams({"lr": 0.1})  # tensorboard's session file too
    manager.flush()
    full(disk)
    with pytest.raises(StorageError) as raised:
        for step in range(1, 20_000):  # the last pages of its files have room for a while
            manager.write_summaries({"loss": float(step), "x" * 200: 1.0}, step=step)
            manager.flush()
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value).startswith(
        f"Writing the summaries to {str(disk / 'run' / 'train')!r} failed: No space left on "
        "device")
    with contextlib.suppress(StorageError):  # a writer with lines left to flush says so
        manager.close()
    assert open_files_under(disk) == []  # every file is released, also after the failure


class Net(cadence.Module):
    def __init__(self, width=64):
        super().__init__()
        self.model = nn.Linear(width, width)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "background"])
def test_a_checkpoint_on_a_full_disk_names_the_newest_good_one(disk, async_save):
    manager = cadence.CheckpointManager(Net(), disk / "ckpt", async_save=async_save)
    manager.save(1)
    manager.wait()
    full(disk)
    with pytest.raises(StorageError) as raised:
        manager.save(2)
        manager.wait()
    what = ("Writing checkpoint ckpt-2 in the background" if async_save
            else "Saving checkpoint ckpt-2")
    assert str(raised.value) == (
        f"{what} failed: No space left on device. The newest good checkpoint is "
        f"{disk / 'ckpt' / 'ckpt-1'} (step 1): free some space, then run the same command "
        "again.")
    assert [c.step for c in manager.checkpoints] == [1]
    assert sorted(p.name for p in (disk / "ckpt").iterdir()) == ["ckpt-1"]  # nothing half-made


def test_the_best_export_on_a_full_disk_is_one_storage_error_and_lists_nothing_new(disk):
    exporter = BestCheckpointExporter(disk / "best", "accuracy", "higher", 3)
    model = nn.Linear(200, 200)
    assert exporter.maybe_export_checkpoint(model, {"accuracy": 0.5}, 10)
    full(disk)
    with pytest.raises(StorageError, match=r"^Exporting the weights of step 20 to .* failed: "
                       r"No space left on device\.") as raised:
        exporter.maybe_export_checkpoint(model, {"accuracy": 0.9}, 20)
    assert type(raised.value.__cause__).__name__ == "SafetensorError"
    ledger = BestCheckpointExporter(disk / "best", "accuracy", "higher", 3)
    assert [e["step"] for e in ledger.best_exports] == [10]
    assert sorted(p.name for p in (disk / "best").iterdir()) == ["best-10", "info.json"]


def test_the_lock_and_the_resume_record_on_a_full_disk_are_storage_errors(disk):
    run = RunDirectory(disk / "run")
    run.root.mkdir()
    full(disk)
    with pytest.raises(StorageError, match=r"^Taking the run's lock .*train\.lock' failed: No "
                       "space left on device"):
        RunLock(run.lock_file).acquire()
    with pytest.raises(StorageError, match=r"^Recording the resume in .*resumes\.jsonl' "
                       "failed: No space left on device"):
        run.record_resume(10, "ckpt-10")


def test_the_timeline_on_a_full_disk_falls_silent_and_says_so_once(disk, caplog):
    timeline = Timeline(disk / "run")
    timeline.start(1)
    full(disk)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        for step in range(1, 2000):  # never raises: training goes on without it
            timeline.loop_end(step, 1, 0.1)
    assert caplog.text.count("Could not write the run's timeline") == 1
    assert "No space left on device" in caplog.text


def test_a_read_only_file_system_is_a_storage_error_with_its_own_fix(disk):
    manager = cadence.CheckpointManager(Net(), disk / "ckpt")
    manager.save(1)
    with read_only(disk), pytest.raises(StorageError) as raised:
        manager.save(2)
    assert raised.value.errno == errno.EROFS
    assert "Read-only file system" in str(raised.value)
    assert "use a writable file system, then run the same command again" in str(raised.value)
    assert [c.step for c in manager.checkpoints] == [1]


def test_what_is_not_the_machine_passes_through_as_it_is():
    with pytest.raises(TypeError, match="a bug"), writing("Writing"):
        raise TypeError("a bug")
    with pytest.raises(FileNotFoundError), writing("Writing"):
        raise FileNotFoundError(errno.ENOENT, "No such file")
    assert storage_cause(RuntimeError("(os error 2)")) is None  # ENOENT: not the machine's
    chained = RuntimeError("wrapped")
    chained.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert storage_error("Saving", chained).fix.startswith("free some space")
