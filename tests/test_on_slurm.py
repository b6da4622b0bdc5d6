"""cadence on a real Slurm cluster (`slurm_cluster.LocalSlurm`: one node, its own munge,
controller and node daemon): the templates of ``examples/slurm`` submitted with ``sbatch`` as a
user would, with real signals, requeues and a partition preemption.

Where Slurm is not installed and cannot be (not root, no apt), the tests skip and say why; where
``.ci/run`` installed it (``CADENCE_REQUIRE_SLURM=1``), a cluster that cannot start fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from slurm_cluster import LocalSlurm, install

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parent.parent / "examples" / "slurm"
GPT = ["task.model.n_layer=2", "task.model.n_head=2", "task.model.n_embd=32",
       "task.model.block_size=32", "task.sequence_length=32", "task.max_bytes=60000",
       "task.train_data.global_batch_size=12", "task.validation_data.global_batch_size=12",
       "trainer.validation_steps=2", "trainer.train_steps=8", "trainer.steps_per_loop=2",
       "trainer.checkpoint_interval=4", "runtime.device=cpu"]
"""The gpt experiment shrunk to seconds on a CPU (as tests/test_real_models.py)."""
DIGITS = ["--mode", "train"]
"""The digits experiment as registered (1,000 steps, a checkpoint every 250), training only."""


@pytest.fixture(scope="session")
def slurm():
    """A cluster for this test process (each pytest worker starts its own), stopped at the end:
    exactly the daemons it started."""
    reason = install()
    if reason is not None:
        if os.environ.get("CADENCE_REQUIRE_SLURM") == "1":
            pytest.fail(f"CADENCE_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="cslurm-", dir="/tmp"))  # short: munge's socket
    cluster = LocalSlurm(root)
    # The jobs run the cadence of this environment, one intra-op thread each (2 cores shared).
    cluster.env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{cluster.env['PATH']}",
                       OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


def submit(slurm, template, folder, *args, options=(), env=None):
    """``sbatch OPTIONS examples/slurm/TEMPLATE ARGS`` in `folder`; returns the job id."""
    return slurm.sbatch(f"--chdir={folder}", *options, str(EXAMPLES / template), *args, env=env)


def settings(*pairs):
    return [word for pair in pairs for word in ("--set", pair)]


def output(folder, name, job):
    path = folder / f"{name}-{job}.out"
    return path.read_text(errors="replace") if path.exists() else f"(no {path.name})"


def finished(slurm, job, folder, name, timeout=200.0):
    """Waits for the job to end; asserts it COMPLETED; returns its fields."""
    try:
        fields = slurm.wait_for(job, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", timeout=timeout)
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{output(folder, name, job)[-3000:]}") from None
    assert fields["JobState"] == "COMPLETED", (fields, output(folder, name, job)[-3000:])
    return fields


def events(run, name="run.jsonl"):
    path = run / "timeline" / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_a_loop(slurm, job, run, timeout=120.0):
    """Waits until the run ended its first loop: it is training (mid-run)."""
    deadline = time.monotonic() + timeout
    while not any(e["event"] == "loop_end" for e in events(run)):
        state = slurm.job(job).get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING") and time.monotonic() < deadline, (
            f"job {job} is {state} and has not ended a loop")
        time.sleep(0.05)


def final_state(run, step):
    state = load_file(run / "checkpoints" / f"ckpt-{step}" / "state.cadence")
    return {name: tensor for name, tensor in state.items()
            if name.startswith(("state.model.", "state.optimizer."))}


def assert_same_weights(run, reference, step):
    ours, theirs = final_state(run, step), final_state(reference, step)
    assert ours.keys() == theirs.keys() and ours
    different = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not different, different


def goodput(run):
    """What ``cadence goodput RUN --json`` prints (its report, here without a process)."""
    from cadence.records.goodput import run_goodput

    return run_goodput(run).to_json()


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory):
    """The digits experiment trained to the end by the requeueable template, never
    interrupted: (its run directory, its job id, its fields, its folder)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    job = submit(slurm, "requeue.sbatch", folder, *DIGITS)
    fields = finished(slurm, job, folder, "digits")
    return folder / "runs" / f"digits-{job}", job, fields, folder


def test_an_sbatch_job_trains_the_digits_experiment_to_the_end(uninterrupted):
    run, job, fields, folder = uninterrupted
    assert fields["Restarts"] == "0" and fields["ExitCode"] == "0:0"
    assert (run / "checkpoints" / "ckpt-1000").is_dir()
    record = events(run)
    (start,) = [e for e in record if e["event"] == "start"]
    assert (start["slurm_job"], start["slurm_step"], start["slurm_restart"]) == (job, "batch", 0)
    assert [e["outcome"] for e in record if e["event"] == "end"] == ["finished"]
    assert f"Run directory: runs/digits-{job}" in output(folder, "digits", job)


