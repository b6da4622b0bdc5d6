"""A callback that implements only `trigger` (tensorpack's usual custom callback) is triggered
at each epoch's end, as tensorpack's ``Callback._trigger_epoch`` does by default: one rule, in
`CallbackList`, so under the Controller, `TrainLoop` and the tensorpack trainers alike. A
scheduling wrapper around it decides instead, without a second trigger."""

import pytest
from fakes import TinyClassifier, make_loader
from torch import nn

import cadence
from cadence.callbacks import EnableCallbackIf, PeriodicCallback, PeriodicTrigger
from cadence.callbacks.scheduling import triggers_only as from_scheduling
from cadence.core.callbacks import CallbackList, RunState, overridden_hooks, triggers_only
from cadence.tfsnippet.train_loop import TrainLoop


class Trigger(cadence.Callback):
    """Implements only ``trigger``."""

    def __init__(self):
        self.at = []

    def trigger(self, state):
        self.at.append((state.epoch, state.global_step))


class TriggerAndBegin(Trigger):
    """tensorpack triggers at the epoch's end whatever other hooks a callback has."""

    def on_train_begin(self, state):
        self.at.append("begin")


class OwnEpochEnd(Trigger):
    """Calls `trigger` from its own ``on_epoch_end``: triggered there once, not twice."""

    def on_epoch_end(self, state):
        self.trigger(state)


def test_trigger_only_callback_triggers_at_epoch_end_as_tensorpack_under_controller():
    plain, begin, own = Trigger(), TriggerAndBegin(), OwnEpochEnd()
    trainer = TinyClassifier(make_loader(n=16, batch_size=8))  # 2 steps an epoch
    controller = cadence.Controller(trainer=trainer, steps_per_loop=3,
                                    callbacks=[plain, begin, own])
    controller.train(6)
    assert plain.at == [(1, 2), (2, 4), (3, 6)]
    assert begin.at == ["begin", (1, 2), (2, 4), (3, 6)]
    assert own.at == plain.at
    assert not controller.callbacks.has_step_hooks  # nothing added per step


def test_trigger_only_callback_triggers_at_epoch_end_as_tensorpack_under_train_loop():
    plain = Trigger()
    with TrainLoop(nn.Linear(2, 1), max_epoch=3, callbacks=[plain],
                   print_func=lambda line: None) as loop:
        for _ in loop.iter_epochs():
            for _ in loop.iter_steps([1, 2]):
                pass
    assert plain.at == [(1, 2), (2, 4), (3, 6)]


def test_trigger_only_callback_inside_a_scheduling_wrapper_fires_as_before():
    """PeriodicTrigger replaces the epoch-end trigger with its schedule; EnableCallbackIf and
    PeriodicCallback gate it; none is triggered a second time by the list's rule."""
    stepped, gated, every_two = Trigger(), Trigger(), Trigger()
    trainer = TinyClassifier(make_loader(n=16, batch_size=8))
    controller = cadence.Controller(trainer=trainer, steps_per_loop=3, callbacks=[
        PeriodicTrigger(stepped, every_k_steps=3),
        EnableCallbackIf(gated, lambda state: state.epoch >= 2),
        PeriodicCallback(every_two, every_k_epochs=2)])
    controller.train(6)
    assert stepped.at == [(2, 3), (3, 6)]
    assert gated.at == [(2, 4), (3, 6)]
    assert every_two.at == [(2, 4)]  # epoch 3 is not known to be the last under train(6)


@pytest.mark.parametrize(("callback", "expected"), [
    (Trigger(), True), (TriggerAndBegin(), True), (OwnEpochEnd(), False),
    (cadence.Callback(), False), (PeriodicTrigger(Trigger(), every_k_epochs=1), False),
    (EnableCallbackIf(Trigger(), lambda state: True), False),
])
def test_trigger_only_is_one_rule_in_core(callback, expected):
    assert from_scheduling is triggers_only
    assert triggers_only(callback) is expected
    assert ("on_epoch_end" in overridden_hooks(callback)) is (
        expected or type(callback) is not cadence.Callback)
    handled = CallbackList([callback]).hooked("on_epoch_end")
    assert (callback in handled) is ("on_epoch_end" in overridden_hooks(callback))


def test_trigger_only_stop_training_from_trigger_requests_a_stop():
    class Stopper(cadence.Callback):
        def trigger(self, state):
            raise cadence.StopTraining("enough")

    state = RunState()
    CallbackList([Stopper()]).fire("on_epoch_end", state)
    assert state.stop_requested and state.stop_reason == "enough"
