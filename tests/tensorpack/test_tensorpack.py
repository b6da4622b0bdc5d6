"""The tensorpack front-end: the epoch loop and its callback order, StopTraining, run_step,
SingleCostTrainer / TrainConfig / launch_train_with_config, resume, the GAN example."""

import json
import re

import numpy as np
import pytest
import torch
from test_examples import load
from torch import nn

import cadence
from cadence.callbacks import ModelSaver, PeriodicTrigger
from cadence.data.dataflow import DataFlow
from cadence.tensorpack import (
    ModelDesc,
    SimpleTrainer,
    StopTraining,
    TrainConfig,
    Trainer,
    launch_train_with_config,
)

HOOKS = ("on_train_begin", "on_epoch_begin", "on_step_begin", "on_step_end", "on_epoch_end",
         "on_loop_end", "on_train_end")


class Recorder(cadence.Callback):
    def __init__(self, calls):
        self.calls = calls

    def on_train_begin(self, state):
        self.calls.append(("on_train_begin", state.epoch, state.global_step))

    def on_epoch_begin(self, state):
        self.calls.append(("on_epoch_begin", state.epoch, state.global_step))

    def on_step_begin(self, state):
        self.calls.append(("on_step_begin", state.epoch, state.global_step))

    def on_step_end(self, state):
        self.calls.append(("on_step_end", state.epoch, state.global_step))

    def on_epoch_end(self, state):
        self.calls.append(("on_epoch_end", state.epoch, state.global_step))

    def on_loop_end(self, state, logs):
        self.calls.append(("on_loop_end", state.epoch, state.global_step))

    def on_train_end(self, state):
        self.calls.append(("on_train_end", state.epoch, state.global_step))


class Counting(Trainer):
    def __init__(self, fail_at=None, stop_at=None):
        super().__init__()
        self.fail_at, self.stop_at = fail_at, stop_at

    def run_step(self):
        if self.global_step + 1 == self.fail_at:
            raise ZeroDivisionError("step failed")
        if self.global_step + 1 == self.stop_at:
            raise StopTraining("done early")


def run(trainer, steps_per_epoch=2, max_epoch=2):
    calls = []
    trainer.train(callbacks=[Recorder(calls)], steps_per_epoch=steps_per_epoch,
                  max_epoch=max_epoch)
    return calls


def expected_epoch(epoch, first_step, steps):
    calls = [("on_epoch_begin", epoch, first_step)]
    for step in range(first_step, first_step + steps):
        calls += [("on_step_begin", epoch, step), ("on_step_end", epoch, step + 1)]
    last = first_step + steps
    return [*calls, ("on_epoch_end", epoch, last), ("on_loop_end", epoch, last)]


def test_hooks_fire_in_the_documented_order():
    calls = run(Counting())
    assert calls == [("on_train_begin", 0, 0), *expected_epoch(1, 0, 2), *expected_epoch(2, 2, 2),
                     ("on_train_end", 2, 4)]


def test_stop_training_still_runs_that_epochs_end_callbacks():
    trainer = Counting(stop_at=3)  # the first step of epoch 2 raises StopTraining
    calls = run(trainer, max_epoch=5)
    assert calls[-5:] == [("on_epoch_begin", 2, 2), ("on_step_begin", 2, 2),
                          ("on_epoch_end", 2, 2), ("on_loop_end", 2, 2), ("on_train_end", 2, 2)]
    assert trainer.state.stop_reason == "done early"


class StopAt(cadence.Callback):
    """Raises StopTraining from `hook` when it first sees global step `step` (`trigger` runs
    wrapped in a PeriodicTrigger after every step)."""

    def __init__(self, hook, step):
        self.hook, self.step = hook, step
        setattr(self, hook, self._maybe_stop)
        self.active_hooks = frozenset({hook} - {"trigger"})

    def _maybe_stop(self, state):
        if state.global_step == self.step:
            raise StopTraining(f"stopped in {self.hook}")


