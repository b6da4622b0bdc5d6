"""How a tensorpack run (`launch_train_with_config`) ended, as MLflow (its run status) and W&B
(its exit code) record it: FINISHED / 0 when it completed, FAILED / 1 after a crash, KILLED / 143
after SIGTERM. Read back with MLflow's client and from W&B's offline files."""

import os
import signal

import numpy as np
import pytest
from fakes import LinearRegression
from tracking_readers import mlflow_run, wandb_runs

import cadence
from cadence.data.dataflow import DataFlow
from cadence.tensorpack import SimpleTrainer, TrainConfig, launch_train_with_config

pytestmark = pytest.mark.usefixtures("local_mlflow", "offline_wandb")


class CrashAtEpoch(cadence.Callback):
    def __init__(self, epoch):
        self.epoch = epoch

    def on_epoch_end(self, state):
        if state.epoch == self.epoch:
            raise ZeroDivisionError("a bug in a callback")


def launch(logdir, callbacks=()):
    x = np.random.RandomState(0).randn(12, 3).astype("float32")
    config = TrainConfig(model=LinearRegression(), dataflow=DataFlow.arrays([x, x[:, :1]], 6),
                         max_epoch=3, callbacks=list(callbacks), logdir=logdir,
                         extra_callbacks=[], writers=["jsonl", "mlflow", "wandb"])
    launch_train_with_config(config, SimpleTrainer())


def assert_ended(run_dir, status, code):
    _, run = mlflow_run(run_dir)
    assert run.info.status == status
    assert wandb_runs(run_dir)[-1]["exit_code"] == code


def test_a_completed_tensorpack_run_is_finished_with_exit_code_0(tmp_path):
    launch(tmp_path)
    assert_ended(tmp_path, "FINISHED", 0)


def test_a_crashed_tensorpack_run_is_failed_with_exit_code_1(tmp_path):
    with pytest.raises(ZeroDivisionError):
        launch(tmp_path, callbacks=[CrashAtEpoch(2)])
    assert_ended(tmp_path, "FAILED", 1)


class SigtermAtEpoch(cadence.Callback):
    def __init__(self, epoch):
        self.epoch = epoch

    def on_epoch_end(self, state):
        if state.epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_preempted_tensorpack_run_is_killed_with_exit_code_143(tmp_path):
    with pytest.raises(cadence.Preempted):
        launch(tmp_path, callbacks=[SigtermAtEpoch(1)])
    assert_ended(tmp_path, "KILLED", 143)
