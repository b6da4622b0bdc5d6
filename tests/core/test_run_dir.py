"""`RunLock.holder`: whether a live process trains in a run, found without taking its lock."""

import fcntl
import json
import os
import subprocess
import sys

from cadence.core.run_dir import RunDirectory, RunLock


def test_the_holder_is_the_live_process_that_holds_the_lock(tmp_path):
    lock = RunLock(RunDirectory(tmp_path).lock_file)
    assert lock.holder() is None  # no lock file
    lock.acquire()
    try:
        holder = lock.holder()
        assert holder is not None and holder["pid"] == os.getpid()
    finally:
        lock.release()
    assert lock.holder() is None  # released: the file stays, emptied


def test_a_record_left_by_a_killed_process_is_no_holder(tmp_path):
    """SIGKILL leaves the owner record in the file; the kernel dropped the lock."""
    path = RunDirectory(tmp_path).lock_file
    code = (f"from cadence.core.run_dir import RunLock; import os; "
            f"RunLock({str(path)!r}).acquire(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert json.loads(path.read_text())["pid"] != os.getpid()
    assert RunLock(path).holder() is None


def test_asking_never_takes_the_lock_from_a_trainer_starting_at_that_moment(tmp_path,
                                                                            monkeypatch):
    """On Linux the kernel's table is read; no lock is tried, so an exclusive one taken at the
    same moment never fails because of the question."""
    path = RunDirectory(tmp_path).lock_file
    path.write_text("")
    tried = []
    monkeypatch.setattr(fcntl, "flock", lambda *args: tried.append(args))
    assert RunLock(path).holder() is None
    if os.path.exists("/proc/locks"):
        assert tried == []


def test_a_link_or_a_fifo_as_the_lock_file_is_no_holder_and_no_wait(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text(json.dumps({"pid": os.getpid()}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.lock").symlink_to(target)
    assert RunLock(run / "train.lock").holder() is None
    (run / "train.lock").unlink()
    os.mkfifo(run / "train.lock")
    assert RunLock(run / "train.lock").holder() is None


def test_a_fault_tolerant_run_before_its_first_checkpoint_is_a_run(tmp_path):
    """Replica groups hold a lock each (``train-replica-<g>.lock``, no ``train.lock``) and have
    no ``checkpoints/`` before the first save; the tensorboard writer's hyper-parameters file is
    the run's own too. A group that starts late, or again, trains on in it."""
    from cadence.core.run_dir import RunDirectory, is_run

    run = tmp_path / "ft"
    (run / "timeline").mkdir(parents=True)
    (run / "train" / "replica-0").mkdir(parents=True)
    (run / "params.yaml").write_text("task: {}\n")
    (run / "events.out.tfevents.1795901106.vm.19936.0000.hparams").write_bytes(b"")
    assert not is_run(run)
    assert RunDirectory(run).layout_problem(training=True) is None  # all of them its own
    (run / "train-replica-0.lock").write_text("")
    assert is_run(run)
    assert RunDirectory(run).layout_problem(training=True) is None
    assert RunDirectory(run / "train").layout_problem(training=True).startswith(
        f"{str(run / 'train')!r} is inside the run directory")


def test_a_file_named_like_a_lock_or_an_hparams_file_among_others_is_still_refused(tmp_path):
    from cadence.core.run_dir import RunDirectory

    (tmp_path / "notes.txt").write_text("someone else's")
    (tmp_path / "train-replica-0.lock").write_text("")
    (tmp_path / "events.out.tfevents.1.vm.1.0000.hparams").write_bytes(b"")
    problem = RunDirectory(tmp_path).layout_problem(training=True)
    assert problem is not None and "(notes.txt)" in problem
