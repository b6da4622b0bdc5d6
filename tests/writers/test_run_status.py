"""How a run ended, as MLflow (its run status) and W&B (its exit code) record it: FINISHED / 0
for a run that completed, FAILED / 1 for a crash or a divergence, KILLED / 128 + the signal for
a preemption. Read back with MLflow's client and from W&B's offline files."""

import os
import signal

import pytest
from fakes import CountingTrainer
from tracking_readers import mlflow_run, wandb_runs

import cadence
from cadence.core.controller import Controller
from cadence.core.errors import DivergenceError, Preempted
from cadence.core.summary import SummaryManager
from cadence.task.config_files import load_config
from cadence.task.train_lib import run_experiment
from cadence.writers.shared_run import Outcome, exit_code

pytestmark = pytest.mark.usefixtures("local_mlflow", "offline_wandb")

FAST = ["trainer.train_steps=40", "trainer.steps_per_loop=10", "trainer.checkpoint_interval=20",
        "trainer.validation_interval=20", "task.model.hidden_sizes=[16]",
        "runtime.writers=[jsonl,mlflow,wandb]"]

ENDINGS = [  # the exception a run ends with -> MLflow's status, W&B's exit code
    (None, "FINISHED", 0),
    (RuntimeError("a bug"), "FAILED", 1),
    (DivergenceError("the training loss diverged"), "FAILED", 1),
    (Preempted(signal.SIGTERM, "ckpt-20"), "KILLED", 143),
    (KeyboardInterrupt("Training interrupted"), "KILLED", 130),  # Ctrl-C in a notebook
]


@pytest.mark.parametrize(("error", "status", "code"), ENDINGS,
                         ids=["completed", "crash", "divergence", "preempted", "interrupted"])
def test_the_outcome_given_to_close_is_the_mlflow_status_and_the_wandb_exit_code(
        tmp_path, error, status, code):
    run_dir = tmp_path / "run"
    writers = ["mlflow", "wandb"]
    train = SummaryManager(run_dir / "train", writers=writers, run_dir=run_dir)
    evaluation = SummaryManager(run_dir / "eval", writers=writers, run_dir=run_dir)
    train.write_summaries({"loss": 1.0}, step=10)
    evaluation.write_summaries({"accuracy": 0.5}, step=10)
    train.close(error)
    evaluation.close(error)
    assert Outcome.of(error).status == status and exit_code(error) == code
    _, run = mlflow_run(run_dir)
    assert run.info.status == status
    (wandb_run,) = wandb_runs(run_dir)
    assert wandb_run["exit_code"] == code


def test_a_failure_stays_whichever_writer_of_the_run_closes_last(tmp_path):
    train = SummaryManager(tmp_path / "train", writers=["mlflow"], run_dir=tmp_path)
    evaluation = SummaryManager(tmp_path / "eval", writers=["mlflow"], run_dir=tmp_path)
    train.write_summaries({"loss": 1.0}, step=10)
    evaluation.write_summaries({"accuracy": 0.5}, step=10)
    train.close(RuntimeError("a bug"))
    evaluation.close()  # an eval manager closed without the error still ends a failed run
    _, run = mlflow_run(tmp_path)
    assert run.info.status == "FAILED"


class Diverging(CountingTrainer):
    def train(self, num_steps):
        logs = super().train(num_steps)
        if self.global_step >= 20:
            raise DivergenceError("the training loss diverged")
        return logs


def test_a_controller_gives_its_writers_the_exception_its_entry_point_raises(tmp_path):
    controller = Controller(trainer=Diverging(), steps_per_loop=10, summary_dir=str(tmp_path),
                            writers=["mlflow", "wandb"])
    with pytest.raises(DivergenceError):
        controller.train(40)
    _, run = mlflow_run(tmp_path)
    assert run.info.status == "FAILED"
    assert wandb_runs(tmp_path)[0]["exit_code"] == 1

    resumed = Controller(trainer=CountingTrainer(), steps_per_loop=10,
                         summary_dir=str(tmp_path), writers=["mlflow"])
    resumed.train(20)  # the same MLflow run, running again, then finished
    _, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED"


class Signal(cadence.Callback):
    """Sends this process `signum` once `step` is reached, as a scheduler or Ctrl-C would."""

    def __init__(self, step, signum=signal.SIGTERM):
        self.step, self.signum = step, signum

    def on_loop_end(self, state, logs):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def test_a_task_run_is_killed_by_sigterm_failed_by_divergence_and_finished_when_resumed(
        tmp_path):
    config = load_config("digits", overrides=FAST)
    preempted = tmp_path / "preempted"
    with pytest.raises(Preempted) as stop:
        run_experiment(config, "train_and_eval", preempted, progress_bar=False,
                       callbacks=[Signal(20)])
    assert stop.value.code == 143
    _, run = mlflow_run(preempted)
    assert run.info.status == "KILLED"
    assert wandb_runs(preempted)[0]["exit_code"] == 143

    run_experiment(config, "train_and_eval", preempted, progress_bar=False)  # resumes, finishes
    _, resumed = mlflow_run(preempted)
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    assert [r["exit_code"] for r in wandb_runs(preempted)] == [143, 0]

    diverging = load_config("digits", overrides=[*FAST, "trainer.loss_upper_bound=1e-9"])
    with pytest.raises(DivergenceError):
        run_experiment(diverging, "train", tmp_path / "diverged", progress_bar=False)
    _, run = mlflow_run(tmp_path / "diverged")
    assert run.info.status == "FAILED"
    assert wandb_runs(tmp_path / "diverged")[0]["exit_code"] == 1
