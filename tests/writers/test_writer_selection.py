"""Choosing metric writers: ``runtime.writers`` in a config, ``writers=`` of the Controller,
TrainLoop and tensorpack's TrainConfig. The config goes to MLflow and W&B as hyper-parameters;
a resumed run keeps its MLflow and W&B run; only rank 0 writes; mistakes are clear errors."""

import csv
import sys

import numpy as np
import pytest
import torch
from fakes import CountingEvaluator, CountingTrainer, LinearRegression
from torch import nn
from tracking_readers import metric_history, mlflow_run, wandb_runs

from cadence.core.controller import Controller
from cadence.core.errors import ConfigError
from cadence.core.summary import SummaryManager
from cadence.data.dataflow import DataFlow
from cadence.task.cli import main
from cadence.task.config_files import load_config
from cadence.task.train_lib import run_experiment
from cadence.tensorpack import SimpleTrainer, TrainConfig, launch_train_with_config
from cadence.tfsnippet.train_loop import TrainLoop

FAST = ["trainer.train_steps=40", "trainer.steps_per_loop=10", "trainer.checkpoint_interval=20",
        "trainer.validation_interval=20", "task.model.hidden_sizes=[16]"]


def csv_steps(path):
    with open(path, newline="") as handle:
        return [int(row["step"]) for row in csv.DictReader(handle)]


@pytest.mark.usefixtures("local_mlflow", "offline_wandb")
def test_runtime_writers_choose_where_a_digits_run_writes_and_a_resume_keeps_its_runs(tmp_path):
    writers = "runtime.writers=[csv,mlflow,wandb]"
    run_experiment(load_config("digits", overrides=[*FAST, writers]), "train_and_eval", tmp_path)

    assert not list(tmp_path.rglob("events.out.tfevents.*"))  # TensorBoard was not chosen
    assert not list(tmp_path.rglob("metrics.jsonl"))
    assert csv_steps(tmp_path / "train" / "metrics.csv") == [10, 20, 30, 40]
    assert csv_steps(tmp_path / "eval" / "metrics.csv") == [20, 40]
    client, run = mlflow_run(tmp_path)
    assert client.get_experiment(run.info.experiment_id).name == "digits"  # the experiment
    assert [s for s, _ in metric_history(client, run, "train/training_loss")] == [10, 20, 30, 40]
    assert [s for s, _ in metric_history(client, run, "eval/accuracy")] == [20, 40]
    assert run.data.params["trainer.train_steps"] == "40"  # the final config, flattened
    assert run.data.params["task.model.hidden_sizes"] == "[16]"
    assert run.data.params["runtime.writers"] == "['csv', 'mlflow', 'wandb']"
    (wandb_run,) = wandb_runs(tmp_path)
    assert wandb_run["project"] == "digits" and wandb_run["config"]["trainer.train_steps"] == 40
    assert [row["global_step"] for row in wandb_run["history"]
            if "eval/accuracy" in row] == [20, 40]

    longer = load_config("digits", overrides=[*FAST, writers, "trainer.train_steps=60"])
    run_experiment(longer, "train_and_eval", tmp_path, allow_config_change=True)
    client, resumed = mlflow_run(tmp_path)
    assert resumed.info.run_id == run.info.run_id
    assert [s for s, _ in metric_history(client, resumed, "eval/accuracy")] == [20, 40, 60]
    first, second = wandb_runs(tmp_path)
    assert first["id"] == second["id"] == wandb_run["id"]
    assert csv_steps(tmp_path / "train" / "metrics.csv") == [10, 20, 30, 40, 50, 60]


def test_an_unknown_writer_is_a_config_error_that_lists_the_valid_ones(tmp_path, monkeypatch,
                                                                      capsys):
    with pytest.raises(ConfigError, match="runtime.writers: unknown writer 'mlfow'; valid: "
                                          "tensorboard, jsonl, csv, mlflow, wandb."):
        load_config("digits", overrides=["runtime.writers=[tensorboard,mlfow]"])
    with pytest.raises(ConfigError, match="runtime.wandb.mode: must be null, 'online', "):
        load_config("digits", overrides=["runtime.wandb.mode=ofline"])
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--no-progress", "--set", "runtime.writers=[mlfow]"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("cadence: error: ") and "unknown writer 'mlfow'" in error
    assert not (tmp_path / "runs").exists()


