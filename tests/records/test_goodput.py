"""Goodput from a run's timeline (cadence.records.goodput): golden timelines written by hand,
one per way a run goes -- a clean finish, a crash and a restart, a preemption, a resize, an elastic
restart, a loss-guard recovery, a straddling loop, the worked example of failures.md 3.3 -- each
with its figures worked out by hand, and in every case the parts add up to the wall time.

These tests import nothing but cadence.core and cadence.records:
`test_goodput_works_with_torch_blocked` runs this file again in a
process where importing torch fails.
"""

import json
import math
import os
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_blocker import assert_passes_without_torch

from cadence.core.errors import ConfigError
from cadence.core.run_dir import RunDirectory
from cadence.records.goodput import (
    BADPUT_CAUSES,
    GoodputCalculator,
    format_report,
    goodput_of,
    run_goodput,
)
from cadence.records.timeline import Event, Timeline, read_timeline


class Script:
    """A timeline written by hand: ``script(t, event, attempt, **fields)`` appends a line."""

    def __init__(self, root):
        self.root = Path(root)
        self.records = []

    def __call__(self, t, event, attempt, **fields):
        self.records.append({"t": float(t), "event": event, "attempt": attempt, **fields})

    def loop(self, t, attempt, step, steps, seconds, data_wait_s=0.0, checkpoint_wait_s=0.0):
        self(t, "loop_end", attempt, step=step, steps=steps, seconds=seconds,
             data_wait_s=data_wait_s, checkpoint_wait_s=checkpoint_wait_s)

    def write(self, extra_lines=()):
        directory = self.root / "timeline"
        directory.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(record) for record in self.records] + list(extra_lines)
        (directory / "run.jsonl").write_text("".join(line + "\n" for line in lines))

    def report(self, **kwargs):
        self.write()
        return checked(run_goodput(self.root, **kwargs))


def checked(report):
    """`report`, after checking that its parts add up to the wall time, none negative."""
    parts = [report.productive_s, *report.badput_s.values()]
    assert all(part >= 0 for part in parts), report.badput_s
    assert math.isclose(math.fsum(parts), report.wall_s, rel_tol=1e-12, abs_tol=1e-9)
    assert list(report.badput_s) == list(BADPUT_CAUSES)
    return report


def badput(report, **expected):
    """The badput causes, with every cause not named in `expected` expected to be 0."""
    return {cause: pytest.approx(expected.get(cause, 0.0), abs=1e-9)
            for cause in BADPUT_CAUSES} == report.badput_s


@pytest.fixture
def script(tmp_path):
    return Script(tmp_path / "run")


def test_a_clean_run(script):
    s = script
    s(100, "start", "A", world_size=2, process_start_t=95.0, pid=11, host="h")
    s(104, "setup_end", "A")
    s(104, "restore_begin", "A")
    s(105, "restore_end", "A", step=0, checkpoint=None)
    s.loop(115, "A", 10, 10, 9.0, data_wait_s=1.0, checkpoint_wait_s=0.5)  # from 106
    s(116, "save", "A", step=10, stall_s=0.5)
    s(116.2, "commit", "A", step=10, checkpoint="ckpt-10")
    s(116.5, "eval_begin", "A", step=10)
    s(118.5, "eval_end", "A", step=10)
    s.loop(128.5, "A", 20, 10, 10.0)
    s(129.5, "save", "A", step=20, stall_s=1.0)
    s(130, "commit", "A", step=20, checkpoint="ckpt-20")
    s(130, "end", "A", outcome="finished", step=20)
    report = s.report()
    assert report.wall_s == 35.0  # from the process's creation
    assert report.productive_s == 17.5 and report.goodput == 0.5
    # startup: 95..104 and 105..106; other: before the save's stall, the commit, the eval and
    # the last commit.
    assert badput(report, startup=10.0, restore=1.0, checkpoint=2.0, evaluation=2.0,
                  data_wait=1.0, other=1.5)
    (attempt,) = report.attempts
    assert (attempt.world_size, attempt.first_step, attempt.last_step, attempt.end) == (
        2, 0, 20, "finished")
    assert attempt.start_t == 95.0 and attempt.end_t == 130.0 and attempt.setup_s == 9.0
    assert attempt.committed_step == 20 and attempt.lost_steps == 0 and attempt.error is None
    assert report.steps == 20 and not report.live and report.skipped_lines == 0