def test_sigusr1_saves_requeues_and_the_requeued_job_resumes_to_the_same_weights(
        slurm, uninterrupted, tmp_path):
    """What ``--signal=B:USR1@120`` sends before the time limit, sent at once: the run saves
    mid-run, the job requeues itself, the next allocation resumes from the saved step and ends
    with the weights of a run that was never stopped."""
    job = submit(slurm, "requeue.sbatch", tmp_path, *DIGITS)
    run = tmp_path / "runs" / f"digits-{job}"
    wait_for_a_loop(slurm, job, run)
    slurm.run("scancel", "--signal=USR1", "--batch", job)
    slurm.start_now(job, restarts=1)
    fields = finished(slurm, job, tmp_path, "digits")
    assert fields["Restarts"] == "1"
    text = output(tmp_path, "digits", job)
    assert text.count("Received SIGUSR1: stopping after this step and saving a checkpoint.") == 1
    assert f"Requeued Slurm job {job} (step batch)" in text
    assert "The Slurm job is requeued: it resumes from there when it runs again." in text

    record = events(run)
    starts = [e for e in record if e["event"] == "start"]
    assert [(e["slurm_job"], e["slurm_step"], e["slurm_restart"]) for e in starts] == [
        (job, "batch", 0), (job, "batch", 1)]
    assert [e["signal"] for e in record if e["event"] == "signal"] == ["SIGUSR1"]
    assert [e["outcome"] for e in record if e["event"] == "end"] == ["preempted", "finished"]
    (saved,) = [e["step"] for e in record if e["event"] == "restore_end" and e["step"]]
    assert 0 < saved < 1000  # saved mid-run, resumed from there
    assert_same_weights(run, uninterrupted[0], 1000)

    report = goodput(run)
    first, second = report["attempts"]
    assert (first["end"], first["signal"], first["last_step"]) == ("preempted", "SIGUSR1", saved)
    assert (second["end"], second["first_step"], second["slurm_restart"]) == (
        "finished", saved, 1)
    assert second["waited_s"] > 0 and report["badput_s"]["between_attempts"] == pytest.approx(
        second["waited_s"])


def test_a_partition_preemption_saves_and_the_requeued_job_resumes_to_the_same_weights(
        slurm, uninterrupted, tmp_path):
    """A job of a higher-priority partition takes the node: Slurm signals the running job
    (SIGTERM) and requeues it itself; the run saves, and the requeued job resumes."""
    cpus = str(os.cpu_count())
    job = submit(slurm, "requeue.sbatch", tmp_path, *DIGITS, options=[f"--cpus-per-task={cpus}"])
    run = tmp_path / "runs" / f"digits-{job}"
    wait_for_a_loop(slurm, job, run)
    high = slurm.sbatch("-p", "high", f"--cpus-per-task={cpus}", f"--chdir={tmp_path}",
                        "--wrap", "sleep 1")
    slurm.start_now(job, restarts=1)
    fields = finished(slurm, job, tmp_path, "digits")
    assert fields["Restarts"] == "1"
    assert slurm.job(high)["JobState"] == "COMPLETED"
    text = output(tmp_path, "digits", job)
    assert "DUE TO PREEMPTION" in text
    assert "Received SIGTERM: stopping after this step and saving a checkpoint." in text
    assert f"Slurm requeues Slurm job {job} (step batch) itself" in text

    record = events(run)
    assert [e["slurm_restart"] for e in record if e["event"] == "start"] == [0, 1]
    assert [e["outcome"] for e in record if e["event"] == "end"] == ["preempted", "finished"]
    (saved,) = [e["step"] for e in record if e["event"] == "restore_end" and e["step"]]
    assert 0 < saved < 1000
    assert_same_weights(run, uninterrupted[0], 1000)


def two_ranks_trained(run, folder, name, job):
    """The run trained as one job of two ranks: one attempt of world size 2, rank 1's own
    timeline, both ranks' files in every checkpoint, one summary printed."""
    (start,) = [e for e in events(run) if e["event"] == "start"]
    assert (start["world_size"], start["slurm_job"]) == (2, job)
    assert [e["step"] for e in events(run, "rank-1.jsonl")][-1] == 8
    for step in (4, 8):
        assert {"rank-0.cadence", "rank-1.cadence"} <= set(
            os.listdir(run / "checkpoints" / f"ckpt-{step}"))
    assert output(folder, name, job).count("Run directory:") == 1


