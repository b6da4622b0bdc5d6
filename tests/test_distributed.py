"""Two processes under torchrun on gloo: all ranks take part in checkpoints, each restores its
own RNG state, and only rank 0 writes summaries."""

import json
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
    subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", str(job), *args],
                   check=True, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
@pytest.mark.distributed
def test_checkpoints_across_two_ranks(tmp_path):
    torchrun("train", str(tmp_path))
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-3", "ckpt-6"]
    assert {p.name for p in (ckpt / "ckpt-6").iterdir()} == {
        "manifest.json", "state.cadence", "rng-0.cadence", "rng-1.cadence"}
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
    assert {p.name for p in (run / "checkpoints" / "ckpt-40").iterdir()} >= {
        "rng-0.cadence", "rng-1.cadence"}
    assert (run / "params.yaml").is_file() and (run / "best" / "info.json").is_file()