def crash_then_restart(s):
    s(0, "start", "A", world_size=4)
    s.loop(10, "A", 10, 10, 10.0)
    s(11, "save", "A", step=10, stall_s=1.0)
    s(11, "commit", "A", step=10, checkpoint="ckpt-10")
    s.loop(21, "A", 20, 10, 10.0)
    s.loop(31, "A", 30, 10, 10.0)
    # SIGKILL: no end. Down from 31 until the new process is created at 40.
    s(45, "start", "B", world_size=4, process_start_t=40.0)
    s(45, "restore_begin", "B")
    s(47, "restore_end", "B", step=10, checkpoint="ckpt-10")
    s.loop(57, "B", 20, 10, 10.0)
    s.loop(67, "B", 30, 10, 10.0)
    s(68, "save", "B", step=30, stall_s=1.0)
    s(68, "end", "B", outcome="finished", step=30)


def test_a_crash_then_a_restart_that_restores_an_earlier_checkpoint(script):
    crash_then_restart(script)
    report = script.report()
    assert report.wall_s == 68.0 and report.productive_s == 30.0
    assert badput(report, lost_progress=20.0, between_attempts=9.0, startup=5.0, restore=2.0,
                  checkpoint=2.0)
    first, second = report.attempts
    assert (first.end, first.first_step, first.last_step, first.lost_steps, first.lost_s) == (
        "crashed", 0, 30, 20, 20.0)
    assert first.committed_step == 10 and first.end_t == 31.0
    assert (second.end, second.first_step, second.last_step, second.lost_steps) == (
        "finished", 10, 30, 0)
    assert second.start_t == 40.0 and report.steps == 30


def test_a_preemption_and_a_resume_lose_nothing(script):
    s = script
    s(0, "start", "A", world_size=8)
    s.loop(10, "A", 10, 10, 10.0)
    s.loop(20, "A", 20, 10, 10.0)
    s(21, "signal", "A", signal="SIGTERM")
    s(23, "save", "A", step=20, stall_s=2.0)
    s(23, "commit", "A", step=20, checkpoint="ckpt-20")
    s(23, "end", "A", outcome="preempted", step=20)
    s(30, "start", "B", world_size=8)
    s(30, "restore_begin", "B")
    s(31, "restore_end", "B", step=20, checkpoint="ckpt-20")
    s.loop(41, "B", 30, 10, 10.0)
    s(41, "end", "B", outcome="finished", step=30)
    report = script.report()
    assert report.wall_s == 41.0 and report.productive_s == 30.0
    assert badput(report, between_attempts=7.0, restore=1.0, checkpoint=2.0, other=1.0)
    first, second = report.attempts
    assert (first.end, first.signal, first.lost_steps) == ("preempted", "SIGTERM", 0)
    assert (second.end, second.first_step, second.last_step) == ("finished", 20, 30)


def test_a_world_size_change_between_attempts(script):
    s = script
    s(0, "start", "A", world_size=4)
    s.loop(10, "A", 40, 40, 10.0)
    s(11, "save", "A", step=40, stall_s=1.0)
    s(11, "end", "A", outcome="preempted", step=40)
    s(20, "start", "B", world_size=2)
    s(21, "restore_end", "B", step=40, checkpoint="ckpt-40")
    s.loop(41, "B", 80, 40, 20.0)  # half the processes, twice the time per step
    s(41, "end", "B", outcome="finished", step=80)
    report = script.report()
    assert [a.world_size for a in report.attempts] == [4, 2]
    assert [(a.first_step, a.last_step) for a in report.attempts] == [(0, 40), (40, 80)]
    assert report.productive_s == 30.0
    assert badput(report, checkpoint=1.0, between_attempts=9.0, startup=1.0)


