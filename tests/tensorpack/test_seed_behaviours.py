"""tensorpack's callback behaviours that its users rely on (seed 003), each checked as the
seed's own tests and docs describe it: plateau decay, checkpoints kept every n hours, the ETA's
median or mean, trigger-only callbacks, PeriodicCallback's step hooks, one log line per epoch."""

import logging

import pytest
import torch
from torch import nn

import cadence
from cadence.callbacks import (
    EnableCallbackIf,
    EstimatedTimeLeft,
    ModelSaver,
    PeriodicCallback,
    PeriodicTrigger,
    ScalarPrinter,
    StatMonitorParamSetter,
    savers,
    stats,
)
from cadence.core.callbacks import CallbackList, RunState
from cadence.core.checkpoint_dir import read_manifest
from cadence.core.clock import RunClock
from cadence.core.errors import MissingMetricError
from cadence.core.eta import ETA
from cadence.tensorpack import SimpleTrainer


def make_trainer(logdir=None, batches=4):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    x = torch.randn(8 * batches, 2)
    y = x.sum(1, keepdim=True)
    trainer = SimpleTrainer(logdir)
    data = [(x[i:i + 8], y[i:i + 8]) for i in range(0, len(x), 8)]
    trainer.setup_graph(data, lambda xb, yb: nn.functional.mse_loss(model(xb), yb),
                        lambda params: torch.optim.SGD(params, lr=0.1), model=model)
    return trainer


class Put(cadence.Callback):
    """Writes a fixed sequence of values of a metric, one per epoch."""

    def __init__(self, name, values):
        self.name, self.values = name, list(values)
        self.provides = (name,)

    def on_epoch_end(self, state):
        state.metrics[self.name] = self.values[state.epoch - 1]


class LearningRates(cadence.Callback):
    """Records the optimizer's learning rate at each epoch's end."""

    def __init__(self):
        self.seen = []

    def on_epoch_end(self, state):
        self.seen.append(round(state.trainer.optimizer.param_groups[0]["lr"], 6))


# ------------------------------------------------------------------- StatMonitorParamSetter


def test_tensorpack_stat_monitor_param_setter_decays_on_plateau():
    """``min(last k) >= first - threshold``: decay, and the history starts again."""
    errors = [5, 4, 4, 4, 4, 3, 3, 3]
    lrs = LearningRates()
    setter = StatMonitorParamSetter("learning_rate", "val-error", lambda lr: lr * 0.5,
                                    threshold=0.0, last_k=3)
    trainer = make_trainer()
    trainer.train(callbacks=[Put("val-error", errors), setter, lrs], steps_per_epoch=1,
                  max_epoch=len(errors))
    # (5, 4, 4) fell; (4, 4, 4) is a plateau: decay at epoch 4, then (4, 3, 3) fell and
    # (3, 3, 3) is a plateau again: decay at epoch 8.
    assert lrs.seen == [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.025]
    assert trainer.state.metrics["learning_rate"] == pytest.approx(0.025)
    assert list(setter.history) == []  # cleared by the decay


def test_tensorpack_stat_monitor_param_setter_reverse_threshold_and_resume():
    """``reverse``: a metric that does not rise by more than `threshold` is a plateau; nothing
    is set before training; the history is saved, so a resumed run counts on."""
    lrs = LearningRates()
    setter = StatMonitorParamSetter("learning_rate", "accuracy", lambda lr: lr / 10,
                                    threshold=0.05, last_k=2, reverse=True)
    trainer = make_trainer()
    trainer.train(callbacks=[Put("accuracy", [0.5, 0.7, 0.72]), setter, lrs],
                  steps_per_epoch=1, max_epoch=3)
    assert lrs.seen == [0.1, 0.1, 0.01]  # 0.7 -> 0.72 rose less than 0.05
    saved = setter.state_dict()
    restored = StatMonitorParamSetter("learning_rate", "accuracy", lambda lr: lr,
                                      threshold=0.0, last_k=2)
    restored.load_state_dict({"history": [[3, 0.72]]})
    assert list(restored.history) == [(3, 0.72)] and saved == {"history": []}
    with pytest.raises(ValueError, match=r"`last_k` \(got 0\) must be a positive int"):
        StatMonitorParamSetter("learning_rate", "accuracy", lambda lr: lr, 0.0, last_k=0)


def test_tensorpack_stat_monitor_param_setter_missing_stat_lists_the_metrics():
    setter = StatMonitorParamSetter("learning_rate", "val-error", lambda lr: lr, 0.0, 2)
    with pytest.raises(MissingMetricError, match="'val-error', which is not among the metrics "
                                                 r"\(cost"):
        make_trainer().train(callbacks=[setter], steps_per_epoch=1, max_epoch=1)


# ---------------------------------------------------------------------------- ModelSaver


