"""Each built-in callback and scheduling wrapper, driven by the tensorpack-style trainer (and
one by the Controller): what it does, when, and what it costs per step."""

import json
import re
import time

import pytest
import torch
from torch import nn

import cadence
from cadence.callbacks import (
    EarlyStopping,
    EnableCallbackIf,
    EstimatedTimeLeft,
    HyperParamSetterWithFunc,
    InferenceRunner,
    JSONWriter,
    MaxSaver,
    MinSaver,
    ModelSaver,
    PeakMemoryTracker,
    PeriodicCallback,
    PeriodicTrigger,
    Profiler,
    ScalarPrinter,
    ScheduledHyperParamSetter,
    StopAtTimeLimit,
    TFEventWriter,
    ThroughputTracker,
    cosine_schedule,
)
from cadence.core.callbacks import CallbackList, overridden_hooks
from cadence.core.errors import MissingMetricError
from cadence.engine.exporter import read_weights
from cadence.tensorpack import SimpleTrainer


def make_trainer(logdir=None, batches=4):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    x = torch.randn(8 * batches, 2)
    y = x.sum(1, keepdim=True)
    trainer = SimpleTrainer(logdir)
    data = [(x[i:i + 8], y[i:i + 8]) for i in range(0, len(x), 8)]
    trainer.setup_graph(data, lambda xb, yb: nn.functional.mse_loss(model(xb), yb),
                        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
                        model=model)
    return trainer, data


class Trigger(cadence.Callback):
    """Records the global steps at which it is triggered."""

    def __init__(self):
        self.at = []

    def trigger(self, state):
        self.at.append(state.global_step)


class Put(cadence.Callback):
    """Writes a fixed sequence of values of a metric, one per epoch."""

    def __init__(self, name, values):
        self.name, self.values = name, list(values)
        self.provides = (name,)

    def on_epoch_end(self, state):
        state.metrics[self.name] = self.values[state.epoch - 1]


# ---------------------------------------------------------------------------- scheduling


def test_periodic_trigger_runs_on_steps_epochs_before_and_after_training():
    steps, epochs, edges = Trigger(), Trigger(), Trigger()
    trainer, _ = make_trainer()
    trainer.train(callbacks=[PeriodicTrigger(steps, every_k_steps=3),
                             PeriodicTrigger(epochs, every_k_epochs=2),
                             PeriodicTrigger(edges, before_train=True, at_end=True)],
                  steps_per_epoch=4, max_epoch=3)
    assert steps.at == [3, 6, 9, 12]
    assert epochs.at == [8]
    assert edges.at == [0, 12]


def test_periodic_trigger_on_seconds_and_before_the_step(monkeypatch):
    clock = iter(range(0, 1000, 2))  # each reading is 2 "seconds" later
    monkeypatch.setattr(time, "monotonic", lambda: float(next(clock)))
    seconds, before = Trigger(), Trigger()
    trainer, _ = make_trainer()
    trainer.train(callbacks=[PeriodicTrigger(seconds, every_k_seconds=5),
                             PeriodicTrigger(before, every_k_steps=2, before_step=True)],
                  steps_per_epoch=4, max_epoch=1)
    assert seconds.at and all(b - a >= 1 for a, b in zip(seconds.at, seconds.at[1:]))
    assert before.at == [0, 2]  # before steps 1 and 3, i.e. at global steps 0 and 2


def test_schedules_align_to_absolute_counters_across_a_resume(tmp_path):
    first = Trigger()
    trainer, _ = make_trainer(tmp_path)
    trainer.train(callbacks=[ModelSaver(), PeriodicTrigger(first, every_k_steps=3)],
                  steps_per_epoch=4, max_epoch=1)
    second = Trigger()
    resumed, _ = make_trainer(tmp_path)
    resumed.train(callbacks=[ModelSaver(), PeriodicTrigger(second, every_k_steps=3)],
                  steps_per_epoch=4, max_epoch=2)
    assert first.at == [3] and second.at == [6]


