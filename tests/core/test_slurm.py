"""cadence.core.slurm without a cluster: a process's place from Slurm's variables, hostlists,
the stop signal and the requeue decision; and what the Controller, the lock, the timeline and
the goodput report do in a Slurm job. The same on a real cluster: tests/test_on_slurm.py."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import pytest
from fakes import CountingTrainer, FakeCheckpointManager

from cadence.core import Controller, Preempted
from cadence.core.errors import JobFailure
from cadence.core.run_dir import RunLock, RunLockedError
from cadence.core.slurm import (
    SlurmJob,
    SlurmOptions,
    adopt_launch_environment,
    expand_hostlist,
    job_fields,
    launch_environment,
    rendezvous_port,
    requeue,
    requeue_refusal,
    signal_name,
    tasks_per_node,
)
from cadence.records.goodput import format_report, goodput_of
from cadence.records.run_record import RunRecord
from cadence.records.timeline import Timeline, read_timeline

STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
        "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
        "SLURMD_NODENAME": "gpu02", "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "gpu[01-02]",
        "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
"""Task 3 of `srun -n 4` on two nodes, as Slurm describes it to the task."""


LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def outside_slurm(monkeypatch):
    """This process outside any Slurm job and torchrun launch, whatever runs the tests; what a
    test's `adopt_launch_environment` sets is taken back after it."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "SLURMD_")):
            monkeypatch.delenv(name)
    for name in LAUNCH:
        monkeypatch.setenv(name, "")  # recorded as it was, so that the end of the test puts
        monkeypatch.delenv(name)      # back its absence


