"""``cadence goodput RUN [--json]``: where a run's time went, read from its timeline; what is not
a run with a timeline is one clear line and exit status 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cadence.task.cli import main

ROOT = Path(__file__).parents[2]
KEYS = {"wall_s", "productive_s", "goodput", "badput_s", "attempts", "skipped_lines"}
CAUSES = {"startup", "restore", "checkpoint", "evaluation", "data_wait", "lost_progress",
          "between_attempts", "other"}


def write_timeline(run, records):
    (run / "timeline").mkdir(parents=True)
    (run / "timeline" / "run.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in records))


def event(t, name, attempt, **fields):
    return {"t": float(t), "event": name, "attempt": attempt, **fields}


def loop(t, attempt, step, steps=10, seconds=10.0):
    return event(t, "loop_end", attempt, step=step, steps=steps, seconds=seconds,
                 data_wait_s=0.0, checkpoint_wait_s=0.0)


def killed_down_resumed_stopped_resumed():
    """The run of issue 28's "done when": SIGKILLed at step 30 (newest checkpoint 20), down 60 s,
    resumed; SIGTERMed at step 50 (saved), down 30 s, resumed to the end at step 60."""
    return [
        event(1000, "start", "A", world_size=2, pid=10, host="h"),
        event(1002, "setup_end", "A"),
        event(1002, "restore_begin", "A"), event(1002.5, "restore_end", "A", step=0,
                                                 checkpoint=None),
        loop(1012.5, "A", 10), loop(1022.5, "A", 20),
        event(1023.5, "save", "A", step=20, stall_s=1.0),
        event(1024, "commit", "A", step=20, checkpoint="ckpt-20"),
        loop(1033.5, "A", 30),  # SIGKILL at 1034: no end
        event(1094, "start", "B", world_size=2, pid=11, host="h"),
        event(1096, "restore_begin", "B"), event(1097, "restore_end", "B", step=20,
                                                 checkpoint="ckpt-20"),
        loop(1107, "B", 30), loop(1117, "B", 40), loop(1127, "B", 50),
        event(1127.5, "signal", "B", signal="SIGTERM"),
        event(1128.5, "save", "B", step=50, stall_s=1.0),
        event(1128.5, "commit", "B", step=50, checkpoint="ckpt-50"),
        event(1128.5, "end", "B", outcome="preempted", step=50, error=None),
        event(1158.5, "start", "C", world_size=2, pid=12, host="h"),
        event(1159.5, "restore_end", "C", step=50, checkpoint="ckpt-50"),
        loop(1169.5, "C", 60),
        event(1170.5, "save", "C", step=60, stall_s=1.0),
        event(1170.5, "end", "C", outcome="finished", step=60, error=None),
    ]


def test_json_is_one_object_with_three_attempts_the_down_time_and_the_lost_steps(
        tmp_path, capsys):
    run = tmp_path / "run"
    write_timeline(run, killed_down_resumed_stopped_resumed())
    assert main(["goodput", str(run), "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)  # exactly one JSON object: anything else would not parse
    assert out.count("\n") == 1 and set(report) >= KEYS and set(report["badput_s"]) >= CAUSES
    assert [a["end"] for a in report["attempts"]] == ["crashed", "preempted", "finished"]
    assert [a["lost_steps"] for a in report["attempts"]] == [10, 0, 0]
    badput = report["badput_s"]
    assert badput["between_attempts"] == 60.5 + 30.0  # down after the kill, and after the stop
    assert badput["lost_progress"] == 10.0  # the loop after the newest checkpoint
    assert report["productive_s"] == 60.0 and report["wall_s"] == 170.5
    parts = report["productive_s"] + sum(badput.values())
    assert parts == pytest.approx(report["wall_s"], abs=1e-9)
    assert report["goodput"] == pytest.approx(60.0 / 170.5)


def test_the_table_shows_the_causes_and_one_line_per_attempt(tmp_path, capsys):
    run = tmp_path / "run"
    write_timeline(run, killed_down_resumed_stopped_resumed())
    assert main(["goodput", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{run}: 3 attempt(s), 60 steps kept"
    assert lines[1].split()[:4] == ["wall", "time", "170.5", "s"]
    assert lines[2].split() == ["productive", "60.0", "s", "35.2", "%", "goodput"]
    assert "    between_attempts      90.5 s   53.1 %" in lines
    attempts = [line.split() for line in lines if line.split()[:1] in (["1"], ["2"], ["3"])]
    assert [a[1:5] for a in attempts] == [["2", "0..30", "crashed", "10"],
                                          ["2", "20..50", "preempted", "(SIGTERM)"],
                                          ["2", "50..60", "finished", "0"]]


@pytest.mark.parametrize(("make", "says"), [
    (lambda tmp: tmp / "nowhere", r"'.*nowhere' does not exist: pass a run directory"),
    (lambda tmp: (tmp / "f").write_text("x") and tmp / "f", r"'.*f' is not a directory"),
    (lambda tmp: tmp, r"has no timeline \(timeline/run.jsonl\): it is not the directory of a "
                      r"run that recorded one\. Every front-end records it in the run's "
                      r"directory.*Controller\(record=cadence\.RunRecord\(RUN\)\)"),
])
def test_what_is_not_a_run_with_a_timeline_is_one_clear_line(tmp_path, capsys, make, says):
    import re

    assert main(["goodput", str(make(tmp_path))]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1 and err[0].startswith("cadence: error: ")
    assert re.search(says, err[0]), err[0]


def test_a_damaged_timeline_is_counted_never_a_traceback(tmp_path, capsys):
    run = tmp_path / "run"
    write_timeline(run, killed_down_resumed_stopped_resumed())
    with open(run / "timeline" / "run.jsonl", "a") as handle:
        handle.write('not json\n{"t": NaN, "event": "save"}\n{"t": -1, "event": "end", "att')
    assert main(["goodput", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped_lines"] == 3


def test_goodput_is_a_command_of_the_cli_that_needs_no_torch(tmp_path):
    run = tmp_path / "run"
    write_timeline(run, killed_down_resumed_stopped_resumed())
    code = ("import sys\n" + (ROOT / "tests/torch_blocker.py").read_text()
            + "\nexec(BLOCK_TORCH)\nfrom cadence.task.cli import main\n"
            f"code = main(['goodput', {str(run)!r}])\n"
            "assert 'torch' not in sys.modules\nsys.exit(code)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "3 attempt(s)" in out.stdout