def test_periodic_callback_and_enable_if_gate_a_callback():
    class Epochs(cadence.Callback):
        def __init__(self):
            self.seen = []

        def on_epoch_end(self, state):
            self.seen.append(state.epoch)

    every_two, late = Epochs(), Epochs()
    trainer, _ = make_trainer()
    trainer.train(callbacks=[PeriodicCallback(every_two, every_k_epochs=2),
                             EnableCallbackIf(late, lambda state: state.epoch >= 4)],
                  steps_per_epoch=1, max_epoch=5)
    assert every_two.seen == [2, 4, 5]  # and the last epoch
    assert late.seen == [4, 5]


def test_tensorpack_enable_callback_if_decides_once_per_step():
    """The predicate is evaluated when the step begins, and the step's end follows that
    decision (tensorpack evaluates it in ``before_run`` only): a callback never gets the begin
    of one step and the end of another."""
    calls = []

    class Steps(cadence.Callback):
        def on_step_begin(self, state):
            calls.append(("begin", state.global_step))

        def on_step_end(self, state):
            calls.append(("end", state.global_step))

    trainer, _ = make_trainer()
    even = EnableCallbackIf(Steps(), lambda state: state.global_step % 2 == 0)
    trainer.train(callbacks=[even], steps_per_epoch=4, max_epoch=1)
    assert calls == [("begin", 0), ("end", 1), ("begin", 2), ("end", 3)]  # steps 1 and 3


def test_wrappers_validate_their_schedules():
    with pytest.raises(ValueError, match="needs a schedule"):
        PeriodicTrigger(Trigger())
    with pytest.raises(ValueError, match="every_k_steps"):
        PeriodicTrigger(Trigger(), every_k_steps=0)
    with pytest.raises(TypeError, match="cadence.Callback"):
        PeriodicTrigger(object(), every_k_steps=1)


# A period that never fires (0), fires always (-1), or fires where nobody expects it (1.5 fires
# at epochs 3, 6, ...; True is not 1): each wrapper, each argument, each bad value.
BAD_PERIODS = [0, -1, 1.5, True, "2"]


@pytest.mark.parametrize("bad", BAD_PERIODS)
@pytest.mark.parametrize("name", ["every_k_steps", "every_k_epochs"])
@pytest.mark.parametrize("wrapper", [PeriodicTrigger, PeriodicCallback])
def test_a_period_that_is_not_a_positive_int_is_refused_naming_the_argument(wrapper, name, bad):
    unit = name.removeprefix("every_k_")
    with pytest.raises(ValueError, match=(
            rf"^{wrapper.__name__}: `{name}` \(got {re.escape(repr(bad))}\) must be a positive "
            rf"int or None\. Pass a whole number of {unit}, e.g\. {name}=2, or None\.$")):
        wrapper(Trigger(), **{name: bad})


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), True, "600"])
def test_every_k_seconds_that_is_not_a_positive_finite_number_is_refused(bad):
    with pytest.raises(ValueError, match=(
            rf"^PeriodicTrigger: `every_k_seconds` \(got {re.escape(repr(bad))}\) must be a "
            r"positive number of seconds or None\. Pass e\.g\. every_k_seconds=600\.$")):
        PeriodicTrigger(Trigger(), every_k_seconds=bad)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "3600"])
def test_a_time_limit_that_is_not_a_positive_finite_number_is_refused(bad):
    with pytest.raises(ValueError, match=(
            rf"^StopAtTimeLimit: `seconds` \(got {re.escape(repr(bad))}\) must be a positive "
            r"number of seconds\. Pass e\.g\. StopAtTimeLimit\(3600\) for an hour\.$")):
        StopAtTimeLimit(bad)


@pytest.mark.parametrize(("name", "bad", "kind"), [
    ("start_step", -1, "non-negative"), ("start_step", 2.5, "non-negative"),
    ("start_step", True, "non-negative"), ("end_step", 0, "positive"),
    ("end_step", 12.5, "positive"), ("end_step", "20", "positive"),
])
def test_a_profiler_step_that_is_never_reached_is_refused_naming_the_argument(name, bad, kind):
    steps = {"start_step": 10, "end_step": 20, name: bad}
    with pytest.raises(ValueError, match=(
            rf"^Profiler: `{name}` \(got {re.escape(repr(bad))}\) must be a {kind} int\. "
            rf"Pass the global step after which to (start|stop), e\.g\. {name}=")):
        Profiler(**steps)