def test_an_elastic_restart_counts_up_and_keeps_the_world_size(script):
    s = script
    s(0, "start", "A", world_size=2, restart=0)
    s.loop(10, "A", 10, 10, 10.0)
    s(10.5, "save", "A", step=10, stall_s=0.5)
    s(10.5, "commit", "A", step=10, checkpoint="ckpt-10")
    s.loop(20, "A", 15, 5, 9.5)
    # One rank died at 20; torchrun restarts the round. The new process was created before the
    # old one's last record was written: the attempt begins no earlier than that record.
    s(25, "start", "B", world_size=2, restart=1, process_start_t=19.0)
    s(26, "restore_end", "B", step=10, checkpoint="ckpt-10")
    s.loop(36, "B", 20, 10, 10.0)
    s(36, "end", "B", outcome="finished", step=20)
    report = script.report()
    assert [(a.restart, a.world_size, a.end) for a in report.attempts] == [
        (0, 2, "crashed"), (1, 2, "finished")]
    assert report.attempts[1].start_t == 20.0
    assert badput(report, lost_progress=9.5, checkpoint=0.5, startup=6.0)
    assert report.productive_s == 20.0 and report.attempts[0].lost_steps == 5


def test_a_loss_guard_recovery_inside_one_attempt(script):
    s = script
    s(0, "start", "A", world_size=1)
    s.loop(10, "A", 10, 10, 10.0)
    s.loop(20, "A", 20, 10, 10.0)
    s(21, "save", "A", step=20, stall_s=1.0)
    s(21, "commit", "A", step=20, checkpoint="ckpt-20")
    s.loop(31, "A", 30, 10, 10.0)  # the loss blew up in this loop
    s(31, "restore_begin", "A")
    s(33, "restore_end", "A", step=20, checkpoint="ckpt-20")
    s.loop(43, "A", 30, 10, 10.0)
    s.loop(53, "A", 40, 10, 10.0)
    s(53, "end", "A", outcome="finished", step=40)
    report = script.report()
    assert report.productive_s == 40.0 and report.steps == 40
    assert badput(report, lost_progress=10.0, restore=2.0, checkpoint=1.0)
    (attempt,) = report.attempts
    assert (attempt.lost_steps, attempt.lost_s, attempt.first_step, attempt.last_step) == (
        10, 10.0, 0, 40)


def test_a_loop_that_straddles_the_restored_step_loses_its_share_above_it(script):
    s = script
    s(0, "start", "A", world_size=1)
    s.loop(10, "A", 10, 10, 10.0)
    s.loop(20, "A", 20, 10, 10.0, data_wait_s=2.0)  # 8 s of compute for steps 11..20
    s(30, "start", "B", world_size=1)
    s(30, "restore_end", "B", step=15, checkpoint="ckpt-15")  # a callback saved mid-loop
    s.loop(35, "B", 20, 5, 5.0)
    s(35, "end", "B", outcome="finished", step=20)
    report = script.report()
    assert report.attempts[0].lost_steps == 5 and report.attempts[0].lost_s == 4.0
    assert report.productive_s == 10.0 + 4.0 + 5.0 and report.steps == 20
    # The lost loop's input wait stays data wait: it happened whatever became of the steps.
    assert badput(report, lost_progress=4.0, data_wait=2.0, between_attempts=10.0)


def test_a_restore_of_nothing_after_earlier_loops_loses_them_all(script):
    s = script
    s(0, "start", "A", world_size=1)
    s.loop(10, "A", 10, 10, 10.0)
    s.loop(20, "A", 20, 10, 10.0)
    s(22, "start", "B", world_size=1)
    s(22, "restore_begin", "B")
    s(23, "restore_end", "B", step=0, checkpoint=None)  # it crashed before its first save
    s.loop(33, "B", 10, 10, 10.0)
    s(33, "end", "B", outcome="finished", step=10)
    report = script.report()
    assert report.productive_s == 10.0 and report.attempts[0].lost_steps == 20
    assert badput(report, lost_progress=20.0, between_attempts=2.0, restore=1.0)


def test_steps_trained_again_without_a_restore_recorded_are_a_rollback(script):
    s = script
    s(0, "start", "A", world_size=1)
    for k in range(1, 4):
        s.loop(10 * k, "A", 10 * k, 10, 10.0)
    s(40, "start", "B", world_size=1)
    s.loop(50, "B", 20, 10, 10.0)  # from step 10: steps 11..30 were thrown away
    s(50, "end", "B", outcome="finished", step=20)
    report = script.report()
    assert report.attempts[0].lost_steps == 20 and report.productive_s == 20.0
    assert badput(report, lost_progress=20.0, between_attempts=10.0)


