"""Two processes under torchrun on gloo: all ranks take part in checkpoints, each restores its
own RNG state, and only rank 0 writes summaries."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

JOB = Path(__file__).parent / "distributed_job.py"
EXPERIMENT_JOB = Path(__file__).parent / "experiment_job.py"


def torchrun(*args, job=JOB):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python")
    ran = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", str(job), *args],
                         capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, failed_job(ran)


def failed_job(ran: subprocess.CompletedProcess) -> str:
    """What a failed torchrun job printed: the ranks' tracebacks are in its last lines."""
    return f"exit {ran.returncode}\n{ran.stdout[-2000:]}\n{ran.stderr[-8000:]}"


@pytest.mark.slow
@pytest.mark.distributed
def test_checkpoints_across_two_ranks(tmp_path):
    torchrun("train", str(tmp_path))
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-3", "ckpt-6"]
    assert {p.name for p in (ckpt / "ckpt-6").iterdir()} == {
        "manifest.json", "state.cadence", "rank-0.cadence", "rank-1.cadence"}
    lines = (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()
    steps = [int(line.split(",")[0].split(":")[1]) for line in lines]
    assert steps == [2, 3, 5, 6]  # loops cut at the checkpoint boundary; written by rank 0 only

    torchrun("restore", str(tmp_path))
    for rank in (0, 1):
        trained = torch.load(tmp_path / f"train-{rank}.pt", weights_only=True)
        restored = torch.load(tmp_path / f"restore-{rank}.pt", weights_only=True)
        assert restored["step"] == 6
        assert torch.equal(trained["draw"], restored["draw"])  # each rank's own RNG stream
    zero = torch.load(tmp_path / "restore-0.pt", weights_only=True)["draw"]
    one = torch.load(tmp_path / "restore-1.pt", weights_only=True)["draw"]
    assert not torch.equal(zero, one)


@pytest.mark.slow
@pytest.mark.distributed
def test_run_experiment_trains_data_parallel_across_two_ranks(tmp_path):
    torchrun(str(tmp_path), job=EXPERIMENT_JOB)
    zero = torch.load(tmp_path / "weights-0.pt", weights_only=True)
    one = torch.load(tmp_path / "weights-1.pt", weights_only=True)
    for key, value in zero.items():  # gradients were averaged: the replicas never diverged
        assert torch.equal(value, one[key]), key
    assert not any(key.startswith("module.") for key in zero)  # the plain model is saved
    logs = [json.loads((tmp_path / f"logs-{rank}.json").read_text()) for rank in (0, 1)]
    assert logs[0]["accuracy"] == logs[1]["accuracy"]  # metrics cover both shards
    # ...each example exactly once (no padding duplicates): the full-set accuracy
    assert abs(logs[0]["accuracy"] - logs[0]["single_process_accuracy"]) < 1e-6
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt-20", "ckpt-40"]
    files = {p.name for p in (run / "checkpoints" / "ckpt-40").iterdir()}
    assert files >= {"rank-0.cadence", "rank-1.cadence"}
    assert (run / "params.yaml").is_file() and (run / "best" / "info.json").is_file()


# ---------------------------------------------------------------------------- issue 12: a torchrun
# trainer whose ranks agree (tests/distributed_resume_job.py)

RESUME_JOB = Path(__file__).parent / "distributed_resume_job.py"


def launch(directory, *args, nproc=2, check=True, timeout=240, examples=48, drop_last=False,
           loader="map"):
    runner = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if runner is None:
        pytest.skip("torchrun is not installed next to this Python")
    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CADENCE_TEST_EXAMPLES": str(examples),
           "CADENCE_TEST_DROP_LAST": "1" if drop_last else "0", "CADENCE_TEST_LOADER": loader}
    ran = subprocess.run([runner, "--standalone", f"--nproc_per_node={nproc}", str(RESUME_JOB),
                          args[0], str(directory), *args[1:]],
                         capture_output=True, text=True, timeout=timeout, env=env)
    if check:
        assert ran.returncode == 0, failed_job(ran)
    return ran


