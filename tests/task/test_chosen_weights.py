"""`cadence eval --checkpoint best|latest|PATH` and ``run_experiment(..., checkpoint=...)``:
evaluate the weights you choose, at their step."""

import json

import pytest

from cadence.core.errors import ConfigError
from cadence.task.cli import main
from cadence.task.config_files import load_config
from cadence.task.train_lib import run_experiment

FAST = ["trainer.train_steps=40", "trainer.steps_per_loop=10", "trainer.checkpoint_interval=20",
        "trainer.validation_interval=20", "task.model.hidden_sizes=[32]",
        "trainer.optimizer_config.learning_rate.warmup_steps=0",
        "trainer.best_checkpoint_eval_metric=accuracy"]


def digits():
    return load_config("digits", overrides=FAST)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run evaluated at steps 20 and 40, its best export at one of them."""
    run = tmp_path_factory.mktemp("chosen") / "run"
    _, logs = run_experiment(digits(), "train_and_eval", run)
    records = [json.loads(line) for line in (run / "eval" / "metrics.jsonl").read_text()
               .splitlines()]
    return run, {record["step"]: record for record in records}, logs


def last_record(run):
    return json.loads((run / "eval" / "metrics.jsonl").read_text().splitlines()[-1])


def test_a_checkpoint_path_is_evaluated_at_its_step_not_the_newest(trained):
    run, during_training, _ = trained
    _, logs = run_experiment(digits(), "eval", run,
                             checkpoint=str(run / "checkpoints" / "ckpt-20"))
    assert logs["accuracy"] == during_training[20]["accuracy"]  # the weights of step 20
    assert last_record(run)["step"] == 20
    _, logs = run_experiment(digits(), "eval", run, checkpoint="latest")
    assert logs["accuracy"] == during_training[40]["accuracy"] and last_record(run)["step"] == 40


def test_the_best_export_is_evaluated_at_the_step_it_was_exported(trained):
    run, during_training, logs_of_training = trained
    best = json.loads((run / "best" / "info.json").read_text())["exports"][0]
    _, logs = run_experiment(digits(), "eval", run, checkpoint="best")
    assert logs["accuracy"] == during_training[best["step"]]["accuracy"] == \
        logs_of_training["best_accuracy"]
    assert last_record(run)["step"] == best["step"]


def test_the_command_line_takes_the_same_choices(trained, capsys):
    run = trained[0]
    assert main(["eval", "-m", str(run), "--checkpoint", "best"]) == 0
    ckpt_20 = str(run / "checkpoints" / "ckpt-20")
    assert main(["eval", "-m", str(run), "--checkpoint", ckpt_20]) == 0
    assert last_record(run)["step"] == 20
    assert main(["eval", "-m", str(run), "--checkpoint", str(run / "nothing-here")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("cadence: error: --checkpoint ") and "does not exist" in err


def test_best_without_a_best_export_and_a_choice_outside_eval_are_refused(tmp_path):
    run = tmp_path / "run"
    run_experiment(load_config("digits", overrides=[*FAST[:-1], "trainer.train_steps=20"]),
                   "train", run)
    with pytest.raises(ConfigError, match="has no best export"):
        run_experiment(digits(), "eval", run, checkpoint="best")
    with pytest.raises(ConfigError, match="is for mode 'eval'"):
        run_experiment(digits(), "continuous_eval", run, checkpoint="latest")


EMA = [*FAST, "trainer.ema.enabled=true", "trainer.ema.decay=0.9"]


@pytest.fixture(scope="module")
def trained_with_ema(tmp_path_factory):
    """A run that evaluates an EMA of its weights, at steps 20 and 40."""
    run = tmp_path_factory.mktemp("ema") / "run"
    run_experiment(load_config("digits", overrides=EMA), "train_and_eval", run)
    records = [json.loads(line) for line in (run / "eval" / "metrics.jsonl").read_text()
               .splitlines()]
    return run, {record["step"]: record for record in records}


@pytest.mark.parametrize("choice", ["best", "best-folder", "safetensors", "ckpt-20", "latest"])
def test_chosen_weights_of_a_run_with_an_ema_are_evaluated_as_training_evaluated_them(
        trained_with_ema, choice):
    """The weights a file holds are evaluated: an export holds the average training evaluated,
    which a freshly built model's average (its initial weights) must not stand in for."""
    run, during_training = trained_with_ema
    best = json.loads((run / "best" / "info.json").read_text())["exports"][0]
    path, step = {"best": ("best", best["step"]),
                  "best-folder": (str(run / "best"), best["step"]),
                  "safetensors": (str(run / "best" / best["path"] / "model.safetensors"),
                                  best["step"]),
                  "ckpt-20": (str(run / "checkpoints" / "ckpt-20"), 20),
                  "latest": ("latest", 40)}[choice]
    _, logs = run_experiment(load_config("digits", overrides=EMA), "eval", run, checkpoint=path)
    assert logs["accuracy"] == during_training[step]["accuracy"]
    assert last_record(run)["step"] == step