@pytest.fixture
def in_slurm_job(outside_slurm, monkeypatch):
    """This process as the batch script of Slurm job 77, requeued once."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")


# ---------------------------------------------------------------------------- the launch


@pytest.mark.parametrize(("hostlist", "hosts"), [
    ("localhost", ["localhost"]),
    ("node[01-03,07],login", ["node01", "node02", "node03", "node07", "login"]),
    ("rack[1-2]-n[8-9]", ["rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"]),
    ("a[9-11],b", ["a9", "a10", "a11", "b"]),
    ("c[001-002]", ["c001", "c002"]),
])
def test_hostlists_expand_in_slurms_order(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist", ["", "n[", "n]", "n[]", "n[a]", "n[3-1]", "a,,b",
                                      "n[[1]]", ",a", "a,"])
def test_a_hostlist_not_in_slurms_syntax_raises_value_error(hostlist):
    with pytest.raises(ValueError, match="hostlist"):
        expand_hostlist(hostlist)


def test_tasks_per_node_reads_slurms_compressed_counts():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("8") == [8]
    with pytest.raises(ValueError, match="must read like"):
        tasks_per_node("2(x)")


def test_a_task_of_an_srun_step_gets_torchruns_variables_from_slurms():
    assert launch_environment(STEP) == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "gpu01", "MASTER_PORT": str(rendezvous_port("4242", "0"))}


def test_uneven_tasks_per_node_give_this_nodes_own_count():
    env = {**STEP, "SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
           "SLURM_STEP_TASKS_PER_NODE": "2,1"}
    assert launch_environment(env)["LOCAL_WORLD_SIZE"] == "1"


def test_the_rendezvous_port_differs_between_steps_and_jobs_and_stays_below_ephemeral_ports():
    ports = {rendezvous_port(str(job), str(step)) for job in (1, 2, 999) for step in (0, 1)}
    assert len(ports) == 6 and all(15000 <= port < 32768 for port in ports)


@pytest.mark.parametrize(("change", "why"), [
    ({"SLURM_STEP_ID": None}, "the batch script: one process"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "srun torchrun: torchrun placed it"),
    ({"SLURM_PROCID": None}, "no task of a step"),
])
def test_nothing_is_set_outside_a_step_or_under_torchrun(change, why):
    env = {**STEP, **change}
    env = {name: value for name, value in env.items() if value is not None}
    assert launch_environment(env) == {}, why


def test_a_users_rendezvous_is_kept():
    placed = launch_environment({**STEP, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"})
    assert "MASTER_ADDR" not in placed and "MASTER_PORT" not in placed


@pytest.mark.parametrize("change", [{"SLURM_PROCID": "x"}, {"SLURM_PROCID": "4"},
                                    {"SLURM_STEP_NODELIST": "gpu[01-"}])
def test_slurm_variables_that_do_not_make_sense_raise_job_failure(change):
    with pytest.raises(JobFailure, match="Slurm's variables do not say where this process sits"):
        launch_environment({**STEP, **change})


def test_adopting_sets_the_variables_once_and_the_rank_is_slurms(outside_slurm, monkeypatch):
    from cadence.core.rank import local_rank, process_rank, world_size

    for name, value in STEP.items():
        monkeypatch.setenv(name, value)
    assert adopt_launch_environment()["RANK"] == "3"
    assert (process_rank(), world_size(), local_rank()) == (3, 4, 1)
    assert adopt_launch_environment() == {}  # torchrun's variables are there now


def test_the_batch_script_of_several_tasks_is_warned_that_it_trains_alone(
        outside_slurm, monkeypatch, caplog):
    import cadence.core.slurm as slurm

    monkeypatch.setattr(slurm, "_warned_batch", False)
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_PROCID", "0")
    with caplog.at_level(logging.WARNING, logger="cadence"):
        assert adopt_launch_environment() == {}
        adopt_launch_environment()  # once
    warnings = [r.getMessage() for r in caplog.records if "outside srun" in r.getMessage()]
    assert len(warnings) == 1 and "srun cadence train" in warnings[0]


def test_the_cadence_command_takes_its_place_from_slurm_before_anything_else(tmp_path):
    """`srun -n 2 cadence config` in miniature: the command reads its rank from Slurm."""
    code = ("import sys; from cadence.task.cli import main; from cadence.core import rank; "
            "main(['config']); print('place', rank.process_rank(), rank.world_size(), "
            "file=sys.stderr)")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("SLURM")} | STEP | {"SLURM_PROCID": "1", "SLURM_LOCALID": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "place 0 1" in done.stderr  # `config` is not a job's command: left alone
    code = code.replace("main(['config'])", "main(['eval', '-m', 'nowhere'])")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert "place 1 4" in done.stderr, done.stderr


# ---------------------------------------------------------------------------- the job


def test_the_job_is_read_from_the_environment_and_a_first_run_has_restarted_zero_times():
    assert SlurmJob.from_environ({"SLURM_JOB_ID": "9"}) == SlurmJob("9", "batch", 0)
    assert SlurmJob.from_environ({"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "2",
                                  "SLURM_RESTART_COUNT": "3"}) == SlurmJob("9", "2", 3)
    assert SlurmJob.from_environ({}) is None
    assert SlurmJob.from_environ({"SLURM_JOB_ID": "9; rm -rf /"}) is None


def test_a_task_of_an_array_job_is_named_so_that_a_requeue_takes_that_task_alone():
    """The first task's SLURM_JOB_ID is the array's id: `scontrol requeue` of it would requeue
    every task of the array."""
    env = {"SLURM_JOB_ID": "500", "SLURM_ARRAY_JOB_ID": "500", "SLURM_ARRAY_TASK_ID": "0"}
    assert SlurmJob.from_environ(env).job_id == "500_0"


@pytest.mark.parametrize(("name", "canonical"), [("USR1", "SIGUSR1"), ("sigusr2", "SIGUSR2"),
                                                 ("SIGTERM", "SIGTERM")])
def test_a_stop_signal_is_named_as_slurm_or_python_names_it(name, canonical):
    assert signal_name(name) == canonical
    assert SlurmOptions(signal=name).stop_signal == signal.Signals[canonical]


@pytest.mark.parametrize("name", ["SIGKILL", "STOP", "SIGINT", "USR3", "SIG_IGN", 10, ""])
def test_a_stop_signal_that_cannot_be_caught_or_is_not_one_raises_value_error(name):
    with pytest.raises(ValueError, match="must be the name of a signal that can be caught"):
        SlurmOptions(signal=name)


def test_requeue_must_be_a_bool():
    with pytest.raises(ValueError, match="`requeue`"):
        SlurmOptions(requeue="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "refused"), [
    ({"JobState": "RUNNING", "Requeue": "1"}, None),
    ({"JobState": "RUNNING", "Requeue": "0"}, "Requeue=0"),
    ({"JobState": "COMPLETING", "Requeue": "1"}, "JobState=COMPLETING"),  # scancel, time limit
])
def test_only_a_running_job_that_slurm_lets_requeue_is_requeued(fields, refused):
    why = requeue_refusal(fields)
    assert (why is None) if refused is None else (refused in why)


def test_scontrols_one_line_is_read_as_fields():
    line = "JobId=7 JobName=x y JobState=RUNNING Reason=None Requeue=1 Restarts=2"
    assert job_fields(line)["Restarts"] == "2" and job_fields(line)["JobState"] == "RUNNING"


def test_a_requeue_without_scontrol_says_so_and_the_job_ends(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol there
    with caplog.at_level(logging.WARNING, logger="cadence"):
        assert requeue(SlurmJob("77", "batch")) is False
    assert "Could not requeue the Slurm job: `scontrol show job -o 77` failed" in caplog.text
    assert "Resubmit the job" in caplog.text


# ---------------------------------------------------------------------------- preemption


class SelfSignalling(CountingTrainer):
    """Sends itself `signals` at step 20, one after the other."""

    def __init__(self, *signals):
        super().__init__()
        self.signals = signals

    def train(self, num_steps):
        if self.global_step == 20:
            for signum in self.signals:
                os.kill(os.getpid(), signum)
        return super().train(num_steps)


@pytest.fixture
def restore_signals():
    """Puts back this process's handlers of the stop signals after the test."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_in_a_slurm_job_sigusr1_saves_and_raises_preempted_once_however_often_it_comes(
        in_slurm_job, restore_signals, tmp_path, caplog):
    trainer = SelfSignalling(signal.SIGUSR1, signal.SIGUSR1, signal.SIGTERM)
    manager = FakeCheckpointManager(trainer)
    record = RunRecord(tmp_path)
    controller = Controller(trainer=trainer, steps_per_loop=10, checkpoint_manager=manager,
                            slurm=SlurmOptions(requeue=False), record=record)
    with caplog.at_level(logging.WARNING, logger="cadence"), pytest.raises(Preempted) as raised:
        controller.train(100)
    record.close()
    assert raised.value.code == 128 + signal.SIGUSR1 and raised.value.checkpoint == "ckpt-30"
    assert raised.value.requeued is False
    assert caplog.text.count("Received SIGUSR1: stopping after this step") == 1
    assert [e["signal"] for e in read_timeline(tmp_path).run if e.event == "signal"] == [
        "SIGUSR1"]
    # Stopping on its way out: a later delivery (Slurm's requeue, the job-wide signal) does not
    # kill it in the middle of closing its files.
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        assert signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN, None)
    os.kill(os.getpid(), signal.SIGUSR1)  # nothing happens


