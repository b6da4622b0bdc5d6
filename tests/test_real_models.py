"""Real models across ranks (torchrun, gloo): the GPT-2-style ``gpt`` and the ``char_lm``
transformer -- tied embedding and head, blocks in a ModuleList -- trained with DDP and FSDP2,
checkpointed at one world size and resumed at others, as users of torchtitan and Lightning do.

The jobs are the ``cadence`` command itself and ``tests/real_model_job.py`` (`run_experiment`
with a callback that gathers the whole model and optimizer state where training begins and
ends).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

JOB = Path(__file__).parent / "real_model_job.py"

SMALL = {
    "gpt": ["task.model.n_layer=2", "task.model.n_head=2", "task.model.n_embd=32",
            "task.model.block_size=32"],
    "char_lm": ["task.model.num_layers=2", "task.model.num_heads=2", "task.model.d_model=32",
                "task.model.dim_feedforward=64", "task.model.dropout=0.0"],
}
"""Each experiment's model, shrunk to seconds a step on a CPU."""
DATA = ["task.sequence_length=32", "task.max_bytes=60000",
        "task.train_data.global_batch_size=12", "task.validation_data.global_batch_size=12",
        "trainer.validation_steps=2"]
"""A global batch of 12 splits evenly over 1, 2, 3 or 4 ranks."""


def torchrun_command(nproc):
    runner = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if runner is None:
        pytest.skip("torchrun is not installed next to this Python")
    return [runner, "--standalone", f"--nproc_per_node={nproc}"]


def run(command, cwd, timeout=300):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def cadence_train(nproc, experiment, run_dir, settings, cwd):
    """``cadence train`` in `nproc` processes (a plain process for 1)."""
    launcher = [sys.executable] if nproc == 1 else torchrun_command(nproc)
    command = [*launcher, "-m", "cadence", "train", "-e", experiment, "-m", str(run_dir),
               "--mode", "train"]
    for setting in settings:
        command += ["--set", setting]
    return run(command, cwd)


def job(nproc, experiment, run_dir, steps, prefix, settings):
    launcher = [sys.executable] if nproc == 1 else torchrun_command(nproc)
    return run([*launcher, str(JOB), experiment, str(run_dir), str(steps), str(prefix),
                *settings], cwd=run_dir.parent)


def training_losses(run_dir):
    lines = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    return [record["training_loss"] for record in map(json.loads, lines)
            if "training_loss" in record]