def test_a_profiler_range_of_no_steps_is_refused():
    with pytest.raises(ValueError, match=r"^Profiler: `end_step` \(got 10\) must be after "
                                         r"`start_step` \(got 10\), or no step is profiled\. "
                                         r"Pass e\.g\. Profiler\(start_step=10, end_step=20\)"):
        Profiler(start_step=10, end_step=10)


@pytest.mark.parametrize("bad", [0, -8, 8.0, True])
def test_samples_per_step_that_is_not_a_positive_int_is_refused(bad):
    with pytest.raises(ValueError, match=(
            rf"^ThroughputTracker: `samples_per_step` \(got {re.escape(repr(bad))}\) must be a "
            r"positive int or None\. Pass the number of examples in one step")):
        ThroughputTracker(samples_per_step=bad)


def test_callbacks_without_step_schedules_add_no_per_step_hooks():
    callbacks = CallbackList([PeriodicTrigger(ModelSaver(), every_k_epochs=1),
                              *(PeriodicTrigger(Trigger(), every_k_epochs=2) for _ in range(50)),
                              InferenceRunner([None], lambda m, b: {}, names=["loss"]),
                              JSONWriter(),
                              ScalarPrinter(), EstimatedTimeLeft(), ThroughputTracker(),
                              MinSaver("x"), EarlyStopping("x"),
                              ScheduledHyperParamSetter("learning_rate", [(1, 0.1)])])
    assert not callbacks.has_step_hooks
    assert "on_step_end" in overridden_hooks(PeriodicTrigger(Trigger(), every_k_steps=5))


def test_a_reader_before_its_producer_is_refused_at_setup():
    runner = InferenceRunner([None], lambda model, batch: {}, names=["loss"])
    with pytest.raises(ValueError, match="MinSaver reads 'validation_loss', which "
                                         "InferenceRunner produces, but comes before it"):
        CallbackList([MinSaver("validation_loss"), runner])
    CallbackList([runner, MinSaver("validation_loss")])  # the right order is accepted


# ---------------------------------------------------------------------------- savers


