"""Every mistake on the command line is one clear line -- ``cadence: error: <the problem and the
fix>`` -- and exit status 2: never a traceback, never a silent success, never a misleading
message. Each case is a mistake a user made."""

import re

import pytest
import torch

import cadence
from cadence.task.cli import build_parser, main
from cadence.task.config import ExperimentConfig
from cadence.task.experiments.digits import digits_experiment
from cadence.task.registry import register_experiment

FAST = ["--no-progress", "--set", "trainer.train_steps=20", "--set", "trainer.steps_per_loop=10",
        "--set", "trainer.validation_interval=10", "--set", "trainer.checkpoint_interval=10",
        "--set", "task.model.hidden_sizes=[16]"]


def one_clear_line(capsys, argv):
    """Runs the command; returns its error line after checking it is the only one."""
    status = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2, err
    assert len(err) >= 1 and err[-1].startswith("cadence: error: "), err
    assert "Traceback" not in "\n".join(err)
    return err[-1]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file.txt").write_text("not a run")
    (tmp_path / "a_dir").mkdir()
    return tmp_path


TRAIN_MISTAKES = [
    # (the mistake, arguments after `train`, what the one line must say)
    ("no steps", ["--set", "trainer.train_steps=0"], r"trainer.train_steps is 0: set it"),
    ("-m names a file", ["-m", "a_file.txt"], r"--model-dir 'a_file.txt' is a file"),
    ("a device that does not parse", ["--set", "runtime.device=gpu0"],
     r"runtime.device 'gpu0' is not a device.*Use 'auto', 'cpu'"),
    ("a seed that does not parse", ["--set", "runtime.seed=abc"],
     r"runtime.seed.*could not be converted to Integer"),
    ("an optimizer argument it does not take",
     ["--set", "trainer.optimizer_config.optimizer.kwargs={bogus: 1}"],
     r"AdamW rejected .*'bogus'.*Fix trainer.optimizer_config.optimizer.kwargs"),
    ("a hidden layer of width 0", ["--set", "task.model.hidden_sizes=[0]"],
     r"task.model.hidden_sizes \(got \[0\]\) must be >= 1"),
    ("a typo in the best metric", ["--set", "trainer.best_checkpoint_eval_metric=acc"],
     r"best_checkpoint_eval_metric \(got 'acc'\) is not a metric DigitsTask reports; it "
     r"reports: accuracy, validation_loss"),
    ("a batch larger than the dataset", ["--set", "task.train_data.global_batch_size=5000"],
     r"task.train_data.global_batch_size \(got 5000\) is larger than the data \(1438 "
     r"examples\).*at most 1438"),
    ("a validation batch larger than the validation set, remainder dropped",
     ["--set", "task.validation_data.global_batch_size=5000",
      "--set", "task.validation_data.drop_remainder=true"],
     r"task.validation_data.global_batch_size \(got 5000\) is larger than the data"),
    ("a config file that is a directory", ["-c", "a_dir"], r"'a_dir' is a directory"),
    ("negative decay_steps", ["--set", "trainer.optimizer_config.learning_rate.decay_steps=-5"],
     r"decay_steps: must be a positive integer or null \(null: until trainer.train_steps\) "
     r"\(got -5\)"),
    ("negative loss_upper_bound", ["--set", "trainer.loss_upper_bound=-1"],
     r"trainer.loss_upper_bound: must be >= 0"),
    ("an init checkpoint that does not exist", ["--set", "task.init_checkpoint=no/such"],
     r"task.init_checkpoint 'no/such' does not exist"),
    ("an init checkpoint that is not weights", ["--set", "task.init_checkpoint=a_file.txt"],
     r"task.init_checkpoint 'a_file.txt' is a file but not a .safetensors file"),
    ("one invalid value", ["--set", "trainer.steps_per_loop=-1"],
     r"Invalid config: trainer.steps_per_loop: must be a positive integer \(got -1\)"),
]