@pytest.mark.parametrize("hook, step, stopped_at", [
    ("on_step_begin", 2, 2),    # before the first step of epoch 2: that step does not run
    ("on_step_end", 3, 3),
    ("on_epoch_begin", 2, 2),   # epoch 2 begins, runs no step, and ends
    ("on_epoch_end", 4, 4),     # at the end of epoch 2
    ("trigger", 3, 3),
])
def test_tensorpack_stop_training_from_any_callback_hook_ends_after_that_epochs_end_callbacks(
        hook, step, stopped_at):
    calls = []
    stopper = StopAt(hook, step)
    if hook == "trigger":
        stopper = PeriodicTrigger(stopper, every_k_steps=1)
    trainer = Counting()
    trainer.train(callbacks=[stopper, Recorder(calls)], steps_per_epoch=2, max_epoch=5)
    assert (trainer.global_step, trainer.epoch_num) == (stopped_at, 2)
    assert calls[-3:] == [("on_epoch_end", 2, stopped_at), ("on_loop_end", 2, stopped_at),
                          ("on_train_end", 2, stopped_at)]
    assert ("on_epoch_begin", 3, 4) not in calls
    assert trainer.state.stop_reason == f"stopped in {hook}"
    if hook == "on_step_begin":  # the step it stopped before never ran, nor its end hooks
        assert ("on_step_end", 2, 3) not in calls


def test_an_exception_still_runs_on_train_end_and_propagates():
    calls = []
    with pytest.raises(ZeroDivisionError):
        Counting(fail_at=3).train(callbacks=[Recorder(calls)], steps_per_epoch=2, max_epoch=3)
    assert calls[-2:] == [("on_step_begin", 2, 2), ("on_train_end", 2, 2)]


def test_a_callback_requesting_a_stop_ends_the_epoch_early_but_runs_its_end():
    class StopAtThree(cadence.Callback):
        def on_step_end(self, state):
            if state.global_step == 3:
                state.request_stop("enough")

    trainer = Counting()
    trainer.train(callbacks=[StopAtThree()], steps_per_epoch=2, max_epoch=5)
    assert (trainer.global_step, trainer.epoch_num) == (3, 2)


def test_a_trainer_without_run_step_is_a_clear_error():
    with pytest.raises(NotImplementedError, match="override it"):
        Trainer().train(steps_per_epoch=1, max_epoch=1)


# A schedule that trains nothing (0), that no count can mean (-1), or that is misread (2.5 steps,
# True for 1, a string): each argument, each bad value, refused before anything runs.
BAD_COUNTS = [0, -1, 2.5, True, False, "10", np.float32(3.0)]
FIXES = {"steps_per_epoch": "the number of steps in one epoch, e.g. steps_per_epoch=100",
         "max_epoch": "the number of epochs to train, e.g. max_epoch=10",
         "starting_epoch": "the first epoch of a fresh run, e.g. starting_epoch=1"}


def refused(owner, name, bad):
    """The one line that refuses `bad` for `name`: the argument, its value and the fix."""
    return (rf"^{owner}: `{name}` \(got {re.escape(repr(bad))}\) must be a positive int"
            rf"\. Pass {re.escape(FIXES[name])}")


@pytest.mark.parametrize("bad", BAD_COUNTS)
@pytest.mark.parametrize("name", ["steps_per_epoch", "max_epoch", "starting_epoch"])
def test_trainer_train_refuses_a_schedule_that_trains_nothing_naming_the_argument(name, bad):
    calls = []
    schedule = {"steps_per_epoch": 2, "max_epoch": 2, name: bad}
    with pytest.raises(ValueError, match=refused("Counting.train", name, bad)):
        Counting().train(callbacks=[Recorder(calls)], **schedule)
    assert calls == []  # refused before any hook ran


def test_trainer_train_refuses_a_missing_steps_per_epoch_naming_the_argument():
    with pytest.raises(ValueError, match=refused("Counting.train", "steps_per_epoch", None)):
        Counting().train(max_epoch=1)


