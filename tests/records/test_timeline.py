"""The run timeline (cadence.records.timeline): the writer appends whole lines, crash-safe and
from several threads; the reader takes the directory as untrusted input and never raises for what
the files hold.

These tests import nothing but cadence.core and cadence.records:
`test_the_timeline_works_with_torch_blocked` runs this file again in a
process where importing torch fails.
"""

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from torch_blocker import assert_passes_without_torch

from cadence.core.errors import ConfigError
from cadence.core.run_dir import RunDirectory
from cadence.records import timeline as timeline_module
from cadence.records.timeline import (
    EVENTS,
    Event,
    Timeline,
    attempt_id,
    parse_event,
    process_start_time,
    read_timeline,
    timeline_file,
)


class Clock:
    """A wall clock that moves only when told to."""

    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def lines_of(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_the_writer_appends_one_line_per_event_that_reads_back_as_written(tmp_path):
    clock = Clock()
    with Timeline(tmp_path, clock=clock) as timeline:
        timeline.start(4, restart=2, process_start_t=990.0, host="node-1")
        clock.t = 1003.0
        timeline.setup_end()
        timeline.restore_begin()
        clock.t = 1005.0
        timeline.restore_end(20, tmp_path / "checkpoints" / "ckpt-20")
        clock.t = 1015.0
        timeline.loop_end(30, 10, 9.5, data_wait_s=1.25, checkpoint_wait_s=0.5)
        timeline.eval_begin(30)
        clock.t = 1017.0
        timeline.eval_end(30)
        clock.t = 1018.0
        timeline.save(30, 0.75)
        timeline.commit(30, "ckpt-30")
        timeline.signal("SIGTERM")
        timeline.end("preempted", 30)
    records = lines_of(timeline_file(tmp_path))
    assert [r["event"] for r in records] == [
        "start", "setup_end", "restore_begin", "restore_end", "loop_end", "eval_begin",
        "eval_end", "save", "commit", "signal", "end"]
    assert {r["attempt"] for r in records} == {attempt_id()}
    start = records[0]
    assert start["t"] == 1000.0 and start["world_size"] == 4 and start["restart"] == 2
    assert start["pid"] == os.getpid() and start["host"] == "node-1"
    assert start["process_start_t"] == 990.0 and start["version"] == 1
    assert records[3]["checkpoint"] == "ckpt-20"  # the directory's name, not a path
    assert records[4] == {"t": 1015.0, "event": "loop_end", "attempt": attempt_id(), "step": 30,
                          "steps": 10, "seconds": 9.5, "data_wait_s": 1.25,
                          "checkpoint_wait_s": 0.5}
    assert records[-1]["outcome"] == "preempted" and records[-1]["error"] is None
    read = read_timeline(tmp_path)
    assert [e.event for e in read.run] == [r["event"] for r in records]
    assert read.skipped_lines == 0 and read.refused == () and read.found
    fields = {k: v for k, v in records[4].items() if k not in ("t", "event", "attempt")}
    defaults = {"stall_s": 0.0, "discarded_s": 0.0}  # a loop without replica groups' waits
    assert read.run[4] == Event(1015.0, "loop_end", attempt_id(), {**fields, **defaults})


def test_start_and_end_are_fsynced_and_nothing_else(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    timeline = Timeline(tmp_path, clock=Clock())
    timeline.start(1)
    after_start = len(synced)
    for step in range(1, 6):
        timeline.loop_end(step, 1, 0.1)
    assert len(synced) == after_start >= 1
    timeline.end("finished", 5)
    assert len(synced) == after_start + 1
    timeline.close()


def test_another_ranks_file_holds_only_its_loops_and_every_other_call_does_nothing(tmp_path):
    timeline = Timeline(tmp_path, rank=3, clock=Clock())
    assert not timeline.writes_run_record
    timeline.start(4)
    timeline.restore_end(0, None)
    timeline.loop_end(10, 10, 2.0, data_wait_s=0.5)
    timeline.save(10, 0.1)
    timeline.end("finished", 10)
    timeline.close()
    assert not (tmp_path / "timeline" / "run.jsonl").exists()
    assert [r["event"] for r in lines_of(tmp_path / "timeline" / "rank-3.jsonl")] == ["loop_end"]
    read = read_timeline(tmp_path)
    assert read.run == () and not read.found
    assert [e["data_wait_s"] for e in read.ranks[3]] == [0.5]


def test_a_replica_groups_rank_0_writes_the_groups_record(tmp_path):
    assert timeline_file(tmp_path, 0, replica=2).name == "run-replica-2.jsonl"
    with Timeline(tmp_path, replica=2, clock=Clock()) as timeline:
        timeline.start(2, replicas=3)
    read = read_timeline(tmp_path)
    assert read.found and read.run == ()
    (start,) = read.replicas[2]
    assert start["replica"] == 2 and start["replicas"] == 3


def test_concurrent_appends_from_two_threads_give_whole_lines(tmp_path):
    """Commits come from a background thread while the training thread ends loops."""
    timeline = Timeline(tmp_path)
    timeline.start(1)
    count = 2000

    def loops():
        for step in range(1, count + 1):
            timeline.loop_end(step, 1, 0.001, data_wait_s=0.0001)

    def commits():
        for step in range(1, count + 1):
            timeline.commit(step, f"ckpt-{step}")

    threads = [threading.Thread(target=loops), threading.Thread(target=commits)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    timeline.close()
    text = timeline.path.read_text()
    assert text.endswith("\n")
    records = [json.loads(line) for line in text.splitlines()]  # every line parses
    assert len(records) == 1 + 2 * count
    read = read_timeline(tmp_path)
    assert read.skipped_lines == 0
    assert [e["step"] for e in read.run if e.event == "loop_end"] == list(range(1, count + 1))
    assert [e["step"] for e in read.run if e.event == "commit"] == list(range(1, count + 1))
    times = [e.t for e in read.run]
    assert times == sorted(times)  # the time is taken under the lock: file order is time order


def test_a_torn_last_line_is_skipped_by_the_reader_and_dropped_at_the_next_open(tmp_path, caplog):
    clock = Clock()
    first = Timeline(tmp_path, clock=clock)
    first.start(1)
    first.loop_end(10, 10, 5.0)
    first.close()
    path = timeline_file(tmp_path)
    with open(path, "a") as handle:  # the process died in the middle of this line
        handle.write('{"t": 1010.0, "event": "loop_end", "attempt": "1-x", "step": 2')
    read = read_timeline(tmp_path)
    assert [e.event for e in read.run] == ["start", "loop_end"] and read.skipped_lines == 1
    with caplog.at_level(logging.WARNING, logger="cadence"):
        second = Timeline(tmp_path, clock=clock)
        second.start(1)
        second.close()
    assert "Dropped the last line" in caplog.text
    read = read_timeline(tmp_path)
    assert [e.event for e in read.run] == ["start", "loop_end", "start"]
    assert read.skipped_lines == 0


def test_the_listener_sees_each_event_in_order(tmp_path):
    seen = []
    with Timeline(tmp_path, listener=seen.append, clock=Clock()) as timeline:
        timeline.start(1)
        timeline.loop_end(5, 5, 1.0)
        timeline.end("finished", 5)
    assert [e.event for e in seen] == ["start", "loop_end", "end"]
    assert list(read_timeline(tmp_path).run) == seen


@pytest.mark.parametrize(("call", "match"), [
    (lambda t: t.record("loop_start"), r"`event` \(got 'loop_start'\) must be one of"),
    (lambda t: t.loop_end(10, 10, float("nan")), r"'loop_end'.*must have the fields"),
    (lambda t: t.loop_end(5, 10, 1.0), r"'loop_end'"),  # more steps than the run made
    (lambda t: t.save(10, -1.0), r"'save'"),
    (lambda t: t.start(0), r"'start'"),
    (lambda t: t.end("done", 3), r"'end'"),
    (lambda t: t.record("commit", step=3, bogus=1), r"'commit'"),
])
def test_a_record_that_does_not_fit_the_schema_is_refused_before_anything_is_written(
        tmp_path, call, match):
    timeline = Timeline(tmp_path, clock=Clock())
    with pytest.raises(ValueError, match=match):
        call(timeline)
    assert not (tmp_path / "timeline").exists()


def test_a_bad_rank_or_replica_is_refused():
    with pytest.raises(ValueError, match=r"`rank` \(got -1\)"):
        Timeline("run", rank=-1)
    with pytest.raises(ValueError, match=r"`replica` \(got 1.5\)"):
        Timeline("run", replica=1.5)


def test_a_checkpoint_name_unfit_for_the_record_is_recorded_as_none(tmp_path):
    with Timeline(tmp_path, clock=Clock()) as timeline:
        timeline.start(1)
        timeline.restore_end(7, "/elsewhere/my checkpoint")
    assert lines_of(timeline.path)[-1]["checkpoint"] is None


def test_the_writer_never_writes_through_a_link(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "timeline").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"is a symbolic link"):
        Timeline(run).start(1)
    assert list(elsewhere.iterdir()) == []
    (run / "timeline").unlink()
    (run / "timeline").mkdir()
    target = elsewhere / "precious.txt"
    target.write_text("keep me\n")
    (run / "timeline" / "run.jsonl").symlink_to(target)
    with pytest.raises(ConfigError, match=r"is a symbolic link"):
        Timeline(run).start(1)
    assert target.read_text() == "keep me\n"


def test_a_file_where_the_timeline_directory_must_be_is_one_clear_error(tmp_path):
    (tmp_path / "timeline").write_text("")
    with pytest.raises(ConfigError, match=r"is a file where cadence keeps its timeline"):
        Timeline(tmp_path).start(1)
    assert "timeline" in RunDirectory(tmp_path).layout_problem(training=True)


def test_a_failed_write_is_logged_once_and_never_stops_the_run(tmp_path, caplog):
    timeline = Timeline(tmp_path, clock=Clock())
    timeline.start(1)

    class FullDisk:
        def write(self, text):
            raise OSError(28, "No space left on device")

        def close(self):
            pass

    timeline.close()
    timeline._handle = FullDisk()  # the next write fails
    with caplog.at_level(logging.WARNING, logger="cadence"):
        for step in range(1, 4):
            timeline.loop_end(step, 1, 0.5)  # no exception
    assert caplog.text.count("Could not write the run's timeline") == 1
    assert [e.event for e in read_timeline(tmp_path).run] == ["start"]


# ---------------------------------------------------------------------------- the reader


GOOD = {"t": 1000.0, "event": "start", "attempt": "9-a", "world_size": 2}
LOOP = {"t": 1010.0, "event": "loop_end", "attempt": "9-a", "step": 10, "steps": 10,
        "seconds": 9.0, "data_wait_s": 0.5, "checkpoint_wait_s": 0.0}
HOSTILE_LINES = [
    "not json at all",
    "[1, 2, 3]",
    '"a string"',
    "null",
    json.dumps({**LOOP, "t": "1010"}),  # a time as text
    json.dumps({**LOOP, "t": -5.0}),  # a negative time
    json.dumps({**LOOP, "t": 1e300}),  # not a wall-clock time
    '{"t": NaN, "event": "loop_end", "attempt": "9-a", "step": 1, "steps": 1, "seconds": 1}',
    json.dumps(LOOP).replace('"seconds": 9.0', '"seconds": Infinity'),
    json.dumps({**LOOP, "seconds": -1.0}),  # a negative duration
    json.dumps({**LOOP, "data_wait_s": -0.5}),
    json.dumps({**LOOP, "step": True}),  # a bool is not a step
    json.dumps({**LOOP, "step": 10**30}),  # a step beyond any run
    json.dumps({**LOOP, "step": 2.5}),
    json.dumps({**LOOP, "steps": 11}),  # more steps in the loop than the run made
    json.dumps({k: v for k, v in LOOP.items() if k != "seconds"}),  # a field missing
    json.dumps({**LOOP, "event": "loop_begin"}),  # an unknown event
    json.dumps({**LOOP, "event": ["loop_end"]}),  # an unhashable event
    json.dumps({**LOOP, "attempt": 7}),
    json.dumps({**LOOP, "attempt": ""}),
    json.dumps({**GOOD, "world_size": 0}),
    json.dumps({**GOOD, "process_start_t": "yesterday"}),
    json.dumps({"t": 1.0, "event": "restore_end", "attempt": "9-a", "step": 3,
                "checkpoint": "../../etc"}),  # a checkpoint named outside the run
    json.dumps({"t": 1.0, "event": "end", "attempt": "9-a", "outcome": "exploded"}),
    json.dumps({"t": 1.0, "event": "signal", "attempt": "9-a", "signal": "kill -9; rm"}),
    "1" * 5000,  # an integer too long for Python to parse
    "[" * 100_000 + "]" * 100_000,  # nested past the recursion limit
    '{"t": 1.0, "event": "save", "attempt": "9-a", "step": 1, "stall_s": 0.5, "x": "'
    + "y" * 70_000 + '"}',  # a line over the bound
]


def test_hostile_lines_are_skipped_and_counted_and_the_good_ones_kept(tmp_path):
    directory = tmp_path / "timeline"
    directory.mkdir()
    lines = [json.dumps(GOOD), *HOSTILE_LINES, json.dumps(LOOP)]
    (directory / "run.jsonl").write_bytes(
        "\n".join(lines).encode() + b"\n\xff\xfe not utf-8\n\n")
    read = read_timeline(tmp_path)  # no exception
    assert [e.event for e in read.run] == ["start", "loop_end"]
    assert read.skipped_lines == len(HOSTILE_LINES) + 1  # the bytes that are not UTF-8 too
    assert read.run[1]["seconds"] == 9.0


def test_extra_fields_of_a_newer_cadence_are_ignored_and_defaults_filled_in():
    event = parse_event({**LOOP, "tokens": 4096})
    assert event is not None and "tokens" not in event.fields
    start = parse_event(GOOD)
    assert start.fields == {"world_size": 2, "restart": 0, "host": None, "pid": None,
                            "process_start_t": None, "replica": None, "replicas": None,
                            "slurm_job": None, "slurm_step": None, "slurm_restart": None,
                            "version": 1}
    assert set(EVENTS) == {"start", "setup_end", "restore_begin", "restore_end", "loop_end",
                           "eval_begin", "eval_end", "save", "commit", "signal", "end"}


def test_a_huge_timeline_file_is_refused_without_being_read(tmp_path):
    directory = tmp_path / "timeline"
    directory.mkdir()
    with open(directory / "run.jsonl", "wb") as handle:  # sparse: costs no disk
        handle.truncate(timeline_module.MAX_FILE_BYTES + 1)
    read = read_timeline(tmp_path)
    assert read.run == () and not read.found
    (why,) = read.refused
    assert f"is {timeline_module.MAX_FILE_BYTES + 1} bytes, more than the" in why


def test_a_linked_timeline_or_file_is_refused_and_never_read(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "run.jsonl").write_text(json.dumps(GOOD) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "timeline").symlink_to(elsewhere)
    read = read_timeline(run)
    assert not read.found and "is a symbolic link" in read.refused[0]
    (run / "timeline").unlink()
    (run / "timeline").mkdir()
    (run / "timeline" / "run.jsonl").symlink_to(elsewhere / "run.jsonl")
    (run / "timeline" / "rank-1.jsonl").symlink_to(elsewhere / "run.jsonl")
    read = read_timeline(run)
    assert not read.found and read.ranks == {}
    assert len(read.refused) == 2 and all("symbolic link" in why for why in read.refused)


def test_a_fifo_or_a_directory_named_like_a_timeline_file_is_refused_without_waiting(tmp_path):
    directory = tmp_path / "timeline"
    directory.mkdir()
    os.mkfifo(directory / "run.jsonl")  # opening it to read would wait for a writer
    (directory / "rank-1.jsonl").mkdir()
    read = read_timeline(tmp_path)
    assert not read.found and len(read.refused) == 2


def test_only_the_timeline_file_names_are_read(tmp_path):
    directory = tmp_path / "timeline"
    directory.mkdir()
    loop = json.dumps(LOOP) + "\n"
    for name in ("notes.jsonl", "rank-0.jsonl", "rank-01.jsonl", "run-replica-x.jsonl",
                 "rank-2.jsonl.bak"):
        (directory / name).write_text(loop)
    (directory / "rank-2.jsonl").write_text(json.dumps(GOOD) + "\n" + loop)
    read = read_timeline(tmp_path)
    assert list(read.ranks) == [2] and [e.event for e in read.ranks[2]] == ["loop_end"]
    assert read.skipped_lines == 0 and not read.found


def test_no_timeline_directory_is_an_empty_timeline(tmp_path):
    read = read_timeline(tmp_path)
    assert not read.found and read.refused == () and read.skipped_lines == 0


def test_the_process_start_time_and_the_attempt_id():
    import time

    started = process_start_time()
    assert started is None or 0 < started <= time.time() + 1
    assert attempt_id() == attempt_id() and attempt_id().startswith(f"{os.getpid()}-")
    code = "from cadence.records.timeline import attempt_id; print(attempt_id())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert other != attempt_id()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_a_process_start_time_is_when_the_process_was_started_to_the_kernels_tick():
    """Between the parent's clock just before and just after it started the child, give or take
    a tick (10 ms): not up to a second early, as ``btime``'s whole seconds made it (the time
    between two attempts then read short)."""
    import time

    code = "from cadence.records.timeline import process_start_time; print(process_start_time())"
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    after = time.time()
    out, _ = child.communicate(timeout=60)
    started = float(out)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert before - tick - 0.005 <= started <= after + 0.005, (before, started, after)


def test_the_timeline_works_with_torch_blocked():
    assert_passes_without_torch(__file__)