def test_model_saver_keeps_the_last_n_with_the_callbacks_state(tmp_path):
    stopper = EarlyStopping("validation_x", patience=5)
    trainer, _ = make_trainer(tmp_path)
    trainer.train(callbacks=[Put("validation_x", [3, 2, 1]), stopper, ModelSaver(max_to_keep=2)],
                  steps_per_epoch=2, max_epoch=3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-4", "ckpt-6"]
    resumed, _ = make_trainer(tmp_path)
    again = EarlyStopping("validation_x", patience=5)
    resumed.setup_callbacks([Put("validation_x", [3, 2, 1]), again, ModelSaver()])
    resumed.resume_or_initialize()
    assert (resumed.epoch_num, resumed.global_step) == (3, 6)
    assert (again.best, again.best_step) == (1, 6)  # callback state came back too


@pytest.mark.parametrize(("saver", "best_step"), [(MinSaver, 4), (MaxSaver, 6)])
def test_min_and_max_savers_export_the_weights_of_the_best_epoch(tmp_path, saver, best_step):
    weights = {}

    class Remember(cadence.Callback):
        def on_epoch_end(self, state):
            weights[state.global_step] = state.trainer.model.weight.detach().clone()

    trainer, _ = make_trainer(tmp_path)
    trainer.train(callbacks=[Remember(), Put("val", [2.0, 1.0, 3.0]), saver("val")],
                  steps_per_epoch=2, max_epoch=3)
    directory = tmp_path / f"{saver.__name__.lower()}-val"
    ledger = json.loads((directory / "info.json").read_text())
    assert [e["step"] for e in ledger["exports"]] == [best_step]
    exported = read_weights(directory)["weight"]
    assert torch.equal(exported, weights[best_step])


# ---------------------------------------------------------------------------- inference


def test_inference_runner_records_example_weighted_means_in_eval_mode_without_grad():
    seen = []

    def infer(model, batch):
        seen.append((model.training, torch.is_grad_enabled()))
        return {"loss": batch[0].float().mean()}

    data = [(torch.tensor([1.0, 1.0, 1.0]),), (torch.tensor([5.0]),)]  # sizes 3 and 1
    runner = InferenceRunner(data, infer, names=["loss"])
    trainer, _ = make_trainer()
    trainer.train(callbacks=[runner], steps_per_epoch=1, max_epoch=1)
    assert runner.last_results == {"validation_loss": 2.0}  # (3*1 + 1*5) / 4
    assert trainer.state.metrics["validation_loss"] == 2.0
    assert seen == [(False, False), (False, False)]
    assert trainer.model.training  # back in train mode


def test_inference_runner_results_are_kept_in_checkpoints_and_come_back(tmp_path):
    passes = []

    def infer(model, batch):
        passes.append(len(batch[0]))
        return {"loss": batch[0].mean()}

    data = [(torch.tensor([1.0, 3.0]),)]
    runner = InferenceRunner(data, infer, names=["loss"])
    trainer, _ = make_trainer(tmp_path)
    trainer.train(callbacks=[runner, ModelSaver()], steps_per_epoch=1, max_epoch=1)
    assert runner.state_dict() == {"last_results": {"validation_loss": 2.0}}
    again = InferenceRunner(data, infer, names=["loss"])
    resumed, _ = make_trainer(tmp_path)
    resumed.train(callbacks=[again, ModelSaver()], steps_per_epoch=1, max_epoch=1)  # finished
    assert again.last_results == {"validation_loss": 2.0} and passes == [2]  # not evaluated
    older = InferenceRunner(data, infer, names=["loss"])
    older.load_state_dict({})  # a checkpoint of an older cadence, or of no pass yet
    assert older.last_results == {} and older.state_dict() == {}


def test_an_inference_runner_with_nothing_to_evaluate_is_refused():
    def infer(model, batch):
        return {"loss": batch}

    with pytest.raises(TypeError, match=r"^InferenceRunner: `infer_fn` \(got \[\]\) must be a "
                                        r"function \(model, batch\) -> \{name: scalar tensor\}"
                                        r"; tensorpack's list of inferencers is infer_fn and "
                                        r"names here\. Pass e\.g\. InferenceRunner\(data, "):
        InferenceRunner([1.0], [])  # tensorpack's InferenceRunner(ds, []): no inferencer
    with pytest.raises(ValueError, match=r"^InferenceRunner: `names` \(got \[\]\) and "
                                         r"`metrics` \(got None\) are both empty, so it would "
                                         r"evaluate nothing\. Pass the names infer_fn returns"):
        InferenceRunner([1.0], infer)
    with pytest.raises(ValueError, match=r"^InferenceRunner: `names` \(got \[\]\) and "
                                         r"`metrics` \(got \{\}\) are both empty"):
        InferenceRunner([1.0], infer, names=[], metrics={})
    with pytest.raises(TypeError, match=r"^InferenceRunner: `names` \(got 'loss'\) must be a "
                                        r"list of names, not one string\. Pass "
                                        r"names=\['loss'\]\.$"):
        InferenceRunner([1.0], infer, names="loss")  # would have read as names l, o, s, s
    with pytest.raises(ValueError, match=r"^InferenceRunner: `data` is empty \(its length is "
                                         r"0\), so it would record NaN\."):
        InferenceRunner([], infer, names=["loss"])


@pytest.mark.parametrize(("names", "returned", "asked"), [
    (["accuracy"], {"loss": 1.0}, "['accuracy']"),
    (["loss", "accuracy"], {"loss": 1.0, "error": 0.0}, "['accuracy']"),
    (["validation_loss"], {"loss": 1.0}, "['validation_loss']"),  # the prefix is the runner's
    (["Loss"], {"loss": 1.0}, "['Loss']"),
])
def test_names_that_infer_fn_does_not_return_are_an_error_naming_both_sides(names, returned,
                                                                             asked):
    runner = InferenceRunner([(torch.ones(2),)], lambda model, batch: returned, names=names)
    trainer, _ = make_trainer()
    keys = sorted(returned)
    with pytest.raises(MissingMetricError, match=(
            rf"^InferenceRunner: `names` \(got {re.escape(str(names))}\) asks for "
            rf"{re.escape(asked)}, which infer_fn did not return; it returned "
            rf"{re.escape(str(keys))}\. Make names the keys infer_fn returns, e\.g\. "
            rf"names={re.escape(str(keys))}\.$")) as error:
        trainer.train(callbacks=[runner], steps_per_epoch=1, max_epoch=1)
    assert isinstance(error.value, KeyError)  # what it raised before, now with both sides
    assert error.value.__suppress_context__  # one error, not a KeyError and then another


def test_an_infer_fn_that_returns_no_dict_is_a_clear_error():
    runner = InferenceRunner([(torch.ones(2),)], lambda model, batch: torch.ones(()),
                             names=["loss"])
    trainer, _ = make_trainer()
    with pytest.raises(TypeError, match=r"^InferenceRunner: infer_fn returned a Tensor; it must "
                                        r"return a dict with the `names` \['loss'\] as keys"):
        trainer.train(callbacks=[runner], steps_per_epoch=1, max_epoch=1)


def test_data_that_yields_no_batches_at_a_trigger_is_an_error_not_nan():
    batches = (batch for batch in [(torch.ones(2),)])  # a generator: one pass only
    runner = InferenceRunner(batches, lambda model, batch: {"loss": batch[0].sum()},
                             names=["loss"])
    trainer, _ = make_trainer()
    with pytest.raises(ValueError, match=r"^InferenceRunner: `data` yielded no batches, so there "
                                         r"was nothing to evaluate \(a generator is used up "
                                         r"after one pass\)"):
        trainer.train(callbacks=[runner], steps_per_epoch=1, max_epoch=2)
    assert runner.last_results == {"validation_loss": 2.0}  # the first epoch's, the one pass


# ---------------------------------------------------------------------------- schedules


def lr_of(trainer):
    return trainer.optimizer.param_groups[0]["lr"]


def test_piecewise_and_linear_schedules_by_epoch():
    rates = []

    class Watch(cadence.Callback):
        def on_epoch_end(self, state):
            rates.append(round(lr_of(state.trainer), 6))

    trainer, _ = make_trainer()
    trainer.train(callbacks=[ScheduledHyperParamSetter("learning_rate", [(2, 0.01), (4, 0.001)]),
                             Watch()], steps_per_epoch=1, max_epoch=5)
    assert rates == [0.1, 0.1, 0.01, 0.01, 0.001]  # unchanged before the first point
    rates.clear()
    trainer, _ = make_trainer()
    trainer.train(callbacks=[ScheduledHyperParamSetter("learning_rate", [(1, 0.0), (5, 0.4)],
                                                       interp="linear"), Watch()],
                  steps_per_epoch=1, max_epoch=5)
    assert rates == [0.1, 0.0, 0.1, 0.2, 0.3]


def test_any_optimizer_field_from_a_function_of_the_step_or_a_cosine():
    momenta = []

    class Watch(cadence.Callback):
        def on_step_end(self, state):
            momenta.append(state.trainer.optimizer.param_groups[0]["momentum"])

    trainer, _ = make_trainer()
    trainer.train(callbacks=[HyperParamSetterWithFunc("momentum", lambda t, v: 0.1 * t,
                                                      step_based=True), Watch()],
                  steps_per_epoch=3, max_epoch=1)
    assert momenta == pytest.approx([0.0, 0.1, 0.2])
    schedule = cosine_schedule(1.0, 0.0, total=4)
    assert [schedule(t) for t in (0, 2, 4, 8)] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="has no 'betas'"):
        trainer2, _ = make_trainer()
        trainer2.train(callbacks=[HyperParamSetterWithFunc("betas", lambda t, v: v)],
                       steps_per_epoch=1, max_epoch=1)