@pytest.mark.parametrize(("mistake", "argv", "says"), TRAIN_MISTAKES,
                         ids=[case[0] for case in TRAIN_MISTAKES])
def test_a_training_mistake_is_one_clear_line_and_leaves_no_run_behind(capsys, workdir, mistake,
                                                                       argv, says):
    line = one_clear_line(capsys, ["train", *FAST, *argv])
    assert re.search(says, line), line
    runs = workdir / "runs"
    assert not runs.exists() or not list(runs.iterdir())  # nothing to refuse the fix later


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_one_clear_line_and_the_corrected_command_then_runs(capsys,
                                                                               workdir):
    line = one_clear_line(capsys, ["train", *FAST, "-m", "run", "--set", "runtime.device=cuda"])
    assert "runtime.device is 'cuda' but CUDA is not available here" in line
    assert not (workdir / "run").exists()
    assert main(["train", *FAST, "-m", "run"]) == 0  # not refused as "a different config"


def test_a_char_lm_without_layers_is_one_clear_line(capsys, workdir):
    line = one_clear_line(capsys, ["train", "-e", "char_lm", *FAST[:9],
                                   "--set", "task.model.num_layers=0"])
    assert "task.model.num_layers (got 0) must be >= 1" in line


def test_a_different_config_is_refused_in_one_line_that_lists_the_differences(capsys, workdir):
    assert main(["train", *FAST, "-m", "run"]) == 0
    capsys.readouterr()
    line = one_clear_line(capsys, ["train", *FAST, "-m", "run", "--set",
                                   "task.model.dropout=0.3"])
    assert "task.model.dropout: 0.1 -> 0.3" in line and "--allow-config-change" in line


def test_invalid_yaml_is_one_line_with_where(capsys, workdir):
    (workdir / "bad.yaml").write_text("trainer: [1,\n")
    line = one_clear_line(capsys, ["train", *FAST, "-c", "bad.yaml"])
    assert "'bad.yaml' is not valid YAML" in line and "line 2" in line


# ---------------------------------------------------------------------------- evaluation


def test_eval_of_a_directory_without_checkpoints_is_an_error_not_untrained_weights(capsys,
                                                                                   workdir):
    (workdir / "empty").mkdir()
    line = one_clear_line(capsys, ["eval", "-m", "empty"])
    assert "'empty' has no checkpoint to evaluate" in line
    assert not (workdir / "empty" / "best").exists()  # nothing exported as "best"


def test_eval_of_the_runs_folder_names_the_runs_in_it(capsys, workdir):
    assert main(["train", *FAST, "-m", "runs/first"]) == 0
    capsys.readouterr()
    line = one_clear_line(capsys, ["eval", "-m", "runs"])
    assert "It holds run directories (runs/first): pass one of them." in line


def test_eval_of_a_file_says_it_is_a_file(capsys, workdir):
    assert "is a file" in one_clear_line(capsys, ["eval", "-m", "a_file.txt"])


# ------------------------------------------------------------------ --help tells the truth


@register_experiment("tiny_digits")
def tiny_digits() -> ExperimentConfig:
    """Digits, small (a test experiment)."""
    config = digits_experiment()
    config.task.model.hidden_sizes = [16]
    return config


def test_train_without_experiment_resumes_the_experiment_the_run_directory_records(capsys,
                                                                                   workdir):
    help_text = " ".join(build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
                         .choices["train"].format_help().split())
    assert "default: the one recorded in the run directory that --model-dir names" in help_text
    assert main(["train", "-e", "tiny_digits", *FAST[:9], "-m", "run"]) == 0
    assert main(["train", *FAST[:9], "-m", "run", "--set", "trainer.train_steps=30",
                 "--allow-config-change"]) == 0
    assert "Experiment tiny_digits" in capsys.readouterr().err
    config = cadence.load_config(config_files=[workdir / "run" / "params.yaml"])
    assert config.experiment == "tiny_digits" and config.trainer.train_steps == 30
