"""Replica groups that train on when one dies (runtime.fault_tolerance, torchft), with real
processes and real signals on gloo: a torchft lighthouse, one torchrun per replica group, a
whole group SIGKILLed -- its launcher and every worker -- at a random step. The other group's
step keeps rising in the same process; the killed group, started again, joins within the join
timeout, takes the live group's state, and at the end every group's weights are equal, bit for
bit. Then the lighthouse itself is killed: one clear line, and the checkpoint still restores.
"""

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchft")

JOB = Path(__file__).parent / "replica_job.py"
STEP_S = 0.05
"""Each step is paced to this many seconds (a real model's step, not the digits MLP's 1 ms)."""
JOIN_TIMEOUT_S = 5.0
STEPS_PER_LOOP = 20
STARTED = re.compile(r"Restored .* \(step \d+\)|No checkpoint to restore")
"""The line a group's rank 0 logs when it has started and restored, before its first step."""


def executable(name):
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"{name} is not installed next to this Python")
    return found


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid):
    """`pid` and every process below it (torchrun starts its workers in sessions of their own,
    so a process group does not hold them)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def kill_tree(process):
    for pid in descendants(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


class Job:
    """The lighthouse and the replica groups of one fault-tolerant job in `root`."""

    def __init__(self, root, ranks, steps, settings=(), mode="train"):
        self.root, self.ranks, self.mode = root, ranks, mode
        self.run, self.prefix = root / "run", root / "final"
        self.settings = [f"trainer.train_steps={steps}",
                         f"trainer.steps_per_loop={STEPS_PER_LOOP}",
                         "trainer.checkpoint_interval=100", *settings]
        self.address = f"http://localhost:{free_port()}"
        self.processes = []
        self.lighthouse = self.start(
            [executable("torchft_lighthouse"), "--min_replicas", "1", "--quorum_tick_ms", "100",
             "--join_timeout_ms", str(int(JOIN_TIMEOUT_S * 1000)), "--heartbeat_timeout_ms",
             "1000", "--bind", f"[::]:{self.address.rsplit(':', 1)[1]}"], "lighthouse")

    def start(self, command, name, env=None):
        with open(self.root / f"{name}.log", "a") as log:
            process = subprocess.Popen(command, cwd=self.root, stdout=log,
                                       stderr=subprocess.STDOUT, env={
                                           **os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        self.processes.append(process)
        return process

    def group(self, replica, command=None):
        command = command or [str(JOB), str(self.run), str(self.prefix), str(STEP_S),
                              *self.settings]
        return self.start(
            [executable("torchrun"), "--standalone", f"--nproc_per_node={self.ranks}",
             *command], f"group-{replica}",
            env={"REPLICA_GROUP_ID": str(replica), "TORCHFT_LIGHTHOUSE": self.address,
                 "REPLICA_JOB_MODE": self.mode})

    def log(self, name):
        return (self.root / f"{name}.log").read_text()[-4000:]

    def log_count(self, name, pattern):
        """How many lines of a process's log `pattern` finds (its every start appends)."""
        path = self.root / f"{name}.log"
        return len(pattern.findall(path.read_text())) if path.exists() else 0

    def loops(self, replica):
        """The group's loop ends, from its timeline: (attempt, step, wall time)."""
        path = self.run / "timeline" / f"run-replica-{replica}.jsonl"
        lines = path.read_text().splitlines()[:-1] if path.exists() else []
        return [(e["attempt"], e["step"], e["t"]) for e in map(json.loads, lines)
                if e["event"] == "loop_end"]

    def wait_for(self, predicate, timeout=180.0, alive=()):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            for replica, process in alive:
                assert process.poll() is None, self.log(f"group-{replica}")
            time.sleep(0.05)
        raise AssertionError("timed out")

    def close(self):
        for process in self.processes:
            if process.poll() is None:
                kill_tree(process)


@pytest.fixture
def job_in(tmp_path):
    jobs = []

    def make(ranks, steps, settings=(), mode="train"):
        jobs.append(Job(tmp_path, ranks, steps, settings, mode))
        return jobs[-1]

    yield make
    for job in jobs:
        job.close()


