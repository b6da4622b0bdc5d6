"""The ``gpt`` experiment on token data under torchrun (gloo), through the ``cadence`` command: a
mixture of two prepared sources, packed, resumed at 2 -> 3 -> 2 ranks, trains on the global
sequence of samples of an uninterrupted one-process run; a SIGKILL, then the same command, ends
with the uninterrupted run's weights bit for bit. A user's nanoGPT ``train.bin`` / ``val.bin``
train as they are. (tests/token_data_job.py records the samples.)"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

import cadence
from cadence.data.prepare import prepare_data
from cadence.engine.checkpoint_io import read_state_file
from cadence.task.cli import main

JOB = Path(__file__).parent / "token_data_job.py"
SETTINGS = ["task.model.n_layer=1", "task.model.n_head=2", "task.model.n_embd=16",
            "task.model.block_size=16", "task.sequence_length=16",
            "task.train_data.global_batch_size=6", "task.validation_data.global_batch_size=6",
            "trainer.steps_per_loop=2", "trainer.checkpoint_interval=2",
            "trainer.validation_steps=1", "runtime.device=cpu"]
"""A model of seconds a step; a global batch of 6 deals evenly to 1, 2 or 3 data shards."""


def torchrun_test(test):
    """Marks a test of torchrun jobs: slow, distributed, a few jobs of up to 240 s."""
    return pytest.mark.slow(pytest.mark.distributed(pytest.mark.timeout(900)(test)))


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    """Two sources prepared from the standard library's source (bytes, each line of a file a
    document, so that windows of 16 tokens hold several): a mixture of 3 to 1, packed."""
    root = tmp_path_factory.mktemp("data")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name, files in (("json", "json/*.py"), ("email", "email/_*.py")):
        lines = [line for path in sorted(stdlib.glob(files))
                 for line in path.read_text().splitlines() if line.strip()]
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"text": line}) + "\n"
                                                    for line in lines))
        prepare_data([str(root / f"{name}.jsonl")], root / name, workers=1)
    return [f"task.train_data.input_path={root / 'json'},{root / 'email'}",
            "task.train_data.input_weights=[3,1]", "task.train_data.packing=true",
            f"task.validation_data.input_path={root / 'json'}",
            "task.validation_data.packing=true"]


def cadence_train(nproc, run_dir, steps, settings, record, tag, *, check=True, kill_at=None,
                  extra=()):
    """``cadence train -e tests/token_data_job.py:recording_gpt`` in `nproc` processes."""
    if nproc == 1:
        launcher = [sys.executable, "-m"]
    else:
        runner = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        if runner is None:
            pytest.skip("torchrun is not installed next to this Python")
        launcher = [runner, "--standalone", f"--nproc_per_node={nproc}", "-m"]
    command = [*launcher, "cadence", "train", "-e", f"{JOB}:recording_gpt", "-m", str(run_dir),
               "--mode", "train", *extra]
    for setting in [*SETTINGS, *settings, f"trainer.train_steps={steps}"]:
        command += ["--set", setting]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RECORD_DIR": str(record), "RECORD_TAG": tag}
    if kill_at is not None:
        env["KILL_AT"] = str(kill_at)
    ran = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env,
                         cwd=run_dir.parent)
    if check:
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-6000:]
    return ran


def global_batches(record, tag, shards):
    """The global batch of each step a phase trained: its shards' rows, in shard order (the
    last record of a step, where a killed attempt and its rerun both made it)."""
    steps: dict[int, list] = {}
    for shard in range(shards):
        lines = (record / f"{tag}-shard{shard}-of-{shards}.jsonl").read_text().splitlines()
        by_step = {}
        for line in map(json.loads, lines):
            by_step[line.pop("step")] = line
        for step, rows in by_step.items():
            steps.setdefault(step, []).append(rows)
    return {step: {key: [row for part in parts for row in part[key]] for key in parts[0]}
            for step, parts in sorted(steps.items())}


@torchrun_test
def test_a_packed_mixture_resumed_at_2_then_3_then_2_ranks_trains_on_the_uninterrupted_samples(
        tmp_path, mixture):
    record = tmp_path / "record"
    expected = uninterrupted(mixture, 12)
    run = tmp_path / "run"
    said = []
    for phase, (nproc, steps) in enumerate([(2, 4), (3, 8), (2, 12)]):
        ran = cadence_train(nproc, run, steps, mixture, record, f"phase{phase}",
                            extra=["--allow-config-change"] if phase else [])
        said.append(ran.stdout + ran.stderr)
        got = global_batches(record, f"phase{phase}", nproc)
        assert sorted(got) == list(range(steps - 3, steps + 1))
        for step, batch in got.items():
            assert batch == expected[step], (phase, step)
    assert "the token data goes on at global sample 24, dealt to 3 data shards instead of 2" in (
        said[1])
    assert "the token data goes on at global sample 48, dealt to 2 data shards instead of 3" in (
        said[2])
    # packed: documents restart their positions inside windows
    assert any(0 in row[1:] for batch in expected.values() for row in batch["position_ids"])


def uninterrupted(settings, steps):
    """The global batches of an uninterrupted run: its training loader, as the experiment
    builds it in one process, read for `steps` steps."""
    from cadence.data.token_loader import build_token_inputs

    config = cadence.load_config(f"{JOB}:recording_gpt",
                                 overrides=[*SETTINGS, *settings])
    loader = build_token_inputs(config.task.train_data, sequence_length=16, vocab_size=256)
    batches = {}
    for step in range(1, steps + 1):
        features, _ = loader.next_batch()
        batches[step] = {key: value.tolist() for key, value in features.items()}
    return batches


@torchrun_test
def test_a_sigkill_then_the_same_command_ends_with_the_uninterrupted_weights_bitwise(
        tmp_path, mixture):
    record = tmp_path / "record"
    cadence_train(2, tmp_path / "whole", 6, mixture, record, "whole")
    killed = cadence_train(2, tmp_path / "run", 6, mixture, record, "run", check=False,
                           kill_at=5)
    assert killed.returncode != 0
    assert not (tmp_path / "run" / "checkpoints" / "ckpt-6").exists()
    cadence_train(2, tmp_path / "run", 6, mixture, record, "run")
    assert global_batches(record, "run", 2) == global_batches(record, "whole", 2)
    whole = read_state_file(tmp_path / "whole" / "checkpoints" / "ckpt-6" / "state.cadence",
                            None)["state"]
    resumed = read_state_file(tmp_path / "run" / "checkpoints" / "ckpt-6" / "state.cadence",
                              None)["state"]
    for part in ("model", "optimizer"):
        flat_whole = _tensors(whole[part])
        flat_resumed = _tensors(resumed[part])
        assert flat_whole.keys() == flat_resumed.keys()
        for name, tensor in flat_whole.items():
            assert torch.equal(tensor, flat_resumed[name]), (part, name)


def _tensors(tree, prefix=""):
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items()
                for k, v in _tensors(value, f"{prefix}.{key}").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for index, value in enumerate(tree)
                for k, v in _tensors(value, f"{prefix}[{index}]").items()}
    return {}


@pytest.mark.slow
def test_gpt_trains_on_a_users_nanogpt_train_bin_and_val_bin(tmp_path, monkeypatch, capsys):
    """The README's second example: GPT-2 token ids in uint16 files, as nanoGPT writes them."""
    monkeypatch.chdir(tmp_path)
    generator = np.random.default_rng(0)
    generator.integers(0, 50257, 20_000).astype(np.uint16).tofile(tmp_path / "train.bin")
    generator.integers(0, 50257, 2_000).astype(np.uint16).tofile(tmp_path / "val.bin")
    arguments = ["train", "-e", "gpt", "-m", "run", "--set", "task.train_data.input_path=train.bin",
                 "--set", "task.validation_data.input_path=val.bin",
                 "--set", "trainer.train_steps=4", "--set", "trainer.validation_interval=4"]
    for setting in SETTINGS:
        arguments += ["--set", setting]
    assert main(arguments) == 2  # the default vocabulary (bytes) cannot hold GPT-2's ids
    err = capsys.readouterr().err
    assert "outside the model's vocabulary of 256: set the model's vocab_size to at least" in err
    arguments[4] = "run2"
    assert main([*arguments, "--set", "task.model.vocab_size=50304"]) == 0
    assert (tmp_path / "run2" / "checkpoints" / "ckpt-4").is_dir()
    logs = (tmp_path / "run2" / "eval" / "metrics.jsonl").read_text()
    assert "validation_loss" in logs