@pytest.mark.parametrize("bad", BAD_COUNTS)
@pytest.mark.parametrize("name", ["steps_per_epoch", "max_epoch", "starting_epoch"])
def test_train_config_refuses_a_schedule_that_trains_nothing_naming_the_argument(name, bad):
    with pytest.raises(ValueError, match=refused("TrainConfig", name, bad)):
        TrainConfig(model=Regression(), data=[1, 2], **{name: bad})


def test_train_config_refuses_a_max_epoch_of_none_naming_the_argument():
    with pytest.raises(ValueError, match=refused("TrainConfig", "max_epoch", None)):
        TrainConfig(model=Regression(), data=[1, 2], max_epoch=None)


@pytest.mark.parametrize("make", [
    lambda: TrainConfig(model=Regression(), data=[1, 2], starting_epoch=4, max_epoch=3),
    lambda: Counting().train(steps_per_epoch=1, starting_epoch=4, max_epoch=3),
])
def test_a_starting_epoch_after_max_epoch_is_refused_as_a_schedule_of_no_epochs(make):
    with pytest.raises(ValueError, match=r"`starting_epoch` \(got 4\) is after `max_epoch` "
                                         r"\(got 3\), so no epoch would run\. Pass a max_epoch "
                                         r"of at least 4\."):
        make()


def test_an_empty_input_is_refused_rather_than_epochs_of_no_steps():
    with pytest.raises(ValueError, match=r"TrainConfig: the input is empty \(its length is 0\)"
                                         r", so an epoch would have no steps"):
        TrainConfig(model=Regression(), data=[])


def test_a_numpy_integer_is_a_valid_count():
    config = TrainConfig(model=Regression(), data=[1, 2], max_epoch=np.int64(3))
    assert config.max_epoch == 3 and type(config.max_epoch) is int


def test_a_failing_on_train_end_does_not_skip_the_others(caplog):
    calls = []

    class Broken(cadence.Callback):
        def on_train_end(self, state):
            raise RuntimeError("teardown failed")

    Counting().train(callbacks=[Broken(), Recorder(calls)], steps_per_epoch=1, max_epoch=1)
    assert calls[-1][0] == "on_train_end"
    assert "Broken.on_train_end failed" in caplog.text


# ---------------------------------------------------------------------------- single cost


class Regression(ModelDesc):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.2), nn.Linear(8, 1))

    def build_graph(self, x, y):
        return nn.functional.mse_loss(self.net(torch.as_tensor(x)), torch.as_tensor(y))

    def optimizer(self):
        return torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.5)


def regression_config(logdir, max_epoch=3, callbacks=(), **kwargs):
    torch.manual_seed(0)
    x = np.random.RandomState(0).randn(40, 3).astype("float32")
    y = x @ np.array([[1.0], [2.0], [-1.0]], dtype="float32")
    flow = DataFlow.arrays([x, y], 6, shuffle=True, random_state=1)  # 7 batches, the last short
    return TrainConfig(model=Regression(), dataflow=flow, max_epoch=max_epoch,
                       callbacks=list(callbacks), logdir=logdir, extra_callbacks=[], **kwargs)