def test_schedules_are_resume_safe(tmp_path):
    trainer, _ = make_trainer(tmp_path)
    setter = ScheduledHyperParamSetter("learning_rate", [(1, 0.5), (3, 0.05)])
    trainer.train(callbacks=[setter, ModelSaver()], steps_per_epoch=1, max_epoch=3)
    resumed, _ = make_trainer(tmp_path)
    resumed.setup_callbacks([ScheduledHyperParamSetter("learning_rate", [(1, 0.5), (3, 0.05)])])
    resumed.resume_or_initialize()
    resumed.optimizer.param_groups[0]["lr"] = 123.0  # whatever the restored optimizer says...
    resumed.main_loop(1, max_epoch=4)
    assert lr_of(resumed) == 0.05  # ...epoch 4 runs with the schedule's value


def test_tensorpack_scheduled_point_takes_effect_after_that_epoch_completes():
    rates = []

    class Watch(cadence.Callback):
        def on_epoch_begin(self, state):
            rates.append(round(lr_of(state.trainer), 6))

    trainer, _ = make_trainer()
    trainer.train(callbacks=[ScheduledHyperParamSetter("learning_rate", [(0, 0.3), (2, 0.01)]),
                             Watch()], steps_per_epoch=1, max_epoch=4)
    # (0, v): before the first epoch; (2, v): after epoch 2 completes, i.e. from epoch 3 on.
    assert rates == [0.3, 0.3, 0.01, 0.01]