def records(directory, mode, ranks=2):
    return [json.loads((directory / f"{mode}-{rank}.json").read_text()) for rank in range(ranks)]


SHARED_MODES = ("nodigests", "tensorpack", "trainloop", "late", "trainloop-late", "ddpasync",
                "dcpasync")
"""Independent 2-rank modes run by one launch (``job.py modes``), each in its own folder: a
torchrun job takes seconds to start on 2 cores, most of these modes about a second (a mode
that fails fails every test of this launch, each with the job's output)."""


@pytest.fixture(scope="module")
def shared_job(tmp_path_factory):
    """The folder of `SHARED_MODES`' launch; ``shared_job / mode`` holds what that mode wrote."""
    directory = tmp_path_factory.mktemp("modes")
    launch(directory, "modes", *SHARED_MODES)
    return directory


@pytest.mark.slow
@pytest.mark.distributed
def test_a_sigterm_to_one_rank_mid_pass_stops_every_rank_and_resumes_bitwise(tmp_path):
    launch(tmp_path / "straight", "train", "16")
    launch(tmp_path / "resumed", "train", "16", "1:8")  # only rank 1 gets the SIGTERM...
    first = records(tmp_path / "resumed", "train")
    assert [r["code"] for r in first] == [143, 143]  # ...every rank saves and is Preempted
    assert first[0]["step"] == first[1]["step"] < 16  # stopped together, mid-pass
    saved = sorted(p.name for p in (tmp_path / "resumed" / "ckpt").iterdir())
    assert f"ckpt-{first[0]['step']}" in saved
    launch(tmp_path / "resumed", "train", "16")
    for rank in (0, 1):
        straight = torch.load(tmp_path / "straight" / f"weights-{rank}.pt", weights_only=True)
        resumed = torch.load(tmp_path / "resumed" / f"weights-{rank}.pt", weights_only=True)
        for key in straight:
            assert torch.equal(straight[key], resumed[key]), key
    # each rank saw its own shard's batches once each, before and after the resume
    again = records(tmp_path / "resumed", "train")
    straight_seen = records(tmp_path / "straight", "train")
    for rank in (0, 1):
        assert first[rank]["seen"] + again[rank]["seen"] == straight_seen[rank]["seen"]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_sigterm_handled_as_the_ranks_agree_to_go_on_waits_for_the_next_agreement(shared_job):
    """SIGTERM reaches rank 1 while it waits for rank 0 in the agreement after a loop; its
    handler runs the moment the collective returns "no rank asked to stop". Rank 1 must not stop
    alone -- rank 0 trains on, and the two would pair unrelated collectives -- so both take the
    next loop, agree on the stop at its end, and save the same step."""
    tmp_path = shared_job / "late"
    late = records(tmp_path, "late")
    assert [r["code"] for r in late] == [143, 143]
    assert late[0]["step"] == late[1]["step"] == 5  # the next loop ends at the interval (5)
    assert (tmp_path / "ckpt" / "ckpt-5").is_dir()


@pytest.mark.slow
@pytest.mark.distributed
def test_a_trainloop_rank_signalled_as_the_ranks_agree_to_go_on_stops_with_the_others(
        shared_job):
    """The same race in a TrainLoop, at the agreement after an epoch's end callbacks: the ranks
    go on together into the next epoch, stop together at its first agreement (the end of its
    6 steps), and both save."""
    tmp_path = shared_job / "trainloop-late"
    late = records(tmp_path, "trainloop-late")
    assert [r["code"] for r in late] == [143, 143]
    assert late[0]["step"] == late[1]["step"] == 12


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(900)  # its job may take 600 s
def test_twenty_sigterms_at_different_steps_on_each_rank_all_save_the_same_step(tmp_path):
    launch(tmp_path, "trials", "20", timeout=600)
    zero, one = (r["results"] for r in records(tmp_path, "trials"))
    assert len(zero) == len(one) == 20
    for a, b in zip(zero, one):
        assert a["preempted"] is not None and a["preempted"] == b["preempted"], (a, b)
        assert a["step"] == b["step"] and a["code"] == b["code"] == 143
        files = {p.name for p in Path(a["preempted"]).iterdir()}
        assert {"rank-0.cadence", "rank-1.cadence", "state.cadence", "manifest.json"} <= files