def test_the_worked_example_of_failures_md_3_3():
    """200 minutes, 50% goodput; the losses: 40 min progress lost, 25 slowdown, 15 restart,
    10 load, 10 save (AI-Hypercomputer/resiliency's docs): 50/5/20/7.5/5/12.5 %."""
    minute = 60.0
    events = []

    def e(t, name, attempt, **fields):
        events.append(Event(t * minute, name, attempt, fields))

    def loop(t, attempt, step, minutes):
        e(t, "loop_end", attempt, step=step, steps=10, seconds=minutes * minute,
          data_wait_s=0.0, checkpoint_wait_s=0.0)

    e(0, "start", "A", world_size=256)
    loop(10, "A", 10, 10)
    e(15, "save", "A", step=10, stall_s=5 * minute)
    e(15, "commit", "A", step=10, checkpoint="ckpt-10")
    for k in range(4):  # 40 minutes of steps that the crash throws away
        loop(25 + 10 * k, "A", 20 + 10 * k, 10)
    e(70, "start", "B", world_size=256)  # 15 minutes to restart
    e(70, "restore_begin", "B")
    e(80, "restore_end", "B", step=10, checkpoint="ckpt-10")  # 10 minutes to load
    t, step = 80.0, 10
    for minutes in [10] * 5 + [16.25] * 4:  # four slow loops: 25 minutes of slowdown
        t, step = t + minutes, step + 10
        loop(t, "B", step, minutes)
    e(200, "save", "B", step=100, stall_s=5 * minute)
    e(200, "end", "B", outcome="finished", step=100)
    report = checked(goodput_of(events))
    share = {cause: seconds / report.wall_s for cause, seconds in report.badput_s.items()}
    assert report.wall_s == 200 * minute
    assert share == pytest.approx({"startup": 0, "restore": 0.05, "checkpoint": 0.05,
                                   "evaluation": 0, "data_wait": 0, "lost_progress": 0.20,
                                   "between_attempts": 0.075, "other": 0})
    assert report.ideal_step_s == minute
    assert report.slowdown_s / report.wall_s == pytest.approx(0.125)
    assert report.ideal_goodput == pytest.approx(0.50)
    assert report.goodput == pytest.approx(0.625)  # the slow steps were trained: productive


def test_a_live_run_counts_up_to_now_in_its_running_attempt(script):
    s = script
    s(0, "start", "A", world_size=1, pid=os.getpid(), host=socket.gethostname())
    s.loop(10, "A", 10, 10, 10.0)
    s.write()
    with RunDirectory(s.root).training_lock():  # this process trains in the run
        report = checked(run_goodput(s.root, now=25.0))
    assert report.live and report.wall_s == 25.0
    assert report.attempts[0].end == "running" and report.attempts[0].end_t == 25.0
    assert badput(report, other=15.0)  # the loop in progress
    assert not run_goodput(s.root, now=25.0).live  # released: it crashed


def test_a_run_held_by_a_process_that_has_not_recorded_its_start_is_between_attempts(script):
    s = script
    s(0, "start", "A", world_size=1, pid=1, host=socket.gethostname())  # another process
    s.loop(10, "A", 10, 10, 10.0)
    s.write()
    with RunDirectory(s.root).training_lock():
        report = checked(run_goodput(s.root, now=25.0))
    assert report.live and report.attempts[0].end == "crashed"
    assert badput(report, between_attempts=15.0)


def test_events_of_another_process_or_before_the_first_start_are_not_counted(script):
    s = script
    s.loop(5, "Z", 10, 10, 10.0)  # before any start
    s(10, "start", "A", world_size=1)
    s.loop(20, "A", 10, 10, 10.0)
    s.loop(22, "OLD", 20, 10, 10.0)  # a process that is not the current attempt's
    s(25, "end", "A", outcome="finished", step=10)
    script.write(extra_lines=["torn {", '{"t": "x"}'])
    report = checked(run_goodput(script.root))
    assert report.skipped_lines == 2 + 2
    assert report.productive_s == 10.0 and report.wall_s == 15.0