def test_srun_n_2_cadence_train_trains_as_two_ranks(slurm, tmp_path):
    """``srun -n 2 cadence train`` (the single-node template): each task takes its place from
    Slurm's variables, the two form one job -- not two runs, the second refused by the lock."""
    job = submit(slurm, "single_node.sbatch", tmp_path, "--mode", "train", *settings(*GPT),
                 options=["--ntasks-per-node=2", "--cpus-per-task=1"])
    finished(slurm, job, tmp_path, "gpt")
    run = tmp_path / "runs" / f"gpt-{job}"
    two_ranks_trained(run, tmp_path, "gpt", job)
    (start,) = [e for e in events(run) if e["event"] == "start"]
    assert start["slurm_step"] == "0"  # srun's first step


def test_srun_torchrun_with_two_processes_a_node_trains_as_two_ranks(slurm, tmp_path):
    """``srun torchrun --nproc_per_node=2`` (the multi-node template, on one node): torchrun's
    variables win over Slurm's."""
    job = submit(slurm, "multi_node.sbatch", tmp_path, "--mode", "train", *settings(*GPT),
                 options=["--nodes=1", f"--cpus-per-task={os.cpu_count()}"],
                 env={"NPROC_PER_NODE": "2"})
    finished(slurm, job, tmp_path, "gpt")
    two_ranks_trained(tmp_path / "runs" / f"gpt-{job}", tmp_path, "gpt", job)


def test_replica_groups_of_a_slurm_job_train_together(slurm, tmp_path):
    """The torchft template, two groups of one rank on one node: both train every step."""
    pytest.importorskip("torchft")
    job = submit(slurm, "replica_groups.sbatch", tmp_path, *settings(*GPT),
                 options=["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1"],
                 env={"NPROC_PER_NODE": "1"})
    finished(slurm, job, tmp_path, "gpt-ft")
    run = tmp_path / "runs" / f"gpt-ft-{job}"
    for group in (0, 1):
        record = events(run, f"run-replica-{group}.jsonl")
        assert [e["outcome"] for e in record if e["event"] == "end"] == ["finished"]
        assert [e["step"] for e in record if e["event"] == "loop_end"][-1] == 8
    assert (run / "checkpoints" / "ckpt-8").is_dir()


def test_ranks_under_srun_without_a_shared_directory_are_refused_before_step_1(slurm, tmp_path):
    """The shared-directory check runs under srun too: rank 1 in a mount namespace of its own,
    where the run directory's parent is another folder (two nodes without a shared
    filesystem), and both ranks stop with one line before anything trains."""
    if subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("mount namespaces are not available here (unshare -m)")
    shared, private = tmp_path / "shared", tmp_path / "node-1"
    shared.mkdir()
    private.mkdir()
    train = ["cadence", "train", "-e", "gpt", "--mode", "train", "--model-dir",
             str(shared / "run"), *settings(*GPT)]
    script = tmp_path / "rank.sh"
    script.write_text(
        "#!/bin/bash\n"
        'if [ "$SLURM_PROCID" = 1 ]; then\n'
        f'  exec unshare -m --propagation private sh -c "mount --bind {private} {shared} && '
        'exec \\"\\$0\\" \\"\\$@\\"" "$@"\n'
        "fi\n"
        'exec "$@"\n')
    script.chmod(0o755)
    job = slurm.sbatch(f"--chdir={tmp_path}", "--ntasks=2", "--cpus-per-task=1",
                       "--output=refused-%j.out", "--wrap",
                       f"srun {script} {' '.join(train)}")
    fields = slurm.wait_for(job, "COMPLETED", "FAILED", timeout=200)
    text = output(tmp_path, "refused", job)
    assert fields["JobState"] == "FAILED", text
    errors = [line for line in text.splitlines() if line.startswith("cadence: error:")]
    assert len(errors) == 2, text
    assert all("do not share the checkpoint directory" in line and "rank 1 on" in line
               for line in errors), errors
    assert "Traceback" not in text
    for folder in (shared, private):  # refused before step 1: nothing trained, nothing saved
        assert not list(folder.glob("run/checkpoints/ckpt-*"))
        assert not (folder / "run" / "train" / "metrics.jsonl").exists()


def test_hostlists_expand_as_scontrol_expands_them(slurm):
    from cadence.core.slurm import expand_hostlist

    for hostlist in ("localhost", "node[01-03,07],login", "rack[1-2]-n[8-9]",
                     "a[9-11],b,c[001-002]"):
        shown = slurm.run("scontrol", "show", "hostnames", hostlist).stdout.split()
        assert expand_hostlist(hostlist) == shown, hostlist