def test_launch_train_with_config_trains_and_writes_the_default_monitors(tmp_path):
    config = regression_config(tmp_path, callbacks=[ModelSaver(max_to_keep=2)])
    trainer = SimpleTrainer()
    launch_train_with_config(config, trainer)
    assert trainer.global_step == 21 and trainer.epoch_num == 3  # steps_per_epoch = len(flow)
    records = [json.loads(line) for line in (tmp_path / "stats.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["global_step"]) for r in records] == [(1, 7), (2, 14), (3, 21)]
    assert records[-1]["cost"] < records[0]["cost"]
    assert list((tmp_path / "train").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-14", "ckpt-21"]


def test_a_resumed_run_continues_mid_epoch_and_ends_bitwise_equal(tmp_path):
    def saver():
        return PeriodicTrigger(ModelSaver(max_to_keep=None), every_k_steps=5)

    straight = SimpleTrainer()
    launch_train_with_config(regression_config(tmp_path / "a", callbacks=[saver()]), straight)

    class Crash(cadence.Callback):
        def on_step_end(self, state):
            if state.global_step == 12:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch_train_with_config(regression_config(tmp_path / "b", callbacks=[saver(), Crash()]),
                                 SimpleTrainer())
    class FirstStep(cadence.Callback):
        begun: list[int] = []

        def on_train_begin(self, state):
            FirstStep.begun.append(state.global_step)

    resumed = SimpleTrainer()  # resumes from ckpt-10: epoch 2, 3 steps into it
    launch_train_with_config(regression_config(tmp_path / "b", callbacks=[saver(), FirstStep()]),
                             resumed)
    assert FirstStep.begun == [10]  # the same seed as the straight run: the checkpoint's step
    assert resumed.global_step == 21
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)


def epoch_saver():
    return PeriodicTrigger(ModelSaver(max_to_keep=None), every_k_steps=7)  # at each epoch's end


class CrashAt12(cadence.Callback):
    """Ctrl-C at step 12: after ckpt-7, in the middle of the second epoch."""

    def on_step_end(self, state):
        if state.global_step == 12:
            raise KeyboardInterrupt


def test_a_resume_is_recorded_in_the_logdir_and_a_finished_run_adds_none(tmp_path):
    from cadence.writers.reading import Resume, read_run

    with pytest.raises(KeyboardInterrupt):
        launch_train_with_config(regression_config(
            tmp_path, callbacks=[epoch_saver(), CrashAt12()]), SimpleTrainer())
    assert not (tmp_path / "resumes.jsonl").exists()
    for _ in range(2):  # resumes from ckpt-7; then finds the run finished
        launch_train_with_config(regression_config(tmp_path, callbacks=[epoch_saver()]),
                                 SimpleTrainer())
    run = read_run(tmp_path)
    assert run.resumes == (Resume(7, "resume", str(tmp_path / "checkpoints" / "ckpt-7")),)
    (cost,) = run.get("cost")
    assert cost.split == "train" and cost.steps == (7, 14, 21)


class InitialWeights(cadence.Callback):
    """Keeps the model's weights as training begins."""

    def __init__(self):
        self.weights = []

    def on_train_begin(self, state):
        self.weights = [p.detach().clone() for p in state.trainer.model.parameters()]


def test_session_init_loads_weights_for_a_fresh_run_only(tmp_path):
    torch.manual_seed(1234)  # not the seed the run's model is built under: other weights
    source = Regression()
    cadence.BestCheckpointExporter(tmp_path / "pretrained", "x").maybe_export_checkpoint(
        source, {"x": 1.0}, 1)
    fresh, resumed = InitialWeights(), InitialWeights()
    config = regression_config(tmp_path / "run", max_epoch=1, callbacks=[ModelSaver(), fresh],
                               session_init=tmp_path / "pretrained")
    assert not any(torch.equal(a, b) for a, b in zip(source.parameters(),
                                                     config.model.parameters(), strict=True))
    launch_train_with_config(config, SimpleTrainer())
    for a, b in zip(source.parameters(), fresh.weights, strict=True):
        assert torch.equal(a, b)
    # a run that resumes keeps its trained weights: session_init is not loaded again
    more = regression_config(tmp_path / "run", max_epoch=2, callbacks=[ModelSaver(), resumed],
                             session_init=tmp_path / "pretrained")
    launch_train_with_config(more, SimpleTrainer())
    assert not all(torch.equal(a, b)
                   for a, b in zip(source.parameters(), resumed.weights, strict=True))


def test_config_and_launch_misuse_is_refused():
    with pytest.raises(ValueError, match="exactly one of `dataflow` and `data`"):
        TrainConfig(model=Regression())
    with pytest.raises(ValueError, match="no length: set steps_per_epoch"):
        TrainConfig(model=Regression(), data=iter([1]))
    with pytest.raises(TypeError, match="must be a cadence.tensorpack.ModelDesc"):
        TrainConfig(model=nn.Linear(1, 1), data=[1])
    with pytest.raises(TypeError, match="must be a SingleCostTrainer"):
        launch_train_with_config(TrainConfig(model=Regression(), data=[1]), Counting())


def test_a_cost_that_is_not_a_scalar_is_a_clear_error():
    trainer = SimpleTrainer()
    model = nn.Linear(2, 2)
    trainer.setup_graph([(torch.ones(3, 2),)], lambda x: model(x),
                        lambda params: torch.optim.SGD(params, lr=0.1), model=model)
    with pytest.raises(ValueError, match="must return a scalar tensor"):
        trainer.train(steps_per_epoch=1, max_epoch=1)


@pytest.mark.slow
def test_the_gan_example_counts_logical_steps_and_learns_the_target(tmp_path):
    example = load("gan_1d")
    result = example.main(["--logdir", str(tmp_path), "--epochs", "6"])
    trainer = result["trainer"]
    assert result["global_step"] == 6 * 150  # steps, not optimizer calls
    assert trainer.d_optimizer.state[trainer.discriminator[0].weight]["step"] == 2 * 900
    assert trainer.g_optimizer.state[trainer.generator[0].weight]["step"] == 900
    assert abs(result["mean"] - example.TARGET_MEAN) < 0.5
    assert (tmp_path / "checkpoints" / "ckpt-900").is_dir()
    again = example.main(["--logdir", str(tmp_path), "--epochs", "7"])  # resumes, one more
    assert again["global_step"] == 7 * 150


def test_sigterm_stops_after_the_step_saves_and_raises_preempted(tmp_path):
    import os
    import signal

    class Terminate(cadence.Callback):
        def on_step_end(self, state):
            if state.global_step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = SimpleTrainer()
    config = regression_config(tmp_path, callbacks=[Terminate()])
    with pytest.raises(cadence.Preempted) as stopped:
        launch_train_with_config(config, trainer)
    assert stopped.value.code == 143
    assert stopped.value.checkpoint == str(tmp_path / "checkpoints" / "ckpt-3")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back
    resumed = SimpleTrainer()
    launch_train_with_config(regression_config(tmp_path), resumed)
    assert resumed.global_step == 21


def test_a_model_and_a_loss_make_the_cost_and_steps_make_no_host_syncs(monkeypatch):
    from fakes import make_classification

    from cadence.tensorpack import cost_from_model

    x, y = make_classification(32)
    model = nn.Linear(4, 3)
    trainer = SimpleTrainer()
    trainer.setup_graph([(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)],
                        cost_from_model(model, nn.functional.cross_entropy),
                        lambda params: torch.optim.SGD(params, lr=0.5), model=model)
    trainer.callbacks.append(cadence.Callback())  # hooks nothing: costs nothing per step
    trainer.run_step()  # warm-up: the cost accumulator is created on the first step
    with cadence.debug.count_host_syncs() as syncs:
        for _ in range(10):  # crosses passes over the data
            trainer.run_step()
    assert syncs.count == 0, syncs.calls
    assert float(trainer.epoch_logs()["cost"]) > 0


def test_an_input_that_yields_nothing_is_a_clear_error():
    trainer = SimpleTrainer()
    model = nn.Linear(2, 1)
    trainer.setup_graph((b for b in [(torch.ones(1, 2),)]), lambda x: model(x).sum(),
                        lambda params: torch.optim.SGD(params, lr=0.1), model=model)
    with pytest.raises(ValueError, match="yields no batches"):
        trainer.train(steps_per_epoch=3, max_epoch=1)  # a generator: the second pass is empty


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_steps_make_no_host_syncs():
    from fakes import make_classification

    from cadence.tensorpack import cost_from_model

    x, y = make_classification(32)
    x, y = x.cuda(), y.cuda()
    model = nn.Linear(4, 3).cuda()
    trainer = SimpleTrainer()
    trainer.setup_graph([(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)],
                        cost_from_model(model, nn.functional.cross_entropy),
                        lambda params: torch.optim.SGD(params, lr=0.5), model=model)
    trainer.run_step()  # warm-up
    with cadence.debug.count_host_syncs() as syncs:  # CUDA's sync debug mode is on too
        for _ in range(10):  # crosses passes over the data
            trainer.run_step()
    assert syncs.count == 0, syncs.calls


def test_a_signal_in_mid_epoch_then_resume_gives_the_uninterrupted_per_epoch_trace(tmp_path):
    """SIGTERM in the middle of epoch 2: the epoch's end callbacks (validation, a schedule
    point, the best-metric saver) run once, in the run that finishes the epoch -- the
    per-epoch records, the learning rates of every step and the weights are the uninterrupted
    run's."""
    import os
    import signal

    from cadence.callbacks import InferenceRunner, MinSaver, ScheduledHyperParamSetter

    class Traced(SimpleTrainer):
        def __init__(self, trace, signal_at=None):
            super().__init__()
            self.trace, self.signal_at = trace, signal_at

        def run_step(self):
            super().run_step()
            self.trace.append((self.global_step + 1, self.optimizer.param_groups[0]["lr"]))
            if self.global_step + 1 == self.signal_at:
                os.kill(os.getpid(), signal.SIGTERM)

    x = np.random.RandomState(1).randn(12, 3).astype("float32")
    validation = [(torch.as_tensor(x), torch.as_tensor(x @ np.ones((3, 1), "float32")))]

    def config(logdir):
        return regression_config(logdir, max_epoch=4, callbacks=[
            InferenceRunner(validation, lambda m, b: {"loss": m.build_graph(*b)}, names=["loss"]),
            MinSaver("validation_loss"),
            ScheduledHyperParamSetter("learning_rate", [(1, 0.02), (2, 0.01), (3, 0.005)])])

    def epochs(logdir):
        timings = ("wall_time", "steps_per_second", "examples_per_second", "goodput")
        return [{k: v for k, v in json.loads(line).items() if k not in timings}
                for line in (logdir / "stats.jsonl").read_text().splitlines()]

    straight, steps = Traced(trace := []), trace
    launch_train_with_config(config(tmp_path / "a"), straight)
    paused = []
    with pytest.raises(cadence.Preempted):
        launch_train_with_config(config(tmp_path / "b"), Traced(paused, signal_at=10))
    assert len(epochs(tmp_path / "b")) == 1  # epoch 2 (steps 8-14) did not end at the signal
    resumed = []
    trainer = Traced(resumed)
    launch_train_with_config(config(tmp_path / "b"), trainer)
    assert resumed[0][0] == 11  # from the checkpoint the signal saved
    assert paused + resumed == steps
    assert epochs(tmp_path / "b") == epochs(tmp_path / "a")
    def best(logdir):
        (folder,) = [p for p in logdir.iterdir() if p.name.startswith("minsaver")]
        ledger = json.loads((folder / "info.json").read_text())
        return [(e["step"], e["value"], e["path"]) for e in ledger["exports"]]

    assert best(tmp_path / "b") == best(tmp_path / "a")
    for a, b in zip(straight.model.parameters(), trainer.model.parameters()):
        assert torch.equal(a, b)


def test_a_tensorpack_run_records_its_timeline_in_its_logdir_for_cadence_goodput(
        tmp_path, capsys):
    """Its logdir is its run's directory: the lock while it trains, and the timeline of each
    attempt -- here one that crashed at step 12 (after ckpt-7: its epoch's loop, 8..12, never
    ended) and one that resumed from ckpt-7."""
    from cadence.records.goodput import run_goodput
    from cadence.task.cli import main

    with pytest.raises(KeyboardInterrupt):
        launch_train_with_config(regression_config(
            tmp_path, callbacks=[epoch_saver(), CrashAt12()]), SimpleTrainer())
    launch_train_with_config(regression_config(tmp_path, callbacks=[epoch_saver()]),
                             SimpleTrainer())
    report = run_goodput(tmp_path)
    assert [(a.end, a.first_step, a.last_step) for a in report.attempts] == [
        ("error", 0, 7), ("finished", 7, 21)]
    assert report.steps == 21 and report.attempts[0].error == "KeyboardInterrupt"
    assert [a.committed_step for a in report.attempts] == [7, 21]
    assert main(["goodput", str(tmp_path)]) == 0
    assert "2 attempt(s), 21 steps kept" in capsys.readouterr().out