def test_a_background_commit_in_the_middle_of_a_loop_takes_no_time_from_it(script):
    s = script
    s(0, "start", "A", world_size=1)
    s.loop(10, "A", 10, 10, 10.0)
    s(10.5, "save", "A", step=10, stall_s=0.5)  # the snapshot; the write goes on behind
    s(15, "commit", "A", step=10, checkpoint="ckpt-10")  # durable, mid-loop
    s.loop(20.5, "A", 20, 10, 10.0)
    s(20.5, "end", "A", outcome="finished", step=20)
    report = script.report()
    assert report.productive_s == 20.0 and badput(report, checkpoint=0.5)


def test_an_error_end_is_reported_with_its_text(script):
    s = script
    s(0, "start", "A", world_size=1)
    s.loop(10, "A", 10, 10, 10.0)
    s(11, "end", "A", outcome="error", step=10, error="DivergenceError: loss is nan")
    report = script.report()
    assert report.attempts[0].end == "error"
    assert report.attempts[0].error == "DivergenceError: loss is nan"
    assert any("error: DivergenceError" in line for line in format_report(report))


def test_a_clock_stepped_back_accounts_no_negative_time(script):
    s = script
    s(100, "start", "A", world_size=1)
    s.loop(110, "A", 10, 10, 10.0)
    s(90, "start", "B", world_size=1)  # a host whose clock is behind
    s(91, "restore_end", "B", step=10, checkpoint="ckpt-10")
    s.loop(120, "B", 20, 10, 29.0)
    s(120, "end", "B", outcome="finished", step=20)
    report = script.report()
    assert report.wall_s == 20.0 and report.badput_s["between_attempts"] == 0.0


def test_a_loop_of_no_steps_made_no_progress(script):
    s = script
    s(0, "start", "A", world_size=1)
    s.loop(10, "A", 10, 10, 10.0)
    s.loop(12, "A", 10, 0, 2.0)  # the data ended before a step
    s(12, "end", "A", outcome="finished", step=10)
    report = script.report()
    assert report.productive_s == 10.0 and badput(report, other=2.0)


def test_each_ranks_input_wait_is_summed_and_the_slowest_named(script):
    crash_then_restart(script)
    script.write()
    directory = script.root / "timeline"
    for rank, waits in ((1, [0.5, 4.0]), (2, [0.25, 0.25])):
        (directory / f"rank-{rank}.jsonl").write_text("".join(
            json.dumps({"t": 10.0 * (i + 1), "event": "loop_end", "attempt": f"r{rank}",
                        "step": 10 * (i + 1), "steps": 10, "seconds": 10.0,
                        "data_wait_s": wait, "checkpoint_wait_s": 0.0}) + "\n"
            for i, wait in enumerate(waits)))
    report = checked(run_goodput(script.root))
    assert [(r["rank"], r["loops"], r["data_wait_s"]) for r in report.ranks] == [
        (0, 5, 0.0), (1, 2, 4.5), (2, 2, 0.5)]
    assert report.worst_data_wait["rank"] == 1
    assert any("rank 1 waited longest, 4.5 s" in line for line in format_report(report))


def test_a_fault_tolerant_job_counts_a_groups_absence_as_lost_capacity(script):
    """Two replica groups: group 1 crashed at 31 and came back at 40 (its record is the crash
    and restart above); group 0 trained on alone, 0..68, productive but for its waits. The
    job's figures are in capacity: the groups' group-seconds over 2 groups."""
    crash_then_restart(script)
    script.write()
    directory = script.root / "timeline"
    group_1 = (directory / "run.jsonl").read_text()
    (directory / "run.jsonl").unlink()
    (directory / "run-replica-1.jsonl").write_text(group_1)
    alone = [line for line in group_1.splitlines() if json.loads(line)["attempt"] == "A"]
    (directory / "run-replica-0.jsonl").write_text("\n".join(alone) + "\n")
    report = checked(run_goodput(script.root))
    first, second = (checked(group) for group in report.replicas)
    assert [g.replica for g in report.replicas] == [0, 1]
    assert report.wall_s == 68.0  # the job: from its first group's start to its last event
    assert report.productive_s == (first.productive_s + second.productive_s) / 2
    assert report.goodput == report.productive_s / 68.0
    # group 0's record ends at 31: the rest of the job's wall time it was absent
    absent = 68.0 - first.wall_s
    assert report.badput_s["between_attempts"] == pytest.approx(
        (first.badput_s["between_attempts"] + second.badput_s["between_attempts"] + absent) / 2)
    assert [a.attempt for a in report.attempts] == ["A", "A", "B"]