def start_while_the_others_wait(job, groups, replica):
    """Starts group `replica` (again) with its same command while the running groups wait at
    their step's end (``replica_job.Pace``'s hold) until it has started and restored -- tens
    of seconds of imports on a loaded machine, in which they could otherwise end the run
    before it joins; returns when it was started. `groups` gets its process."""
    starts = job.log_count(f"group-{replica}", STARTED)
    hold = job.root / "hold"
    hold.touch()
    started_at = time.time()
    groups[replica] = job.group(replica)
    try:
        job.wait_for(lambda: job.log_count(f"group-{replica}", STARTED) > starts,
                     alive=list(groups.items()))
    finally:
        hold.unlink()
    return started_at


def kill_one_group_and_bring_it_back(job, seed):
    rng = random.Random(seed)
    victim, kill_at = rng.choice([0, 1]), rng.randrange(60, 240)
    survivor = 1 - victim
    groups = {0: job.group(0), 1: job.group(1)}
    running = list(groups.items())
    job.wait_for(lambda: bool(job.loops(survivor)) and any(  # both train; the victim's step
        step >= kill_at for _, step, _ in job.loops(victim)), alive=running)
    kill_tree(groups[victim])
    killed_at = time.time()
    attempt, step_at_kill, _ = job.loops(survivor)[-1]
    # The other group trains on, in the same process: its step keeps rising.
    job.wait_for(lambda: job.loops(survivor)[-1][1] >= step_at_kill + 60,
                 alive=[(survivor, groups[survivor])])
    assert {a for a, _, t in job.loops(survivor) if t > killed_at} == {attempt}
    restarted_at = start_while_the_others_wait(job, groups, victim)
    for replica, process in groups.items():
        assert process.wait(timeout=240) == 0, job.log(f"group-{replica}")
    return victim, killed_at, restarted_at


def assert_groups_equal(job):
    for rank in range(job.ranks):
        finals = [torch.load(f"{job.prefix}-g{g}-r{rank}.pt", weights_only=True) for g in (0, 1)]
        assert finals[0]["step"] == finals[1]["step"]
        assert finals[0]["model"].keys() == finals[1]["model"].keys()
        for name, tensor in finals[0]["model"].items():
            assert torch.equal(tensor, finals[1]["model"][name]), (rank, name)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(("ranks", "strategy"), [(1, "none"), (2, "fsdp2")])
def test_a_killed_replica_group_rejoins_and_every_group_ends_with_the_same_weights(
        job_in, ranks, strategy):
    job = job_in(ranks, 600, [f"runtime.strategy={strategy}",
                              "task.train_data.global_batch_size=32"])
    victim, killed_at, restarted_at = kill_one_group_and_bring_it_back(job, seed=ranks)
    # It joined within the join timeout of its start (the first loop it ended in step with
    # the others: its step jumped to theirs, healed from the live group).
    rejoined = [(step, t) for _, step, t in job.loops(victim) if t > restarted_at]
    assert rejoined, job.log(f"group-{victim}")
    assert_groups_equal(job)
    checkpoints = sorted(os.listdir(job.run / "checkpoints"))
    assert checkpoints[-1] == "ckpt-600"  # written by one group, the one the others follow
    assert_on_multiples(checkpoints, 100)
    assert_goodput_of_groups(job, victim, killed_at, ranks)
    # cadence says in one line each that a group left and joined (issue 42), once per group
    survivor = (job.root / f"group-{1 - victim}.log").read_text()
    assert survivor.count("A replica group left: 1 of 2 groups train on") == 1, survivor
    assert survivor.count("A replica group joined: 2 of 2 groups train") == 1, survivor
    assert (job.root / f"group-{victim}.log").read_text().count(
        f"Replica group {victim} joined the others: it took a live group's state.") == 1


