"""The ``mlflow`` writer: a cadence run is one MLflow run -- train and eval values side by side,
the config as params -- resumed when cadence resumes. Read back with MLflow's own client."""

import json
import logging
import sys
from functools import partial

import pytest
from tracking_readers import metric_history, mlflow_run

from cadence.core.summary import SummaryManager
from cadence.writers.mlflow import MLflowWriter

pytestmark = pytest.mark.usefixtures("local_mlflow")


def run_summaries(run_dir, writers=("mlflow",)):
    """The train and eval managers of a run directory, as the Task front-end builds them."""
    return (SummaryManager(run_dir / "train", writers=writers, run_dir=run_dir),
            SummaryManager(run_dir / "eval", writers=writers, run_dir=run_dir))


def test_train_and_eval_summaries_are_one_mlflow_run_named_by_directory(tmp_path):
    run_dir = tmp_path / "digits-1"
    train, evaluation = run_summaries(run_dir)
    train.write_hparams({"trainer": {"train_steps": 40, "optimizer": {"name": "adamw"}},
                         "task": {"hidden_sizes": [32, 16]}, "init_checkpoint": None})
    train.write_summaries({"training_loss": 2.0, "learning_rate": 0.1}, step=10)
    train.write_summaries({"training_loss": 1.0, "learning_rate": 0.1}, step=20)
    evaluation.write_summaries({"accuracy": 0.8, "per_class": {"cat": 0.7}}, step=20,
                               extra={"checkpoint": "ckpt-20"})
    train.close()
    evaluation.close()

    client, run = mlflow_run(run_dir)
    assert run.info.run_name == "digits-1" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "Default"
    assert metric_history(client, run, "train/training_loss") == [(10, 2.0), (20, 1.0)]
    assert metric_history(client, run, "eval/accuracy") == [(20, 0.8)]
    assert metric_history(client, run, "eval/per_class/cat") == [(20, 0.7)]  # nested logs
    assert run.data.params == {"trainer.train_steps": "40", "trainer.optimizer.name": "adamw",
                               "task.hidden_sizes": "[32, 16]", "init_checkpoint": "None"}
    assert (tmp_path / "mlruns").is_dir()  # the default store is next to the run directory
    assert not (run_dir / "mlruns").exists()


def test_a_resumed_run_logs_to_the_same_mlflow_run(tmp_path):
    run_dir = tmp_path / "run"
    train, _ = run_summaries(run_dir)
    train.write_summaries({"loss": 3.0}, step=10)
    train.write_summaries({"loss": 2.0}, step=20)
    train.close()
    first_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]

    resumed, _ = run_summaries(run_dir)  # a new process resumes from the checkpoint of step 10
    resumed.write_summaries({"loss": 1.9}, step=20)
    resumed.write_summaries({"loss": 1.0}, step=30)
    resumed.close()
    client, run = mlflow_run(run_dir)
    assert run.info.run_id == first_id and run.info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    # MLflow keeps both values of the step logged again after the rewind.
    assert metric_history(client, run, "train/loss") == [(10, 3.0), (20, 2.0), (20, 1.9),
                                                         (30, 1.0)]


def test_a_param_that_changed_on_resume_keeps_its_first_value_and_a_warning_says_so(
        tmp_path, caplog):
    first, _ = run_summaries(tmp_path)
    first.write_hparams({"train_steps": 40, "seed": 1})
    first.close()
    resumed, _ = run_summaries(tmp_path)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        resumed.write_hparams({"train_steps": 60, "seed": 1, "new": "yes"})
    resumed.close()
    _, run = mlflow_run(tmp_path)
    assert run.data.params == {"train_steps": "40", "seed": "1", "new": "yes"}
    assert "train_steps: 40 -> 60" in caplog.text