def test_tensorpack_hyper_param_setter_with_func_gets_finished_epochs_once_per_epoch(tmp_path):
    """``func(epochs finished, current value)`` runs once per epoch -- never twice at a start or
    a resume -- so a multiplicative schedule does not compound."""
    seen = []

    def halve(finished, value):
        seen.append(finished)
        return value * 0.5

    def run(logdir, max_epoch):
        trainer, _ = make_trainer(logdir)
        rates = []

        class Watch(cadence.Callback):
            def on_epoch_begin(self, state):
                rates.append(lr_of(state.trainer))

        trainer.train(callbacks=[HyperParamSetterWithFunc("learning_rate", halve), Watch(),
                                 ModelSaver()], steps_per_epoch=1, max_epoch=max_epoch)
        return rates

    straight = run(tmp_path / "straight", 5)
    assert seen == [0, 1, 2, 3, 4]
    assert straight == pytest.approx([0.05, 0.025, 0.0125, 0.00625, 0.003125])
    seen.clear()
    first = run(tmp_path / "resumed", 3)
    resumed = run(tmp_path / "resumed", 5)
    assert seen == [0, 1, 2, 3, 4]
    assert first + resumed == pytest.approx(straight)


# ---------------------------------------------------------------------------- statistics


def test_eta_throughput_and_peak_memory_are_recorded_per_epoch():
    trainer, _ = make_trainer()
    trainer.train(callbacks=[EstimatedTimeLeft(), ThroughputTracker(samples_per_step=8),
                             PeakMemoryTracker()],
                  steps_per_epoch=3, max_epoch=2)
    metrics = trainer.state.metrics
    assert metrics["eta_seconds"] == 0.0  # nothing left after the last epoch
    assert metrics["throughput/steps_per_second"] > 0
    assert metrics["throughput/samples_per_second"] == pytest.approx(
        8 * metrics["throughput/steps_per_second"])
    assert metrics["peak_memory_mb/host"] > 10


def test_monitors_write_json_lines_tensorboard_and_a_printed_line(tmp_path, caplog):
    trainer, _ = make_trainer(tmp_path)
    with caplog.at_level("INFO", logger="cadence"):
        trainer.train(monitors=[TFEventWriter(), JSONWriter(), ScalarPrinter()],
                      steps_per_epoch=2, max_epoch=2)
    lines = (tmp_path / "stats.jsonl").read_text().splitlines()
    assert [json.loads(line)["global_step"] for line in lines] == [2, 4]
    assert "cost" in json.loads(lines[0])
    events = list((tmp_path / "train").glob("events.out.tfevents.*"))
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tmp_path / "train"))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("cost")] == [2, 4]
    assert "epoch 2 | step 4 | cost=" in caplog.text