def test_a_second_sigterm_is_harmless_outside_slurm_too_and_the_handler_is_put_back(
        outside_slurm, caplog):
    trainer = SelfSignalling(signal.SIGTERM, signal.SIGTERM)
    controller = Controller(trainer=trainer, steps_per_loop=10,
                            checkpoint_manager=FakeCheckpointManager(trainer))
    previous = signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.WARNING, logger="cadence"), pytest.raises(Preempted):
        controller.train(100)
    assert caplog.text.count("Received SIGTERM") == 1
    assert signal.getsignal(signal.SIGTERM) is previous


def test_outside_slurm_sigusr1_is_left_alone(outside_slurm):
    seen = {}

    class Looking(CountingTrainer):
        def train(self, num_steps):
            seen["usr1"] = signal.getsignal(signal.SIGUSR1)
            return super().train(num_steps)

    previous = signal.getsignal(signal.SIGUSR1)
    Controller(trainer=Looking(), steps_per_loop=10).train(10)
    assert seen["usr1"] is previous


def test_the_slurm_signal_can_be_another_or_none(in_slurm_job, restore_signals):
    seen = {}

    class Looking(CountingTrainer):
        def train(self, num_steps):
            seen["usr2"] = signal.getsignal(signal.SIGUSR2)
            seen["usr1"] = signal.getsignal(signal.SIGUSR1)
            return super().train(num_steps)

    before = signal.getsignal(signal.SIGUSR1)
    Controller(trainer=Looking(), steps_per_loop=10,
               slurm=SlurmOptions(signal="USR2", requeue=False)).train(10)
    assert seen["usr1"] is before and seen["usr2"] is not signal.getsignal(signal.SIGUSR2)
    Controller(trainer=Looking(), steps_per_loop=10, slurm=SlurmOptions(signal=None)).train(10)
    assert seen["usr1"] is before and seen["usr2"] is signal.getsignal(signal.SIGUSR2)


