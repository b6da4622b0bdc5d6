"""Faults in a Task run, end to end: damaged checkpoints, a NaN gradient, a custom task run again,
starts that fail, two trainers at once, a full disk. Whatever happens, no good checkpoint is
lost, no damaged state is trained on, and the same command works again once the cause is gone.
"""

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field

import pytest
import torch
from disks import fill, open_files_under, read_only, small_tmpfs
from torch import nn

import cadence
from cadence.engine.exporter import read_weights
from cadence.task.cli import main
from cadence.task.config import DataConfig
from cadence.task.config_files import load_config
from cadence.task.experiments.digits import DigitsTask, DigitsTaskConfig
from cadence.task.registry import register_task
from cadence.task.train_lib import run_experiment

FAST = ["trainer.train_steps=20", "trainer.steps_per_loop=10", "trainer.checkpoint_interval=10",
        "trainer.validation_interval=10", "task.model.hidden_sizes=[16]"]
CLI_FAST = ["--no-progress", *[arg for pair in zip(["--set"] * len(FAST), FAST) for arg in pair]]


def digits(*overrides):
    return load_config("digits", overrides=[*FAST, *overrides])


def state_file(checkpoint):
    (path,) = [p for p in checkpoint.iterdir() if p.name.startswith("state.")]
    return path


def checkpoint_steps(run):
    return sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir()
                  if p.name.split("-")[1].isdigit())


# ---------------------------------------------------------------------------- damaged state