def assert_same_state(expected, actual, where):
    """Every tensor equal, bit for bit; every other value equal."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and torch.equal(expected, actual), where
    elif isinstance(expected, dict):
        assert set(expected) == set(actual), (where, sorted(expected), sorted(actual))
        for key in expected:
            assert_same_state(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(actual), where
        for index, (a, b) in enumerate(zip(expected, actual)):
            assert_same_state(a, b, f"{where}[{index}]")
    else:
        assert expected == actual, (where, expected, actual)


@pytest.mark.slow
@pytest.mark.distributed
def test_one_process_ddp_and_fsdp2_give_the_same_loss_curve_on_the_same_global_batch(tmp_path):
    """The same model, data order and global batch of 12: one process takes it whole, two
    ranks take 6 each and average their gradients (DDP) or reduce-scatter them (FSDP2)."""
    settings = [*SMALL["gpt"], *DATA, "trainer.train_steps=6", "trainer.steps_per_loop=1",
                "trainer.optimizer_config.learning_rate.warmup_steps=0", "runtime.device=cpu"]
    curves = {}
    for strategy, nproc in (("none", 1), ("ddp", 2), ("fsdp2", 2)):
        run_dir = tmp_path / strategy
        result = cadence_train(nproc, "gpt", run_dir, [*settings, f"runtime.strategy={strategy}"],
                               tmp_path)
        curves[strategy] = training_losses(run_dir)
        if nproc > 1:  # what a run prints at its end: once, from rank 0
            assert result.stdout.count("Run directory:") == 1, result.stdout
            assert result.stderr.count("Experiment gpt, mode train") == 1
    assert len(curves["none"]) == 6
    for strategy in ("ddp", "fsdp2"):
        assert curves[strategy] == pytest.approx(curves["none"], rel=1e-5), strategy
    assert curves["none"][-1] < curves["none"][0]  # and it learns


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("experiment", ["gpt", "char_lm"])
def test_fsdp2_saved_at_two_ranks_resumes_at_one_and_three_with_the_saved_state(
        tmp_path, experiment):
    """Sharded at 2 ranks, checkpointed at step 4 through DCP; resumed in one process (a
    group of one) and at 3 ranks: the whole model and optimizer, gathered where training
    begins again, are the saved ones bit for bit; the data position is dealt to the new ranks,
    and one line says so."""
    settings = [*SMALL[experiment], *DATA, "runtime.strategy=fsdp2", "trainer.steps_per_loop=2",
                "trainer.checkpoint_interval=4"]
    saved_run = tmp_path / "run-2"
    job(2, experiment, saved_run, 4, tmp_path / "two", settings)
    saved = torch.load(tmp_path / "two-end.pt", weights_only=True)
    assert saved["step"] == 4
    checkpoint = saved_run / "checkpoints" / "ckpt-4"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(
        os.listdir(checkpoint / "sharded"))
    # Each rank hashed the files it wrote and handed rank 0 the digests: the commit read no
    # file back, and every digest in the manifest is the file's.
    assert (tmp_path / "two-commit-hashes.txt").read_text() == ""
    assert (tmp_path / "two-commit-fsyncs.txt").read_text() == ""  # each rank synced its own
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert set(manifest["sha256"]) == set(manifest["files"]) == {  # every file the ranks wrote
        str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*")
        if p.is_file() and p.name != "manifest.json"}
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256((checkpoint / name).read_bytes()).hexdigest() == digest, name
        assert (checkpoint / name).stat().st_size == manifest["files"][name], name
    for nproc in (1, 3):
        run_dir = tmp_path / f"run-{nproc}"
        shutil.copytree(saved_run, run_dir)
        prefix = tmp_path / f"resumed-{nproc}"
        job(nproc, experiment, run_dir, 6, prefix, settings)
        restored = torch.load(f"{prefix}-begin.pt", weights_only=True)
        assert restored["step"] == 4
        assert_same_state(saved["model"], restored["model"], "model")
        assert_same_state(saved["optimizer"], restored["optimizer"], "optimizer")
        assert torch.load(f"{prefix}-end.pt", weights_only=True)["step"] == 6  # it trains on
        log = Path(f"{prefix}-log-0.txt").read_text()
        layout = "one process" if nproc == 1 else f"dp_shard={nproc}"
        assert log.count(f"Resuming checkpoint ckpt-4, written at dp_shard=2 (2 processes), "
                         f"at {layout} ({nproc}): the model and optimizer are resharded from "
                         "their shards (DCP); the ") == 1, log
        if nproc == 3:
            assert "Resuming" not in Path(f"{prefix}-log-1.txt").read_text()  # rank 0 says it
    # Resumed at the world size that wrote it, each rank checks what it reads: the metadata, its
    # own shards and rank 0's (which hold the replicated values, such as the optimizer's step),
    # never every rank's -- at 1,024 ranks, not the whole model on every rank.
    run_dir, prefix = tmp_path / "run-3", tmp_path / "again-3"
    job(3, experiment, run_dir, 8, prefix, settings)
    assert torch.load(f"{prefix}-begin.pt", weights_only=True)["step"] == 6
    shards = sorted(p.name for p in (run_dir / "checkpoints" / "ckpt-6" / "sharded").iterdir())
    assert len([name for name in shards if name.endswith(".distcp")]) == 3, shards
    for rank in range(3):
        hashed = Path(f"{prefix}-restore-hashes-{rank}.txt").read_text().split()
        assert "sharded/.metadata" in hashed and f"sharded/__{rank}_0.distcp" in hashed, hashed
        assert {name for name in hashed if name.endswith(".distcp")} <= {
            "sharded/__0_0.distcp", f"sharded/__{rank}_0.distcp"}, (rank, hashed)
        assert not any(name.startswith("rank-") for name in hashed), hashed  # read as hashed


MOE = ["task.sequence_length=32", "task.max_bytes=60000", "task.train_data.global_batch_size=12",
       "task.validation_data.global_batch_size=12", "runtime.strategy=fsdp2",
       "trainer.steps_per_loop=2", "trainer.checkpoint_interval=4",
       "trainer.optimizer_config.gradient_clip_norm=1.0",
       "trainer.optimizer_config.gradient_accumulation_steps=2"]
"""tests/user_moe.py sharded per block, clipped, two micro-batches per step."""


def failing_job(nproc, experiment, run_dir, steps, prefix, settings, env):
    launcher = torchrun_command(nproc)
    return subprocess.run([*launcher, str(JOB), experiment, str(run_dir), str(steps), str(prefix),
                           *settings], cwd=run_dir.parent, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", **env})


@pytest.mark.slow
@pytest.mark.distributed
def test_a_users_moe_decoder_trains_checkpoints_and_resumes_under_fsdp2_at_two_and_three_ranks(
        tmp_path):
    """Experts nested in each block, a balance loss as ``model.aux_losses``, a tied head and a
    (1, T, D) position parameter -- an empty shard on every rank but the first, 256 embedding
    rows split unevenly over 3 -- through every check cadence runs on weights and gradients:
    clipping's norm, LossGuard's check of the weights before each save, the best export."""
    run_dir = tmp_path / "run"
    job(2, "user_moe", run_dir, 4, tmp_path / "two", MOE)
    saved = torch.load(tmp_path / "two-end.pt", weights_only=True)
    assert saved["model"]["positions"].shape == (1, 32, 30)
    summary = (tmp_path / "two-log-0.txt").read_text()  # the user's class, not FSDP2's
    assert "Model MoEDecoder: 53,700 parameters" in summary, summary
    resumed = tmp_path / "three"
    job(3, "user_moe", run_dir, 8, resumed, MOE)
    assert_same_state(saved["model"], torch.load(f"{resumed}-begin.pt", weights_only=True)["model"],
                      "model")
    ended = torch.load(f"{resumed}-end.pt", weights_only=True)
    assert ended["step"] == 8
    assert all(torch.isfinite(t).all() for t in ended["model"].values())
    records = [json.loads(line) for line in
               (run_dir / "train" / "metrics.jsonl").read_text().splitlines()]
    norms = [r["gradient_norm"] for r in records if "gradient_norm" in r]
    assert len(norms) == 4 and all(0 < norm < float("inf") for norm in norms), records
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["ckpt-4", "ckpt-8"]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_nan_in_one_ranks_shard_stops_every_rank_before_the_checkpoint(tmp_path):
    """A NaN written into rank 1's shard of an expert after the loop's last step: the loop's
    mean loss is finite, the other rank's shards are finite, and still every rank refuses to
    save those weights -- the ranks agree on the check -- and the job ends at once, no hang."""
    run_dir = tmp_path / "run"
    result = failing_job(2, "user_moe", run_dir, 8, tmp_path / "nan", MOE,
                         {"POISON": "4:1:blocks.1.experts.2.up.weight"})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    for rank in (0, 1):
        assert (f"[rank{rank}]: cadence.core.errors.DivergenceError: Training diverged at step 4: "
                "the weights about to be checkpointed are not finite (NaN or infinity in "
                "blocks.1.experts.2.up.weight)") in output, output[-4000:]
    assert not (run_dir / "checkpoints").exists() or not os.listdir(run_dir / "checkpoints")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_ddp_run_resumed_at_another_world_size_says_so_in_one_line(tmp_path):
    settings = [*SMALL["gpt"], *DATA, "runtime.strategy=ddp", "trainer.steps_per_loop=2",
                "trainer.checkpoint_interval=4"]
    job(2, "gpt", tmp_path / "run", 4, tmp_path / "two", settings)
    assert (tmp_path / "two-commit-hashes.txt").read_text() == ""  # rank files: their ranks'
    assert (tmp_path / "two-commit-fsyncs.txt").read_text() == ""
    job(3, "gpt", tmp_path / "run", 6, tmp_path / "three", settings)
    log = (tmp_path / "three-log-0.txt").read_text()
    assert log.count("Resuming checkpoint ckpt-4, written at dp_replicate=2 (2 processes), at "
                     "dp_replicate=3 (3): the model and optimizer are loaded whole on every "
                     "rank; the ") == 1, log
    assert_same_state(torch.load(tmp_path / "two-end.pt", weights_only=True)["model"],
                      torch.load(tmp_path / "three-begin.pt", weights_only=True)["model"],
                      "model")


def two_node_commands(tmp_path, run_dir, settings, private=None):
    """Two ``torchrun --nnodes=2`` launchers, one process each, meeting through a c10d
    rendezvous on 127.0.0.1. With `private`, each runs in its own mount namespace where the
    run directory's parent is node i's own folder: the same path, not the same files -- two
    machines without a shared filesystem."""
    import socket

    launcher = torchrun_command(1)[0]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    commands = []
    for node in (0, 1):
        command = [launcher, "--nnodes=2", "--nproc_per_node=1", f"--node_rank={node}",
                   "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                   f"--rdzv_id=cadence-{port}", "-m", "cadence", "train", "-e", "gpt",
                   "-m", str(run_dir), "--mode", "train"]
        for setting in settings:
            command += ["--set", setting]
        if private is not None:
            mount = f"mount --bind {private[node]} {run_dir.parent}"
            command = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                       f"{mount} && exec \"$0\" \"$@\"", *command]
        commands.append(command)
    return commands


def run_nodes(commands, cwd):
    nodes = [subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
             for command in commands]
    return [(node.communicate(timeout=300)[0], node.returncode) for node in nodes]


GPT_ON_TWO_NODES = [*SMALL["gpt"], *DATA, "trainer.train_steps=4", "trainer.steps_per_loop=2",
                    "trainer.checkpoint_interval=2", "runtime.device=cpu"]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_nodes_that_share_the_run_directory_train_and_print_once(tmp_path):
    run_dir = tmp_path / "shared" / "run"
    outputs = run_nodes(two_node_commands(tmp_path, run_dir, GPT_ON_TWO_NODES), tmp_path)
    assert [code for _, code in outputs] == [0, 0], outputs
    assert sum(output.count("Run directory:") for output, _ in outputs) == 1
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "ckpt-2", "ckpt-4"]
    assert {"rank-0.cadence", "rank-1.cadence"} <= set(
        os.listdir(run_dir / "checkpoints" / "ckpt-4"))


@pytest.mark.slow
@pytest.mark.distributed
def test_two_nodes_without_a_shared_filesystem_are_refused_in_one_line_before_step_0(tmp_path):
    if subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("mount namespaces are not available here (unshare -m)")
    private = [tmp_path / "node-0", tmp_path / "node-1"]
    for folder in private:
        folder.mkdir()
    (tmp_path / "shared").mkdir()
    run_dir = tmp_path / "shared" / "run"
    commands = two_node_commands(tmp_path, run_dir, GPT_ON_TWO_NODES, private=private)
    outputs = run_nodes(commands, tmp_path)
    for output, code in outputs:
        assert code != 0
        errors = [line for line in output.splitlines() if line.startswith("cadence: error:")]
        assert len(errors) == 1, output
        assert "do not share the checkpoint directory" in errors[0]
        assert "rank 1 on" in errors[0] and "filesystem every node mounts" in errors[0]
        assert "[rank0]: Traceback" not in output and "[rank1]: Traceback" not in output
    for folder in private:  # refused before step 0: nothing trained, nothing saved
        assert not list(folder.glob("run/checkpoints/ckpt-*"))
        assert not (folder / "run" / "train" / "metrics.jsonl").exists()


def _launcher_traceback_removed(output):
    """`output` without torchrun's own traceback: the launcher re-raises the SIGTERM it was sent
    (``SignalException``) after its workers have stopped; the workers' output is what counts."""
    import re

    return re.sub(r"Traceback \(most recent call last\):\n  File \"[^\"]*torchrun\".*?"
                  r"SignalException[^\n]*\n", "", output, flags=re.S)


