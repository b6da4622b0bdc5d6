"""Goodput of a real run: the ``cadence`` command SIGKILLed, down for a known time, resumed,
SIGTERMed and resumed again -- and ``cadence goodput --json`` says what happened, measured by
this test's own clock: three attempts (crashed, preempted, finished), the down time and the time
of the steps the kill lost within a loop, and parts that add up to the wall time."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

SETTINGS = ["--set", "trainer.train_steps=1200", "--set", "trainer.steps_per_loop=50",
            "--set", "trainer.checkpoint_interval=200", "--set", "trainer.validation_steps=2",
            "--set", "trainer.validation_interval=600"]
DOWN_S = 3.0
"""How long the run stays down after the SIGKILL."""


class Training:
    """The same ``cadence train`` command each time, its output in ``<name>.log``."""

    def __init__(self, cwd, name):
        self.log = cwd / f"{name}.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cadence", "train", "-m", "run", *SETTINGS], cwd=cwd,
                stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "OMP_NUM_THREADS": "1"})

    def output(self):
        return self.log.read_text()[-3000:]

    def wait(self, timeout):
        return self.process.wait(timeout=timeout)


def events(run):
    path = run / "timeline" / "run.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines[:-1]]  # the last one may be half written


def wait_for(predicate, training, timeout=240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert training.process.poll() is None, training.output()
        time.sleep(0.02)
    raise AssertionError("timed out")


def loops_of(run, attempt):
    return [e for e in events(run) if e["event"] == "loop_end" and e["attempt"] == attempt]


@pytest.mark.slow
def test_goodput_of_a_killed_preempted_and_finished_run_says_what_happened(tmp_path):
    run = tmp_path / "run"
    first = Training(tmp_path, "first")
    # Kill it after the checkpoint of step 200 and before the one of step 400: the steps
    # after 200 are lost.
    wait_for(lambda: (run / "checkpoints" / "ckpt-200").is_dir(), first)
    saved_at = time.time()
    attempt = events(run)[0]["attempt"]
    wait_for(lambda: any(e["step"] >= 300 for e in loops_of(run, attempt)), first)
    first.process.send_signal(signal.SIGKILL)
    killed_at = time.time()
    first.wait(timeout=60)
    time.sleep(DOWN_S)

    restarted_at = time.time()
    second = Training(tmp_path, "second")  # the same command resumes (from ckpt-200)
    wait_for(lambda: len([e for e in events(run) if e["event"] == "loop_end"
                          and e["attempt"] != attempt]) >= 2, second)
    second.process.send_signal(signal.SIGTERM)
    assert second.wait(timeout=120) == 143, second.output()

    third_at = time.time()
    third = Training(tmp_path, "third")
    assert third.wait(timeout=240) == 0, third.output()

    result = subprocess.run([sys.executable, "-m", "cadence", "goodput", str(run), "--json"],
                            capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    assert [a["end"] for a in report["attempts"]] == ["crashed", "preempted", "finished"]
    badput = report["badput_s"]
    assert report["productive_s"] + sum(badput.values()) == pytest.approx(report["wall_s"],
                                                                         abs=1e-6)
    assert report["goodput"] == pytest.approx(report["productive_s"] / report["wall_s"])

    # What this test saw: the steps after the save of step 200 ran from that save (the
    # timeline's own instant, not when this test noticed the checkpoint: on a loaded machine
    # the test may notice seconds late) until the kill, less the loop the kill cut short.
    recorded = [e for e in events(run) if e["event"] == "loop_end"]
    loop_s = max(e["seconds"] for e in recorded)
    lost_compute = sum(e["seconds"] - e["data_wait_s"] for e in recorded
                       if e["attempt"] == attempt and e["step"] > 200)
    assert badput["lost_progress"] == pytest.approx(lost_compute, abs=1e-6)
    (saved,) = [e for e in events(run) if e["event"] == "save" and e["step"] == 200]
    assert saved["t"] <= saved_at  # the test noticed the checkpoint after it was saved
    assert badput["lost_progress"] <= killed_at - saved["t"]
    assert badput["lost_progress"] >= killed_at - saved["t"] - 2 * loop_s - 1.0
    assert badput["between_attempts"] >= DOWN_S
    # Down twice, each as long as this test took to start the next process (on a loaded machine
    # more than DOWN_S, and a process that ended takes a while to exit): after the kill, plus
    # the killed attempt's last loop that no event recorded; after the preempted attempt's
    # `end`. And each next process's fork after this test's clock read.
    (ended,) = [e for e in events(run) if e["event"] == "end" and e["outcome"] == "preempted"]
    down = (restarted_at - killed_at + loop_s) + (third_at - ended["t"])
    assert badput["between_attempts"] <= down + 0.5
    assert report["attempts"][0]["lost_steps"] >= 100
    assert report["attempts"][1]["lost_steps"] == 0  # preempted: it saved where it stopped

    # The same figure reached the run's writers at every loop's end.
    records = [json.loads(line) for line in
               (run / "train" / "metrics.jsonl").read_text().splitlines()]
    figures = [r["goodput"] for r in records if "goodput" in r]
    assert figures and all(0.0 < g <= 1.0 for g in figures)
