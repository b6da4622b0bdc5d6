"""Exact resume: an interrupted and resumed run ends bitwise equal to an uninterrupted one,
with a shuffled DataLoader, dropout, Adam and a learning-rate schedule in the job -- also when
the first process is killed with SIGKILL at a random moment, or in the middle of a checkpoint
write."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

JOB = Path(__file__).parent / "resume_job.py"
TARGET = 40  # five passes over the data; checkpoints every 2 steps, loops of 3


def run(directory, steps, out=None, *extra):
    """Runs the job to `steps`; returns the step it started from (0, or the restored one)."""
    command = [sys.executable, str(JOB), "--dir", str(directory), "--steps", str(steps), *extra]
    if out is not None:
        command += ["--out", str(out)]
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")  # deterministic cuBLAS (GPU runs)
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120,
                          env=env)
    return int(done.stdout.split("START ", 1)[1].split()[0])


def newest_checkpoint(directory):
    """The step of the newest complete checkpoint in `directory` (a manifest committed)."""
    return max(int(p.name.split("-")[1]) for p in Path(directory).glob("ckpt-*")
               if (p / "manifest.json").is_file())


def assert_bitwise_equal(a, b):
    left = torch.load(a, weights_only=True)
    right = torch.load(b, weights_only=True)
    assert left["epoch"] == right["epoch"] == 5
    assert left["scheduler"] == right["scheduler"]
    for key, tensor in left["model"].items():
        assert torch.equal(tensor, right["model"][key]), key
    for index, state in left["optimizer"]["state"].items():
        for key, tensor in state.items():
            assert torch.equal(tensor, right["optimizer"]["state"][index][key]), (index, key)


@pytest.fixture(scope="module", params=["global_rng", "generator"])
def reference(request, tmp_path_factory):
    flags = ["--generator"] if request.param == "generator" else []
    directory = tmp_path_factory.mktemp("reference")
    out = directory / "final.pt"
    run(directory / "ckpt", TARGET, out, *flags)
    return out, flags


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", [7, 17])
def test_train_stop_and_resume_in_a_new_process(tmp_path, reference, stop_at):
    out, flags = reference
    assert run(tmp_path, stop_at, None, *flags) == 0
    # The resumed process seeds as the reference does: only the checkpoint makes it go on from
    # `stop_at` -- a resume that trained again from step 0 would end equal too.
    assert run(tmp_path, TARGET, tmp_path / "final.pt", *flags) == stop_at
    assert_bitwise_equal(out, tmp_path / "final.pt")


def start(directory, flags):
    return subprocess.Popen(
        [sys.executable, str(JOB), "--dir", str(directory), "--steps", str(TARGET), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )


def kill(process):
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stdout.close()


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path, reference):
    out, flags = reference
    rng = random.Random(1234)
    for _ in range(3):
        process = start(tmp_path, [*flags, "--step-sleep", "0.02"])
        assert process.stdout.readline().startswith("START")
        time.sleep(rng.uniform(0.05, 0.6))
        kill(process)
    newest = newest_checkpoint(tmp_path)
    assert 0 < newest < TARGET  # the kills left the run in the middle
    assert run(tmp_path, TARGET, tmp_path / "final.pt", *flags) == newest
    assert_bitwise_equal(out, tmp_path / "final.pt")


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_then_resume(tmp_path, reference):
    out, flags = reference
    process = start(tmp_path, [*flags, "--pause-in-write"])
    assert process.stdout.readline().startswith("START")
    for _ in range(3):  # let a few checkpoints commit, then kill in the middle of the next one
        assert process.stdout.readline().strip() == "WRITING"
    kill(process)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-ckpt-")]
    assert leftovers, "the kill should have left a half-written checkpoint behind"
    newest = newest_checkpoint(tmp_path)  # the half-written one is not among them
    assert run(tmp_path, TARGET, tmp_path / "final.pt", *flags) == newest > 0
    assert_bitwise_equal(out, tmp_path / "final.pt")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-ckpt-")]


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_stop_and_resume_in_a_new_process_is_bitwise_equal(tmp_path):
    # Metrics, weights, Adam's state and the CUDA generator (dropout) are restored onto the GPU
    run(tmp_path / "reference", TARGET, tmp_path / "reference.pt", "--device", "cuda")
    run(tmp_path / "resumed", 17, None, "--device", "cuda")
    run(tmp_path / "resumed", TARGET, tmp_path / "resumed.pt", "--device", "cuda")
    assert_bitwise_equal(tmp_path / "reference.pt", tmp_path / "resumed.pt")