def test_the_runs_of_a_folder_meet_in_one_store_next_to_them(tmp_path):
    runs = tmp_path / "runs"
    for name, loss in (("digits-1", 1.0), ("digits-2", 0.5)):
        given = partial(MLflowWriter, experiment_name="digits", run_dir=runs / name)
        manager = SummaryManager(runs / name / "train", writers=[given])
        manager.write_summaries({"loss": loss}, step=10)
        manager.close()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{runs / 'mlruns'}")  # what `mlflow ui` opens
    experiment = client.get_experiment_by_name("digits")
    found = client.search_runs([experiment.experiment_id], order_by=["attributes.run_name"])
    assert [(r.info.run_name, r.data.metrics) for r in found] == [
        ("digits-1", {"train/loss": 1.0}), ("digits-2", {"train/loss": 0.5})]
    assert mlflow_run(runs / "digits-1")[0].tracking_uri == f"file:{runs / 'mlruns'}"


def test_a_run_started_in_its_own_store_resumes_there(tmp_path):
    run_dir = tmp_path / "run"
    own = partial(MLflowWriter, tracking_uri=f"file:{run_dir / 'mlruns'}")  # as cadence did
    manager = SummaryManager(run_dir, writers=[own])
    manager.write_summaries({"loss": 1.0}, step=10)
    manager.close()
    resumed = SummaryManager(run_dir, writers=["mlflow"])  # no store given: the recorded one
    resumed.write_summaries({"loss": 0.5}, step=20)
    resumed.close()
    client, run = mlflow_run(run_dir)
    assert metric_history(client, run, "loss") == [(10, 1.0), (20, 0.5)]
    assert not (tmp_path / "mlruns").exists()


def test_the_store_and_experiment_come_from_arguments_else_mlflows_environment_variables(
        tmp_path, monkeypatch):
    server = tmp_path / "shared-store"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{server}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    manager = SummaryManager(tmp_path / "run", writers=["mlflow"])
    manager.write_summaries({"loss": 1.0}, step=1)
    manager.close()
    client, run = mlflow_run(tmp_path / "run")
    assert client.get_experiment(run.info.experiment_id).name == "from-env"
    assert server.is_dir() and not (tmp_path / "run" / "mlruns").exists()

    given = partial(MLflowWriter, tracking_uri=f"file:{tmp_path / 'given'}",
                    experiment_name="digits", run_name="first try")
    manager = SummaryManager(tmp_path / "other", writers=[given])
    manager.write_summaries({"loss": 1.0}, step=1)
    manager.close()
    client, run = mlflow_run(tmp_path / "other")
    assert client.get_experiment(run.info.experiment_id).name == "digits"
    assert run.info.run_name == "first try"


def test_a_recorded_run_the_store_does_not_have_starts_a_new_one_with_a_warning(
        tmp_path, caplog):
    (tmp_path / "mlflow_run.json").write_text(json.dumps({"run_id": "0" * 32}))
    manager = SummaryManager(tmp_path, writers=["mlflow"])
    with caplog.at_level(logging.WARNING, logger="cadence"):
        manager.write_summaries({"loss": 1.0}, step=1)
    manager.close()
    _, run = mlflow_run(tmp_path)
    assert run.info.run_id != "0" * 32
    assert "starting a new MLflow run" in caplog.text


def test_names_mlflow_refuses_are_made_valid(tmp_path):
    manager = SummaryManager(tmp_path, writers=["mlflow"])
    manager.write_summaries({"top@5": 0.5, "loss[0]": 1.0}, step=1)
    manager.close()
    _, run = mlflow_run(tmp_path)
    assert run.data.metrics == {"top_5": 0.5, "loss_0_": 1.0}


def test_without_mlflow_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'cadence\[mlflow\]'"):
        SummaryManager(tmp_path, writers=["mlflow"])
    assert not tmp_path.joinpath("mlflow_run.json").exists()


def test_a_summary_directory_outside_the_run_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not inside `run_dir`"):
        MLflowWriter(tmp_path / "elsewhere", run_dir=tmp_path / "run")