def test_a_stop_without_a_checkpoint_is_not_requeued(in_slurm_job, restore_signals,
                                                     monkeypatch, tmp_path, caplog):
    """A run with nothing saved would start again from nothing at every requeue."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: a requeue would say so
    controller = Controller(trainer=SelfSignalling(signal.SIGUSR1), steps_per_loop=10)
    with caplog.at_level(logging.INFO, logger="cadence"), pytest.raises(Preempted) as raised:
        controller.train(100)
    assert raised.value.requeued is False and raised.value.checkpoint is None
    assert "requeue" not in caplog.text.lower()


# ---------------------------------------------------------------------------- records


def test_the_timeline_and_the_goodput_report_name_the_slurm_job_of_each_attempt(
        in_slurm_job, tmp_path):
    clock = iter([100.0, 110.0, 111.0, 140.0, 150.0, 151.0])
    first = Timeline(tmp_path, clock=lambda: next(clock))
    first.attempt = "1-a"
    first.start(1, process_start_t=100.0)
    first.loop_end(10, 10, 9.0)
    first.end("preempted", 10)
    first.close()
    second = Timeline(tmp_path, clock=lambda: next(clock))
    second.attempt = "2-b"
    second.start(1, process_start_t=140.0, slurm=SlurmJob("77", "batch", 2))
    second.loop_end(20, 10, 9.0)
    second.end("finished", 20)
    second.close()
    events = read_timeline(tmp_path).run
    assert [(e["slurm_job"], e["slurm_step"], e["slurm_restart"]) for e in events
            if e.event == "start"] == [("77", "batch", 1), ("77", "batch", 2)]
    report = goodput_of(events)
    assert [a.waited_s for a in report.attempts] == [0.0, 29.0]
    assert report.badput_s["between_attempts"] == 29.0
    lines = format_report(report)
    assert "       Slurm job 77 (step batch), SLURM_RESTART_COUNT 1" in lines
    assert ("       Slurm job 77 (step batch), SLURM_RESTART_COUNT 2; 29.0 s between attempts "
            "before it (in Slurm's queue)") in lines


def test_outside_slurm_the_timeline_has_no_job(outside_slurm, tmp_path):
    with Timeline(tmp_path) as timeline:
        timeline.start(1)
    (start,) = read_timeline(tmp_path).run
    assert start["slurm_job"] is None and "Slurm" not in "\n".join(
        format_report(goodput_of([start])))


def test_the_lock_names_the_slurm_job_and_step_that_holds_it(in_slurm_job, monkeypatch,
                                                              tmp_path):
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    lock = RunLock(tmp_path / "train.lock")
    lock.acquire()
    try:
        assert lock.holder()["slurm_job"] == "77"
        with pytest.raises(RunLockedError, match=r"in Slurm job 77 \(step 3\)"):
            RunLock(tmp_path / "train.lock").acquire()
    finally:
        lock.release()


def test_init_distributed_and_the_command_refuse_slurm_variables_that_make_no_sense(
        outside_slurm, monkeypatch, capsys):
    from cadence.engine.runtime import init_distributed
    from cadence.task.cli import main

    for name, value in {**STEP, "SLURM_PROCID": "seven"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(JobFailure, match="SLURM_PROCID='seven' is not a number"):
        init_distributed()
    assert main(["train", "--set", "trainer.train_steps=1"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("cadence: error: Slurm's variables do not say where this process "
                           "sits in its job (SLURM_PROCID='seven' is not a number). Launch it")