def restart_trials(tmp_path, trials):
    """`trials` jobs of 2 ranks under ``torchrun --max-restarts=1``, rank 1 SIGKILLed at step 12
    of 30 in the first round: how many restarted, resumed from the newest checkpoint (ckpt-10)
    and finished, and what the others printed."""
    runner = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if runner is None:
        pytest.skip("torchrun is not installed next to this Python")
    finished, failures = 0, []
    for trial in range(trials):
        directory = tmp_path / f"trial-{trial}"
        directory.mkdir()
        ran = subprocess.run([runner, "--standalone", "--nproc_per_node=2", "--max-restarts=1",
                              str(RESUME_JOB), "elastic", str(directory)],
                             capture_output=True, text=True, timeout=120)
        done = [directory / f"elastic-{rank}.json" for rank in (0, 1)]
        if ran.returncode == 0 and all(path.exists() for path in done):
            results = [json.loads(path.read_text()) for path in done]
            assert all(r["step"] == 30 and r["restart"] == 1 for r in results), results
            finished += 1
        else:
            failures.append(failed_job(ran))
    return finished, failures


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(900)  # five jobs of up to 120 s each
def test_an_elastic_restart_after_a_sigkill_resumes_and_finishes(tmp_path):
    """``torchrun --max-restarts=1``: a rank SIGKILLed mid-run, the job restarted in place,
    every rank resumes from the newest checkpoint and finishes. Before, 1 trial in 5 did: the
    restarted ranks read the dead ones' gloo addresses from the store of the round before
    (connectFullMesh ... Connection refused) or waited for them; each round's keys now have a
    prefix of their own (`cadence.engine.distributed._round_store`)."""
    finished, failures = restart_trials(tmp_path, 5)
    assert finished == 5, failures[0]


@pytest.mark.soak
@pytest.mark.distributed
@pytest.mark.timeout(3000)  # twenty jobs of up to 120 s each
def test_twenty_elastic_restarts_on_a_loaded_machine_all_finish(tmp_path):
    finished, failures = restart_trials(tmp_path, 20)
    assert finished == 20, (len(failures), failures[0] if failures else "")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("elastic", [True, False], ids=["under torchrun", "env:// by hand"])