def test_the_progress_bar_runs_with_the_epoch_loop(capsys):
    trainer, _ = make_trainer()
    trainer.train(callbacks=[cadence.ProgressBar(enabled=True)], steps_per_epoch=2, max_epoch=2)
    assert "4/4" in capsys.readouterr().err


# ---------------------------------------------------------------------------- stopping


def test_nan_guard_stops_training_when_the_cost_diverges():
    trainer, _ = make_trainer()
    trainer.optimizer.param_groups[0]["lr"] = 1e6  # diverges within an epoch
    with pytest.raises(FloatingPointError, match="cost is"):
        trainer.train(callbacks=[cadence.LossGuard("cost", upper_bound=1e3)],
                      steps_per_epoch=8, max_epoch=3)


def test_early_stopping_waits_for_patience_then_restores_the_best_weights():
    weights = []

    class Remember(cadence.Callback):
        def on_epoch_end(self, state):
            weights.append(state.trainer.model.weight.detach().clone())

    stopper = EarlyStopping("validation_loss", patience=2, restore_best=True)
    trainer, _ = make_trainer()
    trainer.train(callbacks=[Remember(), Put("validation_loss", [3, 1, 2, 2, 0, 0]), stopper],
                  steps_per_epoch=1, max_epoch=6)
    assert trainer.epoch_num == 4  # no improvement in epochs 3 and 4
    assert stopper.best == 1 and stopper.best_step == 2
    assert torch.equal(trainer.model.weight, weights[1])
    assert "did not improve" in trainer.state.stop_reason
    assert EarlyStopping("valid_acc").mode == "max"


def test_stop_at_time_limit_stops_cleanly(monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr(time, "monotonic", lambda: float(next(clock)))
    trainer, _ = make_trainer()
    trainer.train(callbacks=[StopAtTimeLimit(3.5)], steps_per_epoch=10, max_epoch=5)
    assert trainer.global_step == 4  # the clock reads 1, 2, 3, 4 after the steps
    assert "time limit" in trainer.state.stop_reason


def test_the_profiler_writes_a_trace_of_the_step_range(tmp_path):
    profiler = Profiler(2, 4, directory=tmp_path)
    trainer, _ = make_trainer()
    trainer.train(callbacks=[profiler], steps_per_epoch=6, max_epoch=1)
    assert profiler.trace_path == tmp_path / "trace-2-4.json"
    trace = json.loads(profiler.trace_path.read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("addmm" in name or "linear" in name for name in names)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_profiler_traces_the_kernels_of_the_step_range(tmp_path):
    from fakes import TinyClassifier, make_classification

    x, y = make_classification(64)
    runner = TinyClassifier([(x[i:i + 8].cuda(), y[i:i + 8].cuda()) for i in range(0, 64, 8)])
    runner.model.cuda()
    profiler = Profiler(2, 4, directory=tmp_path)
    cadence.Controller(trainer=runner, steps_per_loop=3, callbacks=[profiler]).train(6)
    trace = json.loads(profiler.trace_path.read_text())
    categories = {event.get("cat", "") for event in trace["traceEvents"]}
    assert "kernel" in categories  # GPU kernels, not only the host side


def test_built_ins_work_under_the_controller_too(tmp_path):
    from fakes import TinyClassifier, make_loader

    runner = TinyClassifier(make_loader())
    runner.logdir = tmp_path
    best = MinSaver("loss")
    controller = cadence.Controller(trainer=runner, steps_per_loop=4, callbacks=[
        PeriodicTrigger(best, every_k_steps=4), JSONWriter()])
    controller.train(8)
    assert (tmp_path / "minsaver-loss" / "info.json").is_file()
    assert len((tmp_path / "stats.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("callback", [JSONWriter(), ModelSaver(), MinSaver("x")])
def test_a_callback_without_a_directory_or_a_logdir_says_what_to_pass(callback):
    trainer, _ = make_trainer()  # no logdir
    with pytest.raises(ValueError, match=f"{type(callback).__name__} needs a directory: pass "
                                         r"one, or train with a logdir"):
        trainer.train(callbacks=[callback], steps_per_epoch=1, max_epoch=1)