def write_group(directory, group, records):
    (directory / f"run-replica-{group}.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in records))


def loop(t, attempt, step, steps, seconds, **waits):
    return {"t": float(t), "event": "loop_end", "attempt": attempt, "step": step,
            "steps": steps, "seconds": seconds, **waits}


def test_a_survivors_detection_stall_is_not_productive_and_its_discarded_step_is_lost(script):
    """Group 1 dies at 25; group 0, the survivor, waits in its loop of 20..30 for the others
    to agree (the lighthouse's heartbeat: 5 s of stall_s) after computing a step no group
    committed (1 s of discarded_s). That time is neither productive nor the loop's compute:
    the stall is other time, as docs/reliability.md says of a detection, the discarded step
    lost progress."""
    directory = script.root / "timeline"
    directory.mkdir(parents=True)
    start = {"event": "start", "world_size": 1, "replicas": 2}
    write_group(directory, 0, [
        {**start, "t": 0.0, "attempt": "A", "replica": 0},
        loop(10, "A", 10, 10, 10.0), loop(20, "A", 20, 10, 10.0),
        loop(36, "A", 30, 10, 16.0, stall_s=5.0, discarded_s=1.0),
        {"t": 36.0, "event": "end", "attempt": "A", "outcome": "finished", "step": 30}])
    write_group(directory, 1, [{**start, "t": 0.0, "attempt": "B", "replica": 1},
                               loop(10, "B", 10, 10, 10.0), loop(20, "B", 20, 10, 10.0)])
    report = checked(run_goodput(script.root))
    survivor = checked(report.replicas[0])
    assert survivor.productive_s == 30.0  # 10 + 10 + (16 - 5 - 1)
    assert badput(survivor, other=5.0, lost_progress=1.0)
    assert survivor.attempts[0].lost_s == 1.0
    # each attempt names its group, in the job's table too
    assert [(a.attempt, a.replica) for a in report.attempts] == [("A", 0), ("B", 1)]
    table = format_report(report)
    header = next(line for line in table if "world" in line)
    assert header.split()[:3] == ["#", "group", "world"]
    assert [line.split()[:2] for line in table if line.strip().startswith(("1 ", "2 "))] == [
        ["1", "0"], ["2", "1"]]
    # the job's ideal step time and slowdown (capacity): every loop took 1 s a step
    assert report.ideal_step_s == 1.0 and report.slowdown_s == 0.0
    assert report.ideal_goodput == pytest.approx(report.goodput)


def test_the_job_ideal_step_and_slowdown_come_from_every_groups_loops(script):
    directory = script.root / "timeline"
    directory.mkdir(parents=True)
    start = {"event": "start", "world_size": 1, "replicas": 2}
    write_group(directory, 0, [{**start, "t": 0.0, "attempt": "A", "replica": 0},
                               loop(10, "A", 10, 10, 10.0), loop(30, "A", 20, 10, 20.0)])
    write_group(directory, 1, [{**start, "t": 0.0, "attempt": "B", "replica": 1},
                               loop(10, "B", 10, 10, 10.0), loop(30, "B", 20, 10, 10.0)])
    report = checked(run_goodput(script.root))
    assert report.ideal_step_s == 1.0  # the median of 1, 2, 1, 1 s a step, by steps
    assert report.slowdown_s == 10.0 / 2  # group 0's slow loop, in capacity (2 groups)
    assert report.ideal_goodput == pytest.approx((report.productive_s - 5.0) / report.wall_s)


def test_a_replica_groups_ranks_waits_are_read(script):
    """Each group's other ranks write replica-<g>-rank-<r>.jsonl: their input waits are summed,
    in the group's report and the job's, and the slowest is named with its group."""
    directory = script.root / "timeline"
    directory.mkdir(parents=True)
    start = {"event": "start", "world_size": 2, "replicas": 2}
    for group in (0, 1):
        write_group(directory, group, [{**start, "t": 0.0, "attempt": f"g{group}",
                                        "replica": group},
                                       loop(10, f"g{group}", 10, 10, 10.0, data_wait_s=0.5)])
        (directory / f"replica-{group}-rank-1.jsonl").write_text(json.dumps(
            loop(10, f"g{group}r1", 10, 10, 10.0, data_wait_s=2.0 + group)) + "\n")
    report = checked(run_goodput(script.root))
    assert [(r["replica"], r["rank"], r["data_wait_s"]) for r in report.ranks] == [
        (0, 0, 0.5), (0, 1, 2.0), (1, 0, 0.5), (1, 1, 3.0)]
    assert [[(r["rank"], r["data_wait_s"]) for r in g.ranks] for g in report.replicas] == [
        [(0, 0.5), (1, 2.0)], [(0, 0.5), (1, 3.0)]]
    assert any("group 1 rank 1 waited longest, 3.0 s over 1 loops (group 1 rank 0: 0.5 s)"
               in line for line in format_report(report))


def test_the_writer_records_what_the_waits_grew_by_in_each_loop(tmp_path):
    waits = {"stall_s": 0.0, "discarded_s": 0.0}
    with Timeline(tmp_path, replica=0, clock=lambda: 100.0,
                  waits=lambda: dict(waits)) as timeline:
        timeline.start(1, replicas=2)
        timeline.loop_end(10, 10, 10.0)
        waits.update(stall_s=5.0, discarded_s=1.0)
        timeline.loop_end(20, 10, 16.0)
        timeline.loop_end(30, 10, 10.0)
    loops = [e for e in read_timeline(tmp_path).replicas[0] if e.event == "loop_end"]
    assert [(e["stall_s"], e["discarded_s"]) for e in loops] == [(0, 0), (5, 1), (0, 0)]


# ---------------------------------------------------------------------------- incremental


def test_a_live_calculator_fed_by_the_writer_agrees_with_the_file_at_every_loop(tmp_path):
    class Clock:
        t = 1000.0

        def __call__(self):
            return self.t

    clock, calculator = Clock(), GoodputCalculator()
    reports = []
    with Timeline(tmp_path, listener=calculator.add, clock=clock) as timeline:
        timeline.start(1, process_start_t=None)
        for step in (10, 20, 30, "blow-up", 30, 40):
            if step == "blow-up":  # the loss guard restores the checkpoint of step 20
                timeline.restore_begin()
                clock.t += 1.0
                timeline.restore_end(20, "ckpt-20")
                continue
            clock.t += 10.0
            timeline.loop_end(step, 10, 9.0, data_wait_s=0.5)  # 1 s between loops
            reports.append(calculator.report(clock.t, live="attempt", ideal=False))
        timeline.end("finished", 40)
    # 8.5 s of compute in each 10 s; the blow-up throws one loop's away and costs 1 s more.
    assert [round(r.goodput, 6) for r in reports] == [
        0.85, 0.85, 0.85, round(3 * 8.5 / 41, 6), round(4 * 8.5 / 51, 6)]
    offline = checked(run_goodput(tmp_path))
    assert checked(calculator.report()).to_json() == offline.to_json()


def test_a_rollback_moves_time_from_productive_to_lost_progress_and_nowhere_else(script):
    crash_then_restart(script)
    events = [Event(r["t"], r["event"], r["attempt"],
                    {k: v for k, v in r.items() if k not in ("t", "event", "attempt")})
              for r in script.records]
    calculator = GoodputCalculator()
    before = None
    for event in events:
        calculator.add(event)
        report = checked(calculator.report())
        assert report.to_json() == goodput_of(events[:events.index(event) + 1]).to_json()
        if event.event == "restore_end":
            moved = report.badput_s["lost_progress"] - before.badput_s["lost_progress"]
            assert moved == 20.0
            assert report.productive_s == before.productive_s - moved
            for cause in BADPUT_CAUSES:
                if cause not in ("lost_progress", "restore"):
                    assert report.badput_s[cause] == before.badput_s[cause], cause
        before = report


def test_an_unknown_liveness_is_refused():
    with pytest.raises(ValueError, match=r"`live` \(got 'yes'\) must be None"):
        GoodputCalculator().report(live="yes")


_names = st.sampled_from(["start", "setup_end", "restore_begin", "restore_end", "loop_end",
                          "eval_begin", "eval_end", "save", "commit", "signal", "end"])


@st.composite
def _events(draw):
    events, t = [], draw(st.floats(0, 1e4))
    for _ in range(draw(st.integers(0, 40))):
        t += draw(st.floats(-5, 50))  # clocks step back sometimes
        name = draw(_names)
        attempt = draw(st.sampled_from(["A", "B", "C"]))
        step = draw(st.integers(0, 200))
        fields = {"start": {"world_size": 1, "process_start_t": draw(
                      st.none() | st.floats(0, 2e4))},
                  "restore_end": {"step": step, "checkpoint": None},
                  "loop_end": {"step": step, "steps": draw(st.integers(0, step)),
                               "seconds": draw(st.floats(0, 100)),
                               "data_wait_s": draw(st.floats(0, 100)),
                               "checkpoint_wait_s": draw(st.floats(0, 100))},
                  "eval_begin": {"step": step}, "eval_end": {"step": step},
                  "save": {"step": step, "stall_s": draw(st.floats(0, 100))},
                  "commit": {"step": step, "checkpoint": None},
                  "signal": {"signal": "SIGTERM"},
                  "end": {"outcome": "finished", "step": step}}.get(name, {})
        events.append(Event(max(t, 0.0), name, attempt, fields))
    return events


@settings(max_examples=300, deadline=None)
@given(_events(), st.sampled_from([None, "attempt", "starting"]), st.floats(0, 1e5))
def test_whatever_the_events_the_parts_add_up_and_none_is_negative(events, live, now):
    calculator = GoodputCalculator()
    calculator.add_all(events)
    report = checked(calculator.report(now, live=live))
    assert report.steps >= 0 and all(a.lost_steps >= 0 for a in report.attempts)
    if report.goodput is not None:
        assert 0.0 <= report.goodput <= 1.0 + 1e-12


# ---------------------------------------------------------------------------- errors, table


def test_what_is_not_a_run_with_a_timeline_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"does not exist: pass a run directory"):
        run_goodput(tmp_path / "nowhere")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"is not a directory"):
        run_goodput(tmp_path / "file")
    with pytest.raises(ConfigError, match=r"has no timeline \(timeline/run.jsonl\).*a TrainLoop's "
                                          r"checkpoint_dir, a tensorpack trainer's logdir"):
        run_goodput(tmp_path)
    (tmp_path / "timeline").mkdir()
    with pytest.raises(ConfigError, match=r"no run record in it"):
        run_goodput(tmp_path)
    (tmp_path / "timeline" / "run.jsonl").write_text('{"t": 1, "event": "setup_end", '
                                                     '"attempt": "A"}\n')
    with pytest.raises(ConfigError, match=r"holds no attempt: 1 event\(s\) but no 'start'"):
        run_goodput(tmp_path)
    (tmp_path / "timeline" / "run.jsonl").unlink()
    (tmp_path / "timeline" / "run.jsonl").symlink_to(tmp_path / "file")
    with pytest.raises(ConfigError, match=r"cannot be read: .*is a symbolic link"):
        run_goodput(tmp_path)


def test_the_table_names_every_cause_and_each_attempt(script):
    crash_then_restart(script)
    lines = format_report(script.report(), "runs/x")
    text = "\n".join(lines)
    assert lines[0] == "runs/x: 2 attempt(s), 30 steps kept"
    assert "productive" in lines[2] and "44.1 %" in lines[2]
    for cause in BADPUT_CAUSES:
        assert any(line.split()[:1] == [cause] for line in lines), cause
    assert "    lost_progress         20.0 s   29.4 %" in lines
    assert any(line.split()[:5] == ["1", "4", "0..30", "crashed", "20"] for line in lines), text
    assert any(line.split()[:5] == ["2", "4", "10..30", "finished", "0"] for line in lines)


def test_a_report_reads_the_timeline_the_writer_wrote(tmp_path):
    with Timeline(tmp_path) as timeline:
        timeline.start(1)
        timeline.loop_end(10, 10, 0.0)
        timeline.end("finished", 10)
    assert len(read_timeline(tmp_path).run) == 3
    report = checked(run_goodput(tmp_path))
    assert report.attempts[0].end == "finished" and report.steps == 10


def test_goodput_works_with_torch_blocked():
    assert_passes_without_torch(__file__)
