"""How a `TrainLoop` run ended, as MLflow (its run status) and W&B (its exit code) record it:
FINISHED / 0 when it completed, FAILED / 1 after a crash or a divergence (`LossGuard`), KILLED /
143 after SIGTERM. Read back with MLflow's client and from W&B's offline files."""

import os
import signal

import pytest
from torch import nn
from tracking_readers import mlflow_run, wandb_runs

import cadence
from cadence.callbacks.loss_guard import LossGuard
from cadence.core.errors import DivergenceError

pytestmark = pytest.mark.usefixtures("local_mlflow", "offline_wandb")


def run_loop(run_dir, fail_at=None, signal_at=None, callbacks=()):
    with cadence.TrainLoop(nn.Linear(1, 1), max_epoch=2, summary_dir=run_dir,
                           writers=["jsonl", "mlflow", "wandb"], checkpoint_dir=run_dir / "ckpt",
                           callbacks=callbacks, print_func=lambda line: None) as loop:
        for _ in loop.iter_epochs():
            for step, _ in loop.iter_steps([1, 2, 3]):
                loop.collect_metrics(loss=float(step))
                if step == fail_at:
                    raise ZeroDivisionError("a bug in the step")
                if step == signal_at:
                    os.kill(os.getpid(), signal.SIGTERM)
            loop.print_logs()


def assert_ended(run_dir, status, code):
    _, run = mlflow_run(run_dir)
    assert run.info.status == status
    assert wandb_runs(run_dir)[-1]["exit_code"] == code


def test_a_completed_train_loop_is_finished_with_exit_code_0(tmp_path):
    run_loop(tmp_path)
    assert_ended(tmp_path, "FINISHED", 0)


def test_a_crashed_train_loop_is_failed_with_exit_code_1(tmp_path):
    with pytest.raises(ZeroDivisionError):
        run_loop(tmp_path, fail_at=4)
    assert_ended(tmp_path, "FAILED", 1)


def test_a_diverged_train_loop_is_failed(tmp_path):
    with pytest.raises(DivergenceError):
        run_loop(tmp_path, callbacks=[LossGuard(key="loss", upper_bound=1.0)])
    assert_ended(tmp_path, "FAILED", 1)


def test_a_sigtermed_train_loop_is_killed_with_exit_code_143_and_finished_when_resumed(
        tmp_path):
    with pytest.raises(cadence.Preempted):  # in epoch 2, after epoch 1 was logged
        run_loop(tmp_path, signal_at=5)
    assert_ended(tmp_path, "KILLED", 143)
    run_loop(tmp_path)  # resumes from the checkpoint: the same MLflow run, finished
    assert_ended(tmp_path, "FINISHED", 0)
