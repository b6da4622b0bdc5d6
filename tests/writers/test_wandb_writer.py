"""The ``wandb`` writer: a cadence run is one W&B run -- train and eval values against the global
step, the config as W&B config -- resumed (same run id) when cadence resumes. Offline; read back
from the run's ``.wandb`` files."""

import json
import sys

import pytest
from tracking_readers import wandb_runs

from cadence.core.summary import SummaryManager

pytestmark = pytest.mark.usefixtures("offline_wandb")


def run_summaries(run_dir):
    """The train and eval managers of a run directory, as the Task front-end builds them."""
    return (SummaryManager(run_dir / "train", writers=["wandb"], run_dir=run_dir),
            SummaryManager(run_dir / "eval", writers=["wandb"], run_dir=run_dir))


def test_train_and_eval_summaries_are_one_wandb_run_against_the_global_step(tmp_path):
    run_dir = tmp_path / "digits-1"
    train, evaluation = run_summaries(run_dir)
    train.write_hparams({"trainer": {"train_steps": 40}, "task": {"hidden_sizes": [32]}})
    train.write_summaries({"training_loss": 2.0}, step=10)
    train.write_summaries({"training_loss": 1.0}, step=20)
    evaluation.write_summaries({"accuracy": 0.8, "per_class": {"cat": 0.7}}, step=20)
    train.close()
    evaluation.close()

    (run,) = wandb_runs(run_dir)  # wandb's files are in the run directory
    assert run["id"] == json.loads((run_dir / "wandb_run.json").read_text())["id"]
    assert run["name"] == "digits-1"
    assert run["config"] == {"trainer.train_steps": 40, "task.hidden_sizes": [32]}
    assert run["history"] == [{"global_step": 10, "train/training_loss": 2.0},
                              {"global_step": 20, "train/training_loss": 1.0},
                              {"global_step": 20, "eval/accuracy": 0.8},
                              {"global_step": 20, "eval/per_class/cat": 0.7}]


def test_a_resumed_run_resumes_the_same_wandb_run_and_keeps_the_steps_logged_again(tmp_path):
    train, _ = run_summaries(tmp_path)
    train.write_summaries({"loss": 3.0}, step=10)
    train.write_summaries({"loss": 2.0}, step=20)
    train.close()
    resumed, _ = run_summaries(tmp_path)  # a new process resumes from the checkpoint of step 10
    resumed.write_summaries({"loss": 1.9}, step=20)
    resumed.close()

    first, second = wandb_runs(tmp_path)  # offline, each resumption has its own files
    assert first["id"] == second["id"]
    # The global step is a value of each row, not wandb's step: a step that goes back is kept.
    assert [row["global_step"] for row in first["history"] + second["history"]] == [10, 20, 20]


def test_the_project_and_files_directory_come_from_arguments(tmp_path):
    from functools import partial

    from cadence.writers.wandb import WandbWriter

    writer = partial(WandbWriter, project="cadence-tests", dir=tmp_path / "wandb-files",
                     name="try 2")
    manager = SummaryManager(tmp_path / "run", writers=[writer])
    manager.write_summaries({"loss": 1.0}, step=1)
    manager.close()
    (run,) = wandb_runs(tmp_path / "wandb-files")
    assert (run["project"], run["name"]) == ("cadence-tests", "try 2")
    assert json.loads((tmp_path / "run" / "wandb_run.json").read_text())["id"] == run["id"]


def test_without_wandb_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'cadence\[wandb\]'"):
        SummaryManager(tmp_path, writers=["wandb"])