def sigterms_to_the_launcher(tmp_path, trials):
    """``kill <torchrun>`` at a random moment of training, `trials` times in one run directory,
    every other time with another process keeping a core busy: each time both ranks save the
    same step, exit without a traceback, and the run says once that it stopped; each run resumes
    from the previous one's checkpoint."""
    import random
    import signal
    import threading
    import time

    command = [*torchrun_command(2), "-m", "cadence", "train", "-m", "run", "--mode", "train"]
    for setting in ("trainer.train_steps=1000000", "trainer.steps_per_loop=20",
                    "trainer.checkpoint_interval=200", "task.model.hidden_sizes=[32]",
                    "runtime.device=cpu"):
        command += ["--set", setting]
    checkpoints = tmp_path / "run" / "checkpoints"
    rng = random.Random(0)
    stopped_at = None
    for trial in range(trials):
        busy = (subprocess.Popen([sys.executable, "-c", "while True: pass"])
                if trial % 2 else None)
        try:
            launcher = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
            lines: list[str] = []
            reader = threading.Thread(target=lines.extend, args=(launcher.stdout,), daemon=True)
            reader.start()
            deadline = time.monotonic() + 120
            while not any("train | step" in line for line in lines):
                assert launcher.poll() is None and time.monotonic() < deadline, "".join(lines)
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 1.5))
            launcher.send_signal(signal.SIGTERM)
            launcher.wait(timeout=120)
            reader.join(timeout=30)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
            launcher.stdout.close()
        output = "".join(lines)
        workers = _launcher_traceback_removed(output)
        first = workers.find("Traceback")  # on failure: from there on, every rank's is there
        assert first == -1, f"trial {trial}:\n{workers[first:first + 8000]}"
        assert output.count("Stopped by a signal; checkpoint ") == 1, (trial, output)
        if stopped_at is not None:
            assert f"Restored run/checkpoints/ckpt-{stopped_at} (step {stopped_at})" in output
        stopped_at = int(output.split("Stopped by a signal; checkpoint ")[1].split("ckpt-")[1]
                         .split(".")[0])
        files = set(os.listdir(checkpoints / f"ckpt-{stopped_at}"))
        assert {"manifest.json", "state.cadence", "rank-0.cadence", "rank-1.cadence"} <= files


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(900)  # six launches of up to 120 + 120 s
def test_sigterms_to_the_launcher_each_stop_every_rank_cleanly_and_resume(tmp_path):
    """Six trials, three of them beside a busy core: each trial is a torchrun job of its own
    (about 15 s on 2 loaded cores); the twenty of the soak test below took over 5 minutes."""
    sigterms_to_the_launcher(tmp_path, 6)


@pytest.mark.soak
@pytest.mark.distributed
@pytest.mark.timeout(3000)  # twenty launches of up to 120 + 120 s
def test_twenty_sigterms_to_the_launcher_each_stop_every_rank_cleanly_and_resume(tmp_path):
    sigterms_to_the_launcher(tmp_path, 20)