def test_a_truncated_newest_checkpoint_does_not_block_training_run_again_twice(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *CLI_FAST, "-m", str(run)]) == 0
    newest = state_file(run / "checkpoints" / "ckpt-20")
    with open(newest, "r+b") as handle:
        handle.truncate(newest.stat().st_size // 2)
    for _ in range(2):  # the reproduction: the same command, twice
        assert main(["train", *CLI_FAST, "-m", str(run)]) == 0, capsys.readouterr().err
    assert checkpoint_steps(run) == [10, 20]
    assert len(list((run / "checkpoints").glob("ckpt-20.damaged-*"))) == 1  # kept, renamed
    assert cadence.CheckpointManager({}, run / "checkpoints", strict=False).restore(
        run / "checkpoints" / "ckpt-20") == 20


def test_eval_never_evaluates_flipped_bits_it_falls_back_and_names_the_damage(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *CLI_FAST, "-m", str(run)]) == 0
    reference = tmp_path / "reference"  # the same run without its newest checkpoint
    shutil.copytree(run, reference)
    shutil.rmtree(reference / "checkpoints" / "ckpt-20")
    capsys.readouterr()
    assert main(["eval", "-m", str(reference)]) == 0
    expected = capsys.readouterr().out.splitlines()[0]

    weights = read_weights(run / "checkpoints" / "ckpt-20")["0.weight"]
    path = state_file(run / "checkpoints" / "ckpt-20")
    data = bytearray(path.read_bytes())
    at = data.find(weights.flatten()[:8].numpy().tobytes())
    assert at >= 0
    data[at + 2] ^= 0x40  # one flipped bit in the first layer's weights
    path.write_bytes(bytes(data))
    assert main(["eval", "-m", str(run)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == expected  # ckpt-10's evaluation, not damaged weights
    assert "ckpt-20" in captured.err and "SHA-256" in captured.err
    assert (run / "checkpoints" / "ckpt-20").is_dir()  # evaluation moves nothing


@dataclass
class NaNGradientConfig(DigitsTaskConfig):
    nan_at_calls: list[int] = field(default_factory=list)


@register_task(NaNGradientConfig)
class NaNGradientTask(DigitsTask):
    """A finite loss whose gradient is NaN on the configured calls of train_step."""

    calls = 0

    def train_step(self, inputs, model, optimizer, metrics=None):
        type(self).calls += 1
        logs = super().train_step(inputs, model, optimizer, metrics)
        if type(self).calls in self.task_config.nan_at_calls:
            probe = next(model.parameters()).sum()
            probe.register_hook(lambda grad: grad * float("nan"))
            logs["loss"] = logs["loss"] + 0.0 * probe  # the same value, a NaN gradient
        return logs


def nan_gradient(*overrides, at=(20,)):
    NaNGradientTask.calls = 0
    config = digits(*overrides)
    fields = {f: getattr(config.task, f) for f in DigitsTaskConfig.__dataclass_fields__}
    config.task = NaNGradientConfig(**fields, nan_at_calls=list(at))
    return config


def test_nan_weights_from_a_nan_gradient_are_never_checkpointed(tmp_path):
    with pytest.raises(FloatingPointError, match=r"step 20: the weights about to be "
                       r"checkpointed are not finite \(NaN or infinity in 0.weight"):
        run_experiment(nan_gradient(), "train", tmp_path)
    assert checkpoint_steps(tmp_path) == [10]  # the NaN weights of step 20 were not saved
    for value in read_weights(tmp_path / "checkpoints").values():
        assert torch.isfinite(value).all()


def test_recovery_from_a_nan_gradient_restores_good_weights_and_goes_on(tmp_path, caplog):
    config = nan_gradient("trainer.recovery_max_trials=2", "trainer.train_steps=40")
    with caplog.at_level(logging.WARNING, logger="cadence"):
        model, _ = run_experiment(config, "train", tmp_path)
    assert "not finite" in caplog.text and "restored" in caplog.text
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert checkpoint_steps(tmp_path) == [20, 30, 40]  # digits keeps 3
    for step in checkpoint_steps(tmp_path):
        for value in read_weights(tmp_path / "checkpoints" / f"ckpt-{step}").values():
            assert torch.isfinite(value).all()


# ---------------------------------------------------------------------------- never stuck


@dataclass
class BlobsConfig(cadence.TaskConfig):
    hidden: int = 8


@cadence.register_task(BlobsConfig)
class Blobs(cadence.Task):
    """The README's task of one's own, smaller."""

    def build_model(self):
        return nn.Sequential(nn.Linear(2, self.task_config.hidden), nn.ReLU(),
                             nn.Linear(self.task_config.hidden, 3))

    def build_inputs(self, params, input_context=None):
        x = torch.randn(256, 2, generator=torch.Generator().manual_seed(0))
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        return cadence.build_dataloader(torch.utils.data.TensorDataset(x, y), params,
                                        input_context)

    def build_losses(self, labels, model_outputs, aux_losses=None):
        return nn.functional.cross_entropy(model_outputs, labels)

    def build_metrics(self, training=True):
        return {"accuracy": cadence.Accuracy()}


def blobs(*overrides):
    task = BlobsConfig(train_data=DataConfig(global_batch_size=32, is_training=True),
                       validation_data=DataConfig(global_batch_size=64, is_training=False))
    return cadence.load_config(cadence.ExperimentConfig(task=task), overrides=[
        "trainer.train_steps=20", "trainer.steps_per_loop=10", "trainer.validation_interval=10",
        "trainer.checkpoint_interval=10", "trainer.best_checkpoint_eval_metric=accuracy",
        *overrides])


def test_a_custom_task_run_reloads_its_config_classes_to_resume_and_evaluate(tmp_path, capsys):
    run_experiment(blobs(), "train_and_eval", tmp_path)
    saved = load_config(config_files=[tmp_path / "params.yaml"])  # experiment: ''
    assert type(saved.task) is BlobsConfig and saved == blobs()
    run_experiment(blobs(), "train_and_eval", tmp_path)  # run again: resumes, finished
    run_experiment(blobs("trainer.train_steps=30"), "train", tmp_path, allow_config_change=True)
    assert checkpoint_steps(tmp_path) == [10, 20, 30]
    assert main(["eval", "-m", str(tmp_path)]) == 0  # the command line finds the class too
    assert "Evaluation: accuracy=" in capsys.readouterr().out


def test_a_start_that_fails_before_step_0_writes_no_params_and_the_fix_runs(tmp_path):
    with pytest.raises(cadence.ConfigError, match="hidden_sizes"):
        run_experiment(digits("task.model.hidden_sizes=[0]"), "train", tmp_path / "run")
    assert not (tmp_path / "run").exists()
    run_experiment(digits(), "train", tmp_path / "run")  # the corrected command is not refused
    assert checkpoint_steps(tmp_path / "run") == [10, 20]


def test_a_failed_config_change_leaves_params_yaml_as_it_was(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    run_experiment(digits(), "train", run)
    before = (run / "params.yaml").read_text()
    with pytest.raises(cadence.ConfigError, match="hidden_sizes"):  # fails before it starts
        run_experiment(digits("trainer.train_steps=30", "task.model.hidden_sizes=[0]"),
                       "train", run, allow_config_change=True)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cadence.task.config_files, "save_config", disk_full)
    with pytest.raises(cadence.StorageError, match="params.yaml' failed: No space left"):
        run_experiment(digits("trainer.train_steps=30"), "train", run, allow_config_change=True)
    monkeypatch.undo()
    assert (run / "params.yaml").read_text() == before
    assert main(["eval", "-m", str(run)]) == 0
    run_experiment(digits(), "train", run)  # the original command is not refused


LOCK_HOLDER = textwrap.dedent("""
    import sys, time
    import cadence
    from cadence.task.config_files import load_config

    class Slow(cadence.Callback):
        def on_loop_end(self, state, logs):
            time.sleep(0.3)

    config = load_config("digits", overrides=sys.argv[2:])
    cadence.run_experiment(config, "train", sys.argv[1], callbacks=[Slow()])
""")
HOLDER = ["trainer.train_steps=100000", "trainer.steps_per_loop=5", "trainer.checkpoint_interval=5",
          "task.model.hidden_sizes=[8]"]


@pytest.mark.slow
def test_two_trainers_in_one_run_directory_the_second_refuses_naming_the_first(tmp_path):
    run = tmp_path / "run"
    script = tmp_path / "holder.py"
    script.write_text(LOCK_HOLDER)
    holder = subprocess.Popen([sys.executable, str(script), str(run), *HOLDER],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoints" / "ckpt-5").is_dir():
            assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
            time.sleep(0.05)
        with pytest.raises(cadence.core.run_dir.RunLockedError,
                           match=rf"is in use: process {holder.pid} .*holder.py.* is training"):
            run_experiment(load_config("digits", overrides=HOLDER), "train", run)
        _, logs = run_experiment(load_config("digits", overrides=HOLDER), "eval", run)
        assert 0.0 <= logs["accuracy"] <= 1.0  # evaluation runs beside the trainer
    finally:
        holder.kill()
        holder.communicate()
    run_experiment(load_config("digits", overrides=HOLDER), "train", run,
                   callbacks=[StopAfterOneLoop()])  # a killed holder's lock: taken over


class StopAfterOneLoop(cadence.Callback):
    def on_loop_end(self, state, logs):
        state.request_stop("test")


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, caplog):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.lock").write_text(json.dumps({"pid": int(dead.stdout), "command": "old"}))
    with caplog.at_level(logging.WARNING, logger="cadence"):
        run_experiment(digits(), "train", run)
    assert f"held by process {int(dead.stdout)} (old)" in caplog.text
    assert "no longer running" in caplog.text
    assert checkpoint_steps(run) == [10, 20]


def test_a_second_lock_on_a_run_directory_in_one_process_is_refused(tmp_path):
    first = cadence.core.run_dir.RunDirectory(tmp_path)
    with first.training_lock(), pytest.raises(cadence.core.run_dir.RunLockedError,
                                              match=f"process {os.getpid()}"):
        cadence.core.run_dir.RunLock(first.lock_file).acquire()
    with first.training_lock():  # released: taken again
        pass


# ---------------------------------------------------------------------------- a full disk


class DiskFullIO:
    """The default writer, until told to fail: then it writes part of the file and fails as a
    full disk does."""

    def __init__(self, tmp_path):
        self.inner = cadence.CheckpointManager({}, tmp_path / "unused").io
        self.verified_files = getattr(self.inner, "verified_files", ())
        self.fail = False

    def save(self, payload, directory):
        if self.fail:
            (directory / "state.part").write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.inner.save(payload, directory)

    def load(self, directory):
        return self.inner.load(directory)


class Net(cadence.Module):
    def __init__(self, width):
        super().__init__()
        self.model = nn.Linear(width, width)


@pytest.mark.parametrize("fault", ["enospc-writer", "tmpfs"])
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_full_disk_says_so_names_the_newest_good_checkpoint_and_logs_no_save(
        tmp_path, caplog, fault, async_save):
    io = DiskFullIO(tmp_path)
    with contextlib.ExitStack() as stack:
        directory = (stack.enter_context(small_tmpfs(tmp_path / "disk")) if fault == "tmpfs"
                     else tmp_path / "disk")
        manager = cadence.CheckpointManager(Net(8), directory, io=io, async_save=async_save)
        manager.save(1)
        manager.wait()
        io.fail = fault == "enospc-writer"
        big = Net(300)  # ~360 kB of weights: more than the tmpfs holds
        manager = cadence.CheckpointManager(big, directory, io=io, async_save=async_save)
        with caplog.at_level(logging.INFO, logger="cadence"), pytest.raises(
                cadence.StorageError) as raised:
            manager.save(2)
            manager.wait()
        message = str(raised.value)
        assert "No space left on device" in message
        assert f"The newest good checkpoint is {directory / 'ckpt-1'} (step 1)" in message
        assert "Saved checkpoint" not in caplog.text.split("ckpt-1")[-1]  # nothing after ckpt-1
        assert [c.step for c in manager.checkpoints] == [1]
        assert sorted(p.name for p in directory.iterdir()) == ["ckpt-1"]  # nothing half-written
        cadence.CheckpointManager(Net(8), directory).restore(directory / "ckpt-1")


def test_an_async_save_failure_through_the_controller_is_never_logged_as_saved(
        tmp_path, caplog):
    io = DiskFullIO(tmp_path)
    runner = Net(4)

    class Steps:
        global_step = 0

        def train(self, num_steps):
            self.global_step += num_steps
            if self.global_step >= 4:
                manager.wait()  # ckpt-2 is committed; the disk fills up now
                io.fail = True
            return {}

    trainer = Steps()
    manager = cadence.CheckpointManager({"model": runner.model}, tmp_path, io=io,
                                        checkpoint_interval=2, async_save=True)
    controller = cadence.Controller(trainer=trainer, steps_per_loop=2,
                                    checkpoint_manager=manager)
    with caplog.at_level(logging.INFO, logger="cadence"), pytest.raises(
            cadence.StorageError, match=r"No space left on device.* newest good checkpoint is "
            r".*ckpt-2 \(step 2\)"):
        controller.train(10)
        manager.wait()
    saved = [line for line in caplog.text.splitlines() if "Saved checkpoint" in line]
    assert all("ckpt-2" in line for line in saved) and saved  # never the failed ckpt-4
    assert [c.step for c in manager.checkpoints] == [2]



# ------------------------------------------------------- a real full disk during a whole run


class FillAt(cadence.Callback):
    """Fills the disk of `directory` as the loop that ends at `step` ends: before that step's
    evaluation, best export and checkpoint."""

    def __init__(self, directory, step):
        self.directory, self.step, self.ballast = directory, step, None

    def on_loop_end(self, state, logs):
        if state.global_step == self.step and self.ballast is None:
            self.ballast = fill(self.directory)


WHAT = {
    "sync save": r"Saving checkpoint ckpt-20",
    # whichever meets the full disk first: the background write, or the summaries of the loop
    # that runs meanwhile (the next save waits for the background write and says its failure)
    "background save": r"(Writing checkpoint ckpt-20 in the background|Writing the summaries "
                       r"to '[^']*/train')",
    "best export": r"Exporting the weights of step 20 to '[^']*/best'",
    "summaries": r"Writing the summaries to '[^']*/train'",
    "final save": r"Saving checkpoint ckpt-30",
    "final background save": r"Writing checkpoint ckpt-30 in the background",
}
FULL_DISK_RUNS = [
    # (where, mode, fill after the loop to, settings)
    ("sync save", "train", 20, ["trainer.train_steps=40", "trainer.async_checkpoints=false"]),
    ("background save", "train", 20, ["trainer.train_steps=40",
                                      "trainer.async_checkpoints=true"]),
    ("best export", "train_and_eval", 20, ["trainer.train_steps=40",
                                           "trainer.best_checkpoint_max_to_keep=3"]),
    ("summaries", "train", 10, ["trainer.train_steps=5000", "trainer.checkpoint_interval=5000"]),
    ("final save", "train", 30, ["trainer.train_steps=30", "trainer.async_checkpoints=false"]),
    ("final background save", "train", 30, ["trainer.train_steps=30",
                                            "trainer.async_checkpoints=true"]),
]


@pytest.mark.parametrize(("where", "mode", "at", "settings"), FULL_DISK_RUNS,
                         ids=[case[0] for case in FULL_DISK_RUNS])
def test_a_real_full_disk_during_a_run_is_one_storage_error_and_the_same_call_resumes(
        tmp_path, caplog, where, mode, at, settings):
    """A run on a small tmpfs whose disk fills up as a loop ends, before a given writer's turn:
    one `StorageError` of one line naming what failed and the newest good checkpoint; nothing
    half-written listed; once the space is freed, the same call resumes from that checkpoint."""
    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        run = disk / "run"
        config = digits(*settings)
        filler = FillAt(disk, at)
        with caplog.at_level(logging.WARNING, logger="cadence"), pytest.raises(
                cadence.StorageError) as raised:
            run_experiment(config, mode, run, callbacks=[filler])
        message = str(raised.value)
        newest = [s for s in checkpoint_steps(run) if s < at] if (run / "checkpoints").is_dir() \
            else []
        said = (f"The newest good checkpoint is {run / 'checkpoints' / f'ckpt-{newest[-1]}'} "
                f"\\(step {newest[-1]}\\)" if newest else "There is no good checkpoint yet")
        assert "\n" not in message and re.fullmatch(
            rf"{WHAT[where]} failed: No space left on device\. {said}: free some space, then run "
            r"the same command again\.", message), message
        assert caplog.text.count("Could not write the run's timeline") <= 1  # silent after
        assert open_files_under(disk) == []  # every writer closed, also on the full disk
        # Nothing half-written is listed: every checkpoint directory is a complete one, and the
        # best exports' ledger lists exports that are whole.
        manager = cadence.CheckpointManager({}, run / "checkpoints", read_only=True)
        assert [p.name for p in sorted((run / "checkpoints").iterdir())] == [
            c.path.name for c in manager.checkpoints] if (run / "checkpoints").is_dir() else True
        if (run / "best").is_dir():
            exporter = cadence.BestCheckpointExporter(run / "best", "accuracy", "higher", 3)
            names = {p.name for p in (run / "best").iterdir()}
            assert names == {e["path"] for e in exporter.best_exports} | {"info.json"}
            for entry in exporter.best_exports:
                read_weights(run / "best" / entry["path"])  # whole: its checksum holds
        filler.ballast.unlink()  # the space is freed: the same call resumes
        _, _ = run_experiment(config, mode, run, callbacks=[filler])
        assert checkpoint_steps(run)[-1] == config.trainer.train_steps
        restored = [json.loads(line) for line in
                    (run / "timeline" / "run.jsonl").read_text().splitlines()
                    if '"restore_end"' in line][-1]
        assert restored["step"] == (newest[-1] if newest else 0)


@pytest.mark.parametrize("fault", ["full disk", "read-only"])
def test_the_command_line_on_a_real_failing_disk_is_one_line_exit_1_and_resumes(
        tmp_path, capsys, monkeypatch, fault):
    """``cadence train`` on a tmpfs that fills up by itself in the middle of the run (a ballast
    leaves room for one checkpoint and a best export, not two), or that turns read-only after
    the first checkpoint: one line, exit 1 (the environment's, not a user's mistake), the newest
    good checkpoint named; the same command resumes once space is freed."""
    monkeypatch.chdir(tmp_path)
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        command = ["train", "-m", "disk/run", "--no-progress", "--set", "trainer.train_steps=60",
                   "--set", "trainer.steps_per_loop=10", "--set", "trainer.checkpoint_interval=10",
                   "--set", "trainer.validation_interval=10", "--set", "trainer.max_to_keep=1"]
        if fault == "full disk":
            ballast = fill(disk, leave=1200 * 1024)
            status = main(command)
        else:
            assert main([*command[:2], "disk/run", *command[3:], "--set",
                         "trainer.train_steps=10"]) == 0
            with read_only(disk):
                status = main([*command, "--allow-config-change"])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 1 and not any("Traceback" in line for line in err), err
        said = re.fullmatch(r"cadence: error: .* failed: (No space left on device|Read-only file "
                            r"system)\. The newest good checkpoint is disk/run/checkpoints/ckpt-"
                            r"(\d+) \(step \d+\): (free some space|use a writable file system), "
                            r"then run the same command again\.", err[-1])
        assert said, err
        newest = int(said.group(2))
        assert checkpoint_steps(disk / "run") == [newest]
        if fault == "full disk":
            ballast.unlink()
        assert main([*command, "--allow-config-change"]) == 0
        assert f"Restored disk/run/checkpoints/ckpt-{newest}" in capsys.readouterr().err
        assert checkpoint_steps(disk / "run") == [60]
