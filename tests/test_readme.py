"""The README's examples run as written, and its commands are the ones CI runs."""

import json
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).parent.parent / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def run(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), namespace)
    return namespace


def test_the_task_example_trains_evaluates_and_exports(tmp_path, monkeypatch, capsys):
    (code,) = [block for block in python_blocks() if "cadence.Task" in block]
    namespace = run(code, tmp_path, monkeypatch)
    assert namespace["logs"]["accuracy"] > 0.9
    assert capsys.readouterr().out.startswith("validation accuracy 0.9")  # it says it worked
    assert (tmp_path / "runs/blobs/best/info.json").is_file()
    assert (tmp_path / "runs/blobs/checkpoints/ckpt-300").is_dir()
    again = run(code, tmp_path, monkeypatch)  # a second time: finished, the same logs
    assert again["logs"] == namespace["logs"]
    assert capsys.readouterr().out.startswith("validation accuracy 0.9")


def test_the_orbit_example_trains_and_resumes(tmp_path, monkeypatch, capsys):
    (code,) = [block for block in python_blocks() if "cadence.StandardTrainer" in block]
    namespace = run(code, tmp_path, monkeypatch)
    assert namespace["trainer"].global_step == 200
    assert capsys.readouterr().out == (
        "trained to step 200; newest checkpoint: runs/demo/ckpt/ckpt-200\n")
    checkpoints = {p.name for p in (tmp_path / "runs/demo/ckpt").iterdir()}
    assert checkpoints == {"ckpt-50", "ckpt-100", "ckpt-150", "ckpt-200"}
    again = run(code, tmp_path, monkeypatch)  # the same program resumes: nothing to train
    assert again["trainer"].global_step == 200
    assert (tmp_path / "runs/demo/train/metrics.jsonl").read_text().count("\n") == 8


def test_the_train_loop_and_tensorpack_examples_each_run_alone_and_resume(tmp_path, monkeypatch,
                                                                       capsys):
    loop_code = next(b for b in python_blocks() if "cadence.TrainLoop" in b)
    tensorpack_code = next(b for b in python_blocks() if "cadence.ModelDesc" in b)
    namespace = run(loop_code, tmp_path, monkeypatch)
    assert namespace["loop"].epoch == 5 and namespace["loop"].best_valid_metric is not None
    assert "[Epoch 5/5, Step 40" in capsys.readouterr().out
    run(tensorpack_code, tmp_path, monkeypatch)  # alone: the block is self-contained
    assert (tmp_path / "runs/regression/checkpoints/ckpt-80").is_dir()
    assert (tmp_path / "runs/regression/minsaver-validation_loss/info.json").is_file()
    run(tensorpack_code, tmp_path, monkeypatch)  # resumes: nothing left
    stats = (tmp_path / "runs/regression/stats.jsonl").read_text().splitlines()
    assert len(stats) == 5


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^    (python3 -m venv .*)$", README.read_text(), re.M)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (README.parent / ".ci" / "run").read_text()


def eval_records(run):
    """The training-time evaluation records of `run`, by step."""
    lines = (run / "eval" / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record for record in map(json.loads, lines)}


def reported_accuracy(capsys):
    out = capsys.readouterr().out
    return float(re.search(r"^Evaluation: accuracy=([0-9.]+)", out, re.M).group(1))


def test_the_task_as_a_module_of_one_s_own_runs_from_the_command_line(tmp_path, monkeypatch,
                                                                      capsys, user_modules):
    """The task block (without its last lines, which run it) and the experiment block are
    `mymodels.py`; the commands below them train, resume and evaluate it."""
    from cadence.task.cli import main

    (task,) = [block for block in python_blocks() if "cadence.Task" in block]
    (experiment,) = [block for block in python_blocks() if "register_experiment" in block]
    (tmp_path / "mymodels.py").write_text(task.split("\nconfig = ")[0] + "\n\n" + experiment)
    assert "cadence train -e mymodels:my_experiment\n" in README.read_text()  # quick start
    monkeypatch.chdir(tmp_path)
    fast = ["--no-progress", "--set", "trainer.train_steps=20", "--set",
            "trainer.steps_per_loop=10", "--set", "trainer.validation_interval=10"]
    assert main(["train", "-e", "mymodels:my_experiment", "-m", "runs/mine", *fast]) == 0
    assert main(["train", "-m", "runs/mine", "--no-progress", "--set", "trainer.train_steps=30",
                 "--allow-config-change"]) == 0
    assert (tmp_path / "runs/mine/checkpoints/ckpt-30").is_dir()
    # Each evaluation reports what the run recorded for the weights it reads (the experiment
    # evaluates an EMA of the weights: the chosen weights are evaluated, not a fresh average).
    records = eval_records(tmp_path / "runs/mine")
    best = json.loads((tmp_path / "runs/mine/best/info.json").read_text())["exports"][0]
    capsys.readouterr()
    assert main(["eval", "-m", "runs/mine", "--checkpoint", "best"]) == 0
    assert reported_accuracy(capsys) == pytest.approx(best["value"], abs=1e-6)
    assert main(["eval", "-m", "runs/mine"]) == 0  # the newest checkpoint: step 30's weights
    assert reported_accuracy(capsys) == pytest.approx(records[30]["accuracy"], abs=1e-6)
    # the training-time records stay; the evaluations' are added, naming their weights
    after = [json.loads(line) for line in
             (tmp_path / "runs/mine/eval/metrics.jsonl").read_text().splitlines()]
    assert after[:len(records)] == list(records.values())
    assert [r["checkpoint"] for r in after[len(records):]] == [
        f"runs/mine/best/{best['path']}", "runs/mine/checkpoints/ckpt-30"]
    # `cadence export` writes the weights those evaluations read: the EMA average
    assert main(["export", "runs/mine", "--out", "exported"]) == 0
    assert "the EMA weights (what the run evaluates) of step 30" in capsys.readouterr().out
    from safetensors.torch import load_file

    from cadence.engine.exporter import read_weights

    exported = load_file(str(tmp_path / "exported/model.safetensors"))
    ema = read_weights(tmp_path / "runs/mine/checkpoints/ckpt-30", "ema")
    assert exported.keys() == ema.keys()
    assert all(torch.equal(exported[name], ema[name]) for name in ema)
    for command in ("cadence train -e mymodels:my_experiment -m runs/mine",
                    "cadence train -m runs/mine --set trainer.train_steps=600 "
                    "--allow-config-change", "cadence eval -m runs/mine --checkpoint best"):
        assert command in README.read_text()