def assert_goodput_of_groups(job, victim, killed_at, ranks):
    """The survivor's wait for the groups to agree once the other died (the lighthouse's
    heartbeat: 1 s here) is in its timeline, and goodput counts it as a stall, not productive
    time; each attempt names its group; the job has an ideal step time; each group's other
    ranks' waits are read."""
    from cadence.records.goodput import run_goodput
    from cadence.records.timeline import read_timeline

    survivor = 1 - victim
    timeline = read_timeline(job.run)
    stalled = sum(e["stall_s"] for e in timeline.replicas[survivor]
                  if e.event == "loop_end" and e.t > killed_at)
    assert stalled >= 0.5, stalled
    report = run_goodput(job.run)
    group = next(r for r in report.replicas if r.replica == survivor)
    loops = [e for e in timeline.replicas[survivor] if e.event == "loop_end"]
    seconds = sum(e["seconds"] - e["data_wait_s"] - e["checkpoint_wait_s"] for e in loops)
    assert group.productive_s <= seconds - stalled + 1e-6
    assert {a.replica for a in report.attempts} == {0, 1}
    assert [a.replica for a in report.attempts].count(victim) == 2  # killed, and started again
    assert report.ideal_step_s is not None and report.ideal_goodput is not None
    if ranks > 1:
        assert {(row["replica"], row["rank"]) for row in report.ranks} == {
            (g, r) for g in (0, 1) for r in range(ranks)}


def assert_on_multiples(checkpoints, interval):
    """Every checkpoint is at a multiple of the interval, also after a heal (whose jump may
    pass a multiple in the middle of a loop)."""
    steps = [int(name.split("-")[1]) for name in checkpoints]
    assert steps and all(step % interval == 0 for step in steps), checkpoints