def test_a_rank_that_never_comes_ends_the_setup_in_one_line_within_the_bound(tmp_path,
                                                                             elastic):
    """Rank 0 of 2 waits for a rank 1 that never starts: the setup (rendezvous and connect)
    is bounded by runtime.collective_timeout and ends in one line, exit 1 -- before, only
    collectives had a bound, and a restarted job waited in init_process_group for good."""
    import socket
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    if elastic:
        env["TORCHELASTIC_RESTART_COUNT"] = "0"
    started = time.monotonic()
    ran = subprocess.run([sys.executable, "-m", "cadence", "train", "--no-progress", "-m",
                          str(tmp_path / "run"), "--set", "runtime.collective_timeout=4"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    elapsed = time.monotonic() - started
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    assert lines[-1].startswith("cadence: error: Rank 0 of 2 could not join the job's process "
                                "group within 4 s (runtime.collective_timeout) through "
                                f"127.0.0.1:{port}:"), lines[-1]
    assert elapsed < 60
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts sockets in /proc")
def test_cadences_gloo_groups_connect_on_first_use_not_as_a_full_mesh(tmp_path):
    """The control group beside NCCL and DCP's background group are gloo groups of all ranks:
    as a full mesh, 523,776 TCP connections at 1,024 ranks. Made with lazy connections, a rank
    opens about one socket at creation and meets its ring neighbours at the first all-reduce;
    as a full mesh each of 4 ranks opened 4 at creation."""
    launch(tmp_path, "lazygroup", nproc=4)
    for record in records(tmp_path, "lazygroup", ranks=4):
        assert record["sum"] == 4.0  # the group works
        assert record["created"] <= 2 and record["after_all_reduce"] <= 3, record


@pytest.mark.slow
@pytest.mark.distributed
def test_a_stuck_rank_ends_the_job_within_the_collective_timeout(tmp_path):
    import time

    start = time.monotonic()
    result = launch(tmp_path, "stuck", check=False, timeout=180)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert "Another rank is probably dead or stuck" in result.stdout + result.stderr
    assert elapsed < 120  # 5 s of collective timeout, then torchrun ends the stopped rank


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(("before", "after", "stop_at"),
                         [(2, 1, 2), (1, 2, 3), (4, 8, 1), (8, 4, 1)])
def test_a_resume_at_another_world_size_covers_the_rest_of_the_pass_once(
        tmp_path, before, after, stop_at):
    launch(tmp_path, "train", str(stop_at), nproc=before)  # mid-pass: 6 or 12 batches a pass
    first = records(tmp_path, "train", before)
    launch(tmp_path, "epoch", nproc=after)
    rest = records(tmp_path, "epoch", after)
    seen = [i for r in first for i in r["seen"]] + [i for r in rest for i in r["seen"]]
    assert sorted(seen) == list(range(48))  # every example of the pass exactly once
    assert len({r["step"] for r in rest}) == 1  # the new ranks took equal numbers of steps


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(900)  # three jobs of up to 240 s each
@pytest.mark.parametrize("drop_last", [False, True], ids=["partial batches kept", "dropped"])
def test_a_pass_resumed_at_2_then_3_then_2_ranks_keeps_every_rank_in_step(tmp_path, drop_last):
    """50 examples, batches of 4: 2 ranks stop mid-pass, 3 ranks take the rest of it for two
    steps, 2 ranks finish it. Each time the ranks take equal numbers of steps and end the pass
    together (before: a rank took fewer batches and skipped examples, and the next resume was
    refused as a disagreement, then rolled back); nothing trained on is trained on again, and
    only the rule's padding repeats and (with drop_last) its last partial batches skip."""
    phases = [(2, "train", "3"), (3, "train", "5"), (2, "epoch")]
    seen, steps = [], []
    for nproc, *args in phases:
        launch(tmp_path, *args, nproc=nproc, examples=50, drop_last=drop_last)
        done = records(tmp_path, args[0], nproc)
        steps.append({r["step"] for r in done})
        seen += [i for r in done for i in r["seen"]]
    assert steps[:2] == [{3}, {5}] and len(steps[2]) == 1  # every rank in step, every phase
    repeats = len(seen) - len(set(seen))
    assert repeats <= 1 + 2  # dealing 26 over 3 ranks pads 1; what is left over 2, at most 1
    assert set(seen) <= set(range(50))
    missing = set(range(50)) - set(seen)
    assert len(missing) <= (3 * 3 + 2 * 3 if drop_last else 0), missing


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(900)  # three jobs of up to 240 s each
def test_a_resume_that_cannot_be_dealt_stops_and_leaves_the_checkpoint_as_it_was(tmp_path):
    """A loader that keeps its own state (torchdata's) cannot be dealt to another number of
    ranks. The newest checkpoint was written by 2 ranks, an older one by 3 (the job ran at 3,
    then at 2); resumed at 3, the job stops with one line naming both world sizes and leaves
    the newest checkpoint where and as it was. Before, the refusal counted as damage: the
    newest was renamed ckpt-7.damaged-<time> and the older one resumed -- a silent rollback."""
    run, other = tmp_path / "run", tmp_path / "other"
    launch(run, "train", "5", nproc=3, loader="stateful")  # ckpt-5, by 3 ranks
    launch(other, "train", "7", nproc=2, loader="stateful")  # ckpt-5, ckpt-7 by 2 ranks
    shutil.copytree(other / "ckpt" / "ckpt-7", run / "ckpt" / "ckpt-7")
    before = sorted(p.name for p in (run / "ckpt").iterdir())
    assert before == ["ckpt-5", "ckpt-7"]
    refused = launch(run, "epoch", nproc=3, check=False, loader="stateful")
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert "saved by 2 processes and this job has 3" in output, failed_job(refused)
    assert "Resume with 2 processes" in output
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == before  # nothing set aside
    assert not (run / "epoch-0.json").exists()  # and nothing trained from ckpt-5


@pytest.mark.slow
@pytest.mark.distributed
def test_two_nodes_given_different_run_directories_fail_clearly(tmp_path):
    import socket

    runner = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if runner is None:
        pytest.skip("torchrun is not installed next to this Python")
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    nodes = [subprocess.Popen(
        [runner, "--nnodes=2", "--nproc_per_node=1", f"--node_rank={node}",
         "--rdzv_backend=c10d", f"--rdzv_endpoint=localhost:{port}", "--rdzv_id=cadence-test",
         str(RESUME_JOB), "rundir", str(tmp_path / f"machine-{node}")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert all(node.returncode != 0 for node in nodes)
    assert all("were given different run directories" in output for output in outputs)


@pytest.mark.slow
@pytest.mark.distributed
def test_tensorpack_simple_trainer_is_data_parallel_under_torchrun(shared_job):
    tmp_path = shared_job / "tensorpack"
    zero, one = (torch.load(tmp_path / f"tensorpack-{r}.pt", weights_only=True) for r in (0, 1))
    for key in zero:  # rank 0's start and averaged gradients: the replicas never diverge
        assert torch.equal(zero[key], one[key]), key


@pytest.mark.slow
@pytest.mark.distributed
def test_a_train_loop_stops_every_rank_at_the_same_step_on_a_sigterm_to_one(shared_job):
    tmp_path = shared_job / "trainloop"
    zero, one = records(tmp_path, "trainloop")
    assert zero["code"] == one["code"] == 143
    assert zero["step"] == one["step"]
    assert (tmp_path / "ckpt" / f"ckpt-{zero['step']}").is_dir()


@pytest.mark.slow
@pytest.mark.distributed
def test_a_train_loop_on_a_sharded_data_flow_gives_each_rank_its_share_and_resumes_mid_epoch(
        tmp_path):
    launch(tmp_path / "straight", "flow")
    zero, one = records(tmp_path / "straight", "flow")
    assert zero["batches"] == one["batches"] == 4  # 21 examples, padded to 22: 11 a rank
    for epoch in range(2):
        share = [[i for batch in r["seen"][epoch * 4:(epoch + 1) * 4] for i in batch]
                 for r in (zero, one)]
        assert len(share[0]) == len(share[1]) == 11
        assert set(share[0]) | set(share[1]) == set(range(21))  # all of it, one padded twice
    launch(tmp_path / "resumed", "flow", "3")  # SIGTERM to rank 1 after step 3, then resumed
    resumed = records(tmp_path / "resumed", "flow")
    for straight, again in zip((zero, one), resumed):
        assert again["seen"] == straight["seen"]  # the same batches, in the same order


@pytest.mark.slow
@pytest.mark.distributed
def test_an_async_save_of_fsdp2_shards_commits_once_every_rank_has_written(shared_job):
    """DCP's async_save writes the shards in the background; nothing is committed until every
    rank's write is done (`wait`, the next save, the end of training)."""
    tmp_path = shared_job / "dcpasync"
    for record in records(tmp_path, "dcpasync"):
        assert record["pending"] and not record["committed_early"] and record["committed"]
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(record["shards"])
        assert record["saved_weights_restored"]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_checkpoint_io_that_returns_no_digests_is_still_listed_and_verified(shared_job):
    """A custom `CheckpointIO` may return no digests (tests/distributed_resume_job.py's
    `NoDigestsIO`); rank 0, which wrote its file, hashes it: the commit lists no file itself,
    and a file it was not told of would be left out of the manifest -- neither fsynced nor
    ever verified."""
    tmp_path = shared_job / "nodigests"
    record = records(tmp_path, "nodigests")[0]
    assert record["restored"] == 3
    checkpoint = tmp_path / "ckpt" / "ckpt-3"
    assert set(record["manifest"]["files"]) == {"payload.cadence", "rank-0.cadence",
                                                "rank-1.cadence"}
    digest = hashlib.sha256((checkpoint / "payload.cadence").read_bytes()).hexdigest()
    assert record["manifest"]["sha256"]["payload.cadence"] == digest
    assert not [p for p in checkpoint.iterdir() if p.name.startswith(".payload")]


@pytest.mark.slow
@pytest.mark.distributed
def test_an_async_ddp_save_leaves_the_training_thread_and_commits_what_was_saved(shared_job):
    """Under DDP the training thread only copies the state into host memory (rank 0 the whole
    model and optimizer: before, it wrote them itself while every rank waited); the files are
    written by a thread of each rank and committed at `wait`. Weights changed after the save do
    not leak into it. Rank 0 deletes old checkpoints in a thread too."""
    tmp_path = shared_job / "ddpasync"
    for record in records(tmp_path, "ddpasync"):
        assert record["pending"] and not record["committed_early"] and record["committed"]
        assert {"rank-0.cadence", "rank-1.cadence", "state.cadence", "manifest.json"} <= set(
            record["files"])
        assert record["restored"] == 1 and record["saved_weights_restored"]
    zero = records(tmp_path, "ddpasync")[0]
    assert zero["kept"] == ["ckpt-2", "ckpt-3"]  # rank 0's retention, done when wait() returns
    # wait(retention=False), the Task Trainer's at each loop's end, returned once ckpt-3 was
    # committed while rank 0's prune was still deleting: its training thread never waits for it
    assert zero["while_pruning"] == ["ckpt-1", "ckpt-2", "ckpt-3"]
    assert zero["pruners"] and all(name.startswith("cadence-prune-") for name in zero["pruners"])


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_trains_checkpoints_with_dcp_and_resumes_on_one_or_two_processes(tmp_path):
    launch(tmp_path, "fsdp2")
    assert records(tmp_path, "fsdp2")[0]["accuracy"] > 0.2  # trained (chance: 0.1), evaluated
    checkpoint = tmp_path / "run" / "checkpoints" / "ckpt-20"
    shards = {p.name for p in (checkpoint / "sharded").iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= shards  # each rank its shards
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    for nproc in (1, 2):
        launch(tmp_path, "fsdp2restore", nproc=nproc)
        assert records(tmp_path, "fsdp2restore", nproc)[0]["step"] == 20
        restored = torch.load(tmp_path / f"restored-{nproc}.pt", weights_only=True)
        assert set(restored) == set(full)
        for key, value in full.items():  # the same weights, resharded to 1 or 2 processes
            assert torch.equal(restored[key], value), (nproc, key)


# ---------------------------------------------------------------------------- issue 15:
# torchmetrics' metrics across ranks (tests/torchmetrics_job.py)

METRICS_JOB = Path(__file__).parent / "torchmetrics_job.py"


@pytest.mark.slow
@pytest.mark.distributed
def test_torchmetrics_under_two_ranks_equal_the_single_process_value(tmp_path):
    pytest.importorskip("torchmetrics")
    torchrun(str(tmp_path), job=METRICS_JOB)
    zero, one = (json.loads((tmp_path / f"metrics-{rank}.json").read_text()) for rank in (0, 1))
    for part in ("train", "eval"):  # gathered by compute(): every rank reads the same value
        assert zero[part] == one[part], part
        # each example once: the same examples as cadence's accuracy, all-reduced by cadence
        assert abs(zero[part]["micro"] - zero[part]["cadence"]) < 1e-6, part
    for key, value in zero["single"].items():  # the whole data in one process, same weights
        expected = value if not isinstance(value, dict) else value["auroc"]
        got = zero["eval"][key] if not isinstance(value, dict) else zero["eval"][key]["auroc"]
        assert abs(got - expected) < 1e-6, key
    for rank in (zero, one):  # each rank's own states came back from its rank file
        assert rank["loop_resumed"] == rank["loop_straight"] and len(rank["loop_straight"]) == 2
    assert zero["loop_straight"] == one["loop_straight"]