def test_a_writer_whose_library_is_missing_is_a_config_error_and_leaves_nothing(
        tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    config = load_config("digits", overrides=[*FAST, "runtime.writers=[mlflow]"])
    with pytest.raises(ConfigError, match=r"runtime.writers: .*pip install 'cadence\[mlflow\]'"):
        run_experiment(config, "train", tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("local_mlflow")
def test_the_controller_writes_train_and_eval_summaries_to_one_mlflow_run(tmp_path):
    trainer = CountingTrainer()
    controller = Controller(trainer=trainer, evaluator=CountingEvaluator(trainer),
                            steps_per_loop=5, summary_dir=str(tmp_path / "train"),
                            eval_summary_dir=str(tmp_path / "eval"), writers=["csv", "mlflow"])
    controller.train_and_evaluate(train_steps=10, eval_steps=1, eval_interval=10)
    client, run = mlflow_run(tmp_path)  # kept in the parent of the two directories
    assert run.info.status == "FINISHED"  # the entry point closed its writers
    assert metric_history(client, run, "train/loss") == [(5, 0.2), (10, 0.1)]
    assert metric_history(client, run, "train/nested/value") == [(5, 5.0), (10, 5.0)]
    assert metric_history(client, run, "eval/accuracy") == [(10, 0.5)]
    assert csv_steps(tmp_path / "eval" / "metrics.csv") == [10]
    with pytest.raises(ValueError, match="Unknown metric writer 'jsonlines'; known: "):
        Controller(trainer=trainer, steps_per_loop=5, summary_dir=str(tmp_path),
                   writers=["jsonlines"])


def test_a_train_loop_writes_its_summaries_with_the_writers_given(tmp_path):
    with TrainLoop(nn.Linear(2, 1), max_epoch=2, summary_dir=tmp_path, writers=["csv"],
                   print_func=lambda line: None) as loop:
        for _ in loop.iter_epochs():
            for _ in loop.iter_steps([1, 2]):
                loop.collect_metrics(loss=torch.tensor(1.0))
            loop.print_logs()
    assert csv_steps(tmp_path / "metrics.csv") == [2, 4]
    assert not list(tmp_path.glob("events.out.tfevents.*"))
    with pytest.raises(ValueError, match="Unknown metric writer"):
        TrainLoop(nn.Linear(2, 1), summary_dir=tmp_path, writers=["nope"])


@pytest.mark.usefixtures("local_mlflow")
def test_tensorpack_default_monitors_write_with_the_train_config_writers(tmp_path):
    x = np.random.RandomState(0).randn(12, 3).astype("float32")
    flow = DataFlow.arrays([x, x[:, :1]], 6)
    config = TrainConfig(model=LinearRegression(), dataflow=flow, max_epoch=2, logdir=tmp_path,
                         extra_callbacks=[], writers=["csv", "mlflow"])
    launch_train_with_config(config, SimpleTrainer())
    assert csv_steps(tmp_path / "train" / "metrics.csv") == [2, 4]
    client, run = mlflow_run(tmp_path)  # one MLflow run per logdir
    assert [s for s, _ in metric_history(client, run, "train/cost")] == [2, 4]
    with pytest.raises(ValueError, match="Unknown metric writer"):
        TrainConfig(model=LinearRegression(), dataflow=flow, writers=["nope"])


@pytest.mark.usefixtures("local_mlflow", "offline_wandb")
def test_a_process_other_than_rank_zero_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    run_dir = tmp_path / "run"
    train = SummaryManager(run_dir / "train", writers=["csv", "mlflow", "wandb"], run_dir=run_dir)
    train.write_hparams({"trainer": {"train_steps": 40}})
    train.write_summaries({"loss": 1.0}, step=10)
    train.close()
    assert not run_dir.exists()  # no table, no MLflow store or run, no W&B files


def test_every_front_end_refuses_a_writer_it_does_not_know_the_same_way(tmp_path, monkeypatch):
    from cadence.callbacks import TFEventWriter

    builders = [lambda writers: SummaryManager(tmp_path, writers=writers),
                lambda writers: Controller(trainer=CountingTrainer(), steps_per_loop=1,
                                           summary_dir=str(tmp_path), writers=writers),
                lambda writers: TrainLoop(nn.Linear(2, 1), summary_dir=tmp_path,
                                          writers=writers),
                lambda writers: TFEventWriter(writers=writers)]
    for build in builders:
        with pytest.raises(ValueError, match="Unknown metric writer 'tb'; known: tensorboard"):
            build(["tb"])
        with pytest.raises(TypeError, match=r"must be a list of writers, e.g. \['csv'\]"):
            build("csv")
        with pytest.raises(TypeError, match="A writer \\(got int\\) must be a name"):
            build([3])
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'cadence\[wandb\]'"):
        builders[1](["wandb"])