def test_tensorpack_model_saver_keeps_a_checkpoint_every_n_hours(tmp_path, monkeypatch):
    """TF's ``keep_checkpoint_every_n_hours``: besides the newest `max_to_keep`, the first
    checkpoint saved in each period of n hours is kept forever."""
    trainer = make_trainer(tmp_path)
    monkeypatch.setattr(savers, "_clock", lambda: trainer.global_step * 1800.0)  # 30 min a step
    trainer.train(callbacks=[ModelSaver(max_to_keep=1, keep_checkpoint_every_n_hours=1)],
                  steps_per_epoch=1, max_epoch=5)
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["ckpt-5", "kept"]
    kept = checkpoints / "kept"
    assert sorted(p.name for p in kept.iterdir()) == ["ckpt-2", "ckpt-4"]
    assert read_manifest(kept / "ckpt-2")["step"] == 2  # whole, and its files check out
    resumed = make_trainer(tmp_path)
    resumed.train(callbacks=[ModelSaver(max_to_keep=1)], steps_per_epoch=1, max_epoch=5)
    assert resumed.global_step == 5  # resumes from ckpt-5, never from a kept one


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), True, "0.5"])
def test_tensorpack_model_saver_refuses_a_period_that_is_not_a_positive_number(bad):
    with pytest.raises(ValueError, match=r"^ModelSaver: `keep_checkpoint_every_n_hours` "
                                         r"\(got .*\) must be a positive number of hours"):
        ModelSaver(keep_checkpoint_every_n_hours=bad)


# ---------------------------------------------------------------------------- EstimatedTimeLeft


@pytest.mark.parametrize(("median", "expected"), [(True, 13.0), (False, 41.0)])
def test_tensorpack_estimated_time_left_from_the_median_or_the_mean(monkeypatch, median,
                                                                    expected):
    """Three epochs of 10 steps took 10 s, 100 s and 13 s: 10 steps are left, at the median
    (1.3 s) or the mean (4.1 s) time per step."""
    times = iter([0.0, 10.0, 10.0, 110.0, 110.0, 123.0])
    monkeypatch.setattr(stats.time, "perf_counter", lambda: next(times))
    eta = EstimatedTimeLeft(last_k_epochs=3, median=median)
    state = RunState(target_step=40)
    clock = RunClock(state)
    for epoch in range(3):
        clock.set_global_step(10 * epoch)
        eta.on_epoch_begin(state)
        clock.set_global_step(10 * epoch + 10)
        eta.on_epoch_end(state)
    assert state.metrics["eta_seconds"] == pytest.approx(expected)
    assert ETA(window=2, median=False).median is False


# ---------------------------------------------------------------------------- trigger


class Trigger(cadence.Callback):
    """Implements only ``trigger`` (tensorpack's usual custom callback)."""

    def __init__(self):
        self.at = []

    def trigger(self, state):
        self.at.append(state.global_step)

    def state_dict(self):
        return {"at": list(self.at)}


def test_tensorpack_callback_with_only_trigger_runs_at_each_epoch_end():
    """tensorpack's ``Callback._trigger_epoch`` calls ``trigger()`` by default, also inside
    ``EnableCallbackIf``; ``PeriodicTrigger`` still replaces it with its own schedule."""
    plain, gated, stepped = Trigger(), Trigger(), Trigger()
    trainer = make_trainer()
    trainer.train(callbacks=[plain, EnableCallbackIf(gated, lambda state: state.epoch >= 2),
                             PeriodicTrigger(stepped, every_k_steps=3)],
                  steps_per_epoch=4, max_epoch=3)
    assert plain.at == [4, 8, 12]
    assert gated.at == [8, 12]
    assert stepped.at == [3, 6, 9, 12]


# ---------------------------------------------------------------------------- PeriodicCallback


def test_tensorpack_periodic_callback_step_end_fires_after_steps_k_2k():
    """``PeriodicCallback(every_k_steps=k)``: ``trigger_step`` after steps k, 2k, ...
    (``global_step % k == 0`` after the step), ``before_run`` before the steps starting at a
    multiple of k; the last epoch is special only for ``every_k_epochs``."""
    calls = []

    class Steps(cadence.Callback):
        def on_step_begin(self, state):
            calls.append(("begin", state.global_step))

        def on_step_end(self, state):
            calls.append(("end", state.global_step))

    trainer = make_trainer()
    trainer.train(callbacks=[PeriodicCallback(Steps(), every_k_steps=3)], steps_per_epoch=4,
                  max_epoch=2)
    assert calls == [("begin", 0), ("end", 3), ("begin", 3), ("end", 6), ("begin", 6)]


# ---------------------------------------------------------------------------- logging


def test_tensorpack_trainer_logs_each_epochs_scalars_once(caplog):
    """tensorpack prints an epoch's scalars through its ``ScalarPrinter`` monitor only; the
    Controller's loop line is left out while a tensorpack trainer trains."""
    trainer = make_trainer()
    with caplog.at_level(logging.INFO):
        trainer.train(callbacks=[], monitors=[ScalarPrinter()], steps_per_epoch=2,
                      max_epoch=3)
    lines = [r.getMessage() for r in caplog.records if "cost" in r.getMessage()]
    assert len(lines) == 3 and all(line.startswith("epoch ") for line in lines), lines
    assert not logging.getLogger("cadence.loop").filters  # left as it was


def test_tensorpack_seed_callbacks_add_nothing_per_step():
    trainer = make_trainer()
    trainer.register_callback(Trigger())  # triggered at each epoch's end, not per step
    callbacks = CallbackList([
        *trainer.callbacks,
        StatMonitorParamSetter("learning_rate", "x", lambda lr: lr, 0.0, 2),
        ModelSaver(keep_checkpoint_every_n_hours=0.5), EstimatedTimeLeft(median=False),
        EnableCallbackIf(Trigger(), lambda state: True),
        PeriodicCallback(Trigger(), every_k_epochs=2)])
    assert not callbacks.has_step_hooks
