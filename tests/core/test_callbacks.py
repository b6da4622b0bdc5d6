import logging

import pytest

from cadence.core.callbacks import Callback, CallbackList, RunState


class Recorder(Callback):
    def __init__(self, log):
        self.log = log

    def on_train_begin(self, state):
        self.log.append("train_begin")

    def on_loop_end(self, state, logs):
        self.log.append(("loop_end", logs["x"]))


class Stepper(Callback):
    def on_step_end(self, state):
        pass


class Patience(Callback):
    def __init__(self):
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def test_only_overriding_callbacks_are_dispatched_to():
    log = []
    callbacks = CallbackList([Recorder(log), Callback()])
    assert [type(c).__name__ for c in callbacks.hooked("on_loop_end")] == ["Recorder"]
    assert callbacks.hooked("on_step_begin") == []
    callbacks.fire("on_train_begin", RunState())
    callbacks.fire("on_loop_end", RunState(), {"x": 3})
    assert log == ["train_begin", ("loop_end", 3)]


def test_step_hooks_are_only_active_when_overridden():
    assert not CallbackList([Recorder([]), Callback()]).has_step_hooks
    assert CallbackList([Stepper()]).has_step_hooks


def test_non_callbacks_are_rejected():
    with pytest.raises(TypeError, match="cadence.Callback"):
        CallbackList([lambda logs: None])


def test_state_round_trips_by_class_and_index(caplog):
    first, second = Patience(), Patience()
    first.count, second.count = 2, 5
    saved = CallbackList([first, second]).state_dict()
    assert saved == {"Patience:0": {"count": 2}, "Patience:1": {"count": 5}}
    fresh = [Patience(), Patience()]
    CallbackList(fresh).load_state_dict(saved)
    assert [c.count for c in fresh] == [2, 5]
    with caplog.at_level(logging.WARNING):
        CallbackList([]).load_state_dict(saved)
    assert "no such callback" in caplog.text


def test_request_stop_records_the_reason():
    state = RunState()
    state.request_stop("patience exhausted")
    assert state.stop_requested and state.stop_reason == "patience exhausted"