@pytest.mark.slow
@pytest.mark.distributed
def test_replica_groups_train_and_evaluate_export_once_and_cadence_eval_evaluates_the_run(
        job_in):
    """Mode train_and_eval: every group evaluates the whole validation set with the same
    weights; the group that writes the checkpoints writes the evaluations and the best export,
    once each, at the interval's multiples, also across a kill and a heal. Then ``cadence eval
    -m RUN`` of the run evaluates it as one job."""
    job = job_in(1, 600, ["runtime.strategy=none", "trainer.validation_interval=100"],
                 mode="train_and_eval")
    kill_one_group_and_bring_it_back(job, seed=3)
    assert_groups_equal(job)
    assert_on_multiples(os.listdir(job.run / "checkpoints"), 100)
    records = [json.loads(line) for line in
               (job.run / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(100, 601, 100))  # one per evaluation
    ledger = json.loads((job.run / "best" / "info.json").read_text())
    exports = sorted(p.name for p in (job.run / "best").iterdir() if p.name != "info.json")
    assert exports == [e["path"] for e in ledger["exports"]] and len(exports) == 1
    best = max(records, key=lambda r: r["accuracy"])
    assert ledger["exports"][0]["step"] == best["step"]
    evaluated = subprocess.run(
        [sys.executable, "-m", "cadence", "eval", "-m", str(job.run)], cwd=job.root,
        capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "Evaluation: accuracy=" in evaluated.stdout, evaluated.stdout


def kill_one_group_before_the_first_checkpoint(job, seed):
    """Kills one of two groups -- launcher and workers, SIGKILL -- at a random step before the
    run's first checkpoint (there is no ``checkpoints/`` yet, and no ``train.lock``: each group
    has its own), and starts it again with its same command while the other trains on."""
    rng = random.Random(seed)
    victim, kill_at = rng.choice([0, 1]), rng.randrange(20, 80)
    survivor = 1 - victim
    groups = {0: job.group(0), 1: job.group(1)}
    # Both train (the survivor too has ended a loop: a group slower to start trains alone
    # until the other joins) and the victim has reached its step.
    job.wait_for(lambda: bool(job.loops(survivor)) and any(
        step >= kill_at for _, step, _ in job.loops(victim)), alive=list(groups.items()))
    kill_tree(groups[victim])
    assert not (job.run / "checkpoints").exists() or not os.listdir(job.run / "checkpoints")
    _, step_at_kill, _ = job.loops(survivor)[-1]
    job.wait_for(lambda: job.loops(survivor)[-1][1] >= step_at_kill + 20,
                 alive=[(survivor, groups[survivor])])
    restarted_at = start_while_the_others_wait(job, groups, victim)
    for replica, process in groups.items():
        assert process.wait(timeout=240) == 0, job.log(f"group-{replica}")
    return victim, restarted_at


def start_one_group_late(job, seed):
    """Starts one group alone; the other, with the same command, once the first has trained a
    random number of steps (and saved no checkpoint yet)."""
    rng = random.Random(seed)
    first, late_at = rng.choice([0, 1]), rng.randrange(20, 80)
    groups = {first: job.group(first)}
    job.wait_for(lambda: any(step >= late_at for _, step, _ in job.loops(first)),
                 alive=list(groups.items()))
    late = 1 - first
    started_at = start_while_the_others_wait(job, groups, late)
    for replica, process in groups.items():
        assert process.wait(timeout=240) == 0, job.log(f"group-{replica}")
    return late, started_at


def assert_healed(job, replica, since):
    """Group `replica`, started from step 0 at `since` (no checkpoint to restore), healed: its
    first loop ended above the step one loop of its own reaches (it took a live group's step),
    and it ended with the others' weights."""
    loops = [step for _, step, t in job.loops(replica) if t > since]
    assert loops and loops[0] > STEPS_PER_LOOP, (loops, job.log(f"group-{replica}"))
    assert_groups_equal(job)


NO_CHECKPOINT_YET = ["runtime.strategy=none", "trainer.checkpoint_interval=5000"]
"""A job whose first checkpoint is its last (at completion)."""
LONG_ENOUGH = 1000
"""Paced steps of a job in which a group started again is in time to join the other (50 s:
starting Python, torch and torchft takes up to ~20 s on a loaded 2-core machine)."""


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("join", [kill_one_group_before_the_first_checkpoint,
                                  start_one_group_late], ids=["killed early", "started late"])
def test_a_group_dead_before_the_first_checkpoint_or_started_late_joins_with_its_same_command(
        job_in, join):
    """A group killed before the run's first checkpoint, started again, and a group started
    after the other: each joins with its same command and heals."""
    job = job_in(1, LONG_ENOUGH, NO_CHECKPOINT_YET)
    group, since = join(job, seed=7)
    assert_healed(job, group, since)
    assert sorted(os.listdir(job.run / "checkpoints")) == [f"ckpt-{LONG_ENOUGH}"]


def ten_in_a_row(tmp_path, steps, settings, trial_of):
    """Ten jobs one after the other, each put through `trial_of(trial)` (with its job and a
    seed of its own), each ending with every group's weights equal."""
    for trial in range(10):
        (tmp_path / f"trial-{trial}").mkdir()
        job = Job(tmp_path / f"trial-{trial}", 1, steps, settings)
        try:
            trial_of(trial)(job, seed=100 + trial)
            assert_groups_equal(job)
        finally:
            job.close()


@pytest.mark.soak
@pytest.mark.distributed
@pytest.mark.timeout(2400)  # ten jobs of 1000 paced steps, each up to 240 s
def test_ten_early_kills_and_late_starts_in_a_row_each_end_with_equal_weights(tmp_path):
    ten_in_a_row(tmp_path, LONG_ENOUGH, NO_CHECKPOINT_YET, lambda trial: (
        start_one_group_late if trial % 2 else kill_one_group_before_the_first_checkpoint))


@pytest.mark.soak
@pytest.mark.distributed
@pytest.mark.timeout(2400)  # ten jobs of 400 paced steps, each up to 240 s
def test_ten_kills_in_a_row_each_end_with_equal_weights(tmp_path):
    ten_in_a_row(tmp_path, 400, ["runtime.strategy=none"],
                 lambda trial: kill_one_group_and_bring_it_back)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_dead_lighthouse_is_one_line_and_the_checkpoint_still_restores(job_in):
    job = job_in(1, 100000, ["runtime.strategy=none", "runtime.fault_tolerance.quorum_timeout=5",
                             "runtime.fault_tolerance.timeout=5"])
    command = ["-m", "cadence", "train", "-m", str(job.run), "--mode", "train",
               "--set", "runtime.device=cpu", "--set", "runtime.fault_tolerance.enabled=true"]
    for setting in job.settings:
        command += ["--set", setting]
    groups = {0: job.group(0, command), 1: job.group(1, command)}
    job.wait_for(lambda: (job.run / "checkpoints" / "ckpt-100").is_dir(),
                 alive=list(groups.items()))
    job.lighthouse.send_signal(signal.SIGKILL)
    for replica, process in groups.items():
        assert process.wait(timeout=120) != 0
        lines = [line for line in job.log(f"group-{replica}").splitlines()
                 if line.startswith("cadence: error:")]
        assert lines and "the lighthouse at" in lines[-1] and "probably gone" in lines[-1], (
            job.log(f"group-{replica}"))
    # The checkpoints the groups wrote restore without replica groups.
    result = subprocess.run(
        [sys.executable, "-m", "cadence", "train", "-m", str(job.run), "--mode", "train",
         "--set", "runtime.fault_tolerance.enabled=false", "--allow-config-change",
         "--set", "trainer.train_steps=" + str(_newest_step(job.run) + 20)],
        cwd=job.root, capture_output=True, text=True, timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Restored" in result.stderr, result.stderr[-3000:]


def _newest_step(run):
    return max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("ckpt-*"))


def test_an_unreachable_lighthouse_is_one_line_before_anything_trains(tmp_path):
    from cadence.core.errors import ConfigError
    from cadence.engine.fault_tolerance import reach_lighthouse

    with pytest.raises(ConfigError, match=r"^Cannot reach the torchft lighthouse at "
                                          r"http://127\.0\.0\.1:1 .*torchft_lighthouse"):
        reach_lighthouse("http://127.0.0.1:1", timeout=2.0)
    with pytest.raises(ConfigError, match="must be an address such as http://localhost:29510"):
        reach_lighthouse("localhost:29510", timeout=2.0)


def test_replica_group_settings_that_cannot_work_are_one_line_each(monkeypatch):
    """The config's own (its values alone) and those a run sees when it starts (the
    environment's REPLICA_GROUP_ID and TORCHFT_LIGHTHOUSE), before anything is written."""
    from cadence import load_config
    from cadence.core.errors import ConfigError
    from cadence.task.run_checks import replica_options

    def config(*settings):
        return load_config("digits", overrides=["runtime.fault_tolerance.enabled=true",
                                                *settings])

    with pytest.raises(ConfigError, match=r"runtime\.fault_tolerance\.replica_id \(got 2\) must "
                       r"be below runtime\.fault_tolerance\.replica_groups \(got 2\): groups "
                       r"count from 0\."):
        config("runtime.fault_tolerance.replica_id=2").validate()
    with pytest.raises(ConfigError, match=r"min_live_groups \(got 3\) must be at most "
                       r"runtime\.fault_tolerance\.replica_groups \(got 2\)"):
        config("runtime.fault_tolerance.min_live_groups=3").validate()
    monkeypatch.delenv("REPLICA_GROUP_ID", raising=False)
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://localhost:29510")
    # The evaluation modes of such a run evaluate it as one job (issue 42: they were refused,
    # naming the command that had just run).
    assert replica_options(config(), "eval") is None
    assert replica_options(config(), "continuous_eval") is None
    for mode in ("train", "train_and_eval", "train_and_post_eval"):
        with pytest.raises(ConfigError, match=r"replica_id is not set and REPLICA_GROUP_ID is "
                           r"not set: .*--set runtime\.fault_tolerance\.replica_id=0"):
            replica_options(config(), mode)
    monkeypatch.setenv("REPLICA_GROUP_ID", "5")
    with pytest.raises(ConfigError, match=r"^runtime\.fault_tolerance\.replica_id \(got 5\) must "
                       r"be below runtime\.fault_tolerance\.replica_groups \(got 2\): groups "
                       r"count from 0\.$"):
        replica_options(config(), "train")
    monkeypatch.setenv("REPLICA_GROUP_ID", "1")
    assert replica_options(config(), "train").replica_id == 1
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE")
    with pytest.raises(ConfigError, match=r"lighthouse is not set and TORCHFT_LIGHTHOUSE is not "
                       r"set"):
        replica_options(config(), "train")
