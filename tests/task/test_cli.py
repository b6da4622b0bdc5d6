"""The `cadence` command: train, eval, experiments, config; Ctrl-C saves, rerunning resumes."""

import os
import signal
import subprocess
import sys
import time

import pytest

from cadence.task.cli import main
from cadence.task.config_files import load_config

FAST = ["--set", "trainer.train_steps=40", "--set", "trainer.steps_per_loop=10",
        "--set", "trainer.validation_interval=20", "--set", "trainer.checkpoint_interval=20"]


def test_help_is_light_it_imports_neither_torch_nor_the_config_library():
    code = ("import sys; from cadence.task.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'omegaconf') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_experiments_lists_the_registered_ones_and_marks_the_default(capsys):
    assert main(["experiments"]) == 0
    out = capsys.readouterr().out
    assert "digits (default)" in out and "char_lm\n" in out and "char_lm_large" in out


def test_every_command_says_what_it_does_and_the_digits_figure_is_the_readme_s(capsys):
    import re
    from pathlib import Path

    from cadence.task.cli import build_parser

    commands = next(action for action in build_parser()._actions
                    if action.dest == "command").choices
    assert [name for name, parser in commands.items() if not parser.description] == []
    assert "best export" in commands["eval"].format_help()  # not the newest checkpoint only
    assert main(["experiments"]) == 0
    listed = re.search(r"~(\d+)% validation accuracy", capsys.readouterr().out).group(1)
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert f"about {listed}% validation accuracy" in readme


def test_config_prints_the_final_config_which_reloads_exactly(capsys, tmp_path):
    assert main(["config", "-e", "char_lm", "--set", "trainer.train_steps=5"]) == 0
    path = tmp_path / "printed.yaml"
    path.write_text(capsys.readouterr().out)
    assert load_config(config_files=[path]) == load_config(
        "char_lm", overrides=["trainer.train_steps=5"])


def test_a_bad_key_is_one_clear_error_and_exit_status_2(capsys):
    assert main(["config", "--set", "trainer.stesp=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: --set trainer.stesp=3: unknown key 'trainer.stesp'.")
    assert "Did you mean 'trainer.steps_per_loop'" in err or "Valid keys" in err


def test_train_makes_a_run_directory_and_eval_finds_the_newest_run(capsys, tmp_path,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *FAST]) == 0
    runs = sorted((tmp_path / "runs").iterdir())
    assert [r.name.startswith("digits-") for r in runs] == [True]
    out = capsys.readouterr().out
    assert "Best export: step" in out and "model.safetensors" in out
    assert main(["eval"]) == 0  # the newest run, with the config it was trained with
    assert "Evaluation: accuracy=" in capsys.readouterr().out
    assert main(["train", *FAST]) == 0  # that run is finished: a new one starts
    assert len(list((tmp_path / "runs").iterdir())) == 2


def test_eval_without_runs_says_what_to_pass(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval"]) == 2
    assert "No run of 'digits' under runs/: pass --model-dir." in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(600)  # two commands of up to 120 and 300 s
def test_ctrl_c_saves_a_checkpoint_and_the_same_command_resumes(tmp_path):
    command = [sys.executable, "-m", "cadence", "train", "--no-progress",
               "--set", "trainer.train_steps=4000", "--set", "trainer.checkpoint_interval=200",
               "--set", "trainer.validation_interval=1000",
               "--set", "task.model.hidden_sizes=[16]"]
    # One intra-op thread: a tiny model's steps, with torch's threads contending with the
    # other processes of a loaded 2-core machine, ran at 6 a second instead of 300.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("runs/*/checkpoints/ckpt-200")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "Received SIGINT: stopping after this step and saving a checkpoint." in err
    assert "Run the same command again to resume." in err
    (run,) = (tmp_path / "runs").iterdir()
    stopped_at = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir())
    assert 200 <= stopped_at < 4000

    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    resuming = f"Resuming {os.path.join('runs', run.name)} (step {stopped_at} of 4000)"
    assert resuming in again.stderr
    assert f"Restored {os.path.join('runs', run.name)}" in again.stderr
    assert (run / "checkpoints" / "ckpt-4000").is_dir()
    assert len(list((tmp_path / "runs").iterdir())) == 1


def test_eval_of_a_directory_that_does_not_exist_is_an_error_not_random_weights(capsys,
                                                                                tmp_path):
    assert main(["eval", "--model-dir", str(tmp_path / "typo")]) == 2
    assert "does not exist: pass the directory of a run" in capsys.readouterr().err


def test_train_m_run_continues_the_run_as_it_was_configured(capsys, tmp_path, monkeypatch):
    """The run's params.yaml is the base: the --sets it was started with are not repeated; a
    --set on top is a config change."""
    monkeypatch.chdir(tmp_path)
    started = [*FAST, "--set", "trainer.train_steps=20", "--set", "task.model.hidden_sizes=[16]",
               "--set", "trainer.optimizer_config.optimizer.learning_rate=0.01"]
    assert main(["train", "-m", "run", "--no-progress", *started]) == 0
    capsys.readouterr()
    assert main(["train", "-m", "run", "--no-progress"]) == 0  # as configured: nothing to do
    assert "Evaluation: accuracy=" in capsys.readouterr().out
    assert main(["train", "-m", "run", "--set", "trainer.train_steps=40"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "cadence: error: 'run' holds a run with a different config (trainer.train_steps: "
        "20 -> 40):")  # that one key, nothing the run was started with
    assert main(["train", "-m", "run", "--no-progress", "--set", "trainer.train_steps=40",
                 "--allow-config-change"]) == 0
    config = load_config(config_files=[tmp_path / "run" / "params.yaml"])
    assert config.trainer.train_steps == 40 and config.task.model.hidden_sizes == [16]
    assert config.trainer.optimizer_config.optimizer.learning_rate == 0.01
