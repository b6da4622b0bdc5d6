"""LoopReport on its own, driven by a RunClock as a TrainLoop drives it: metrics printed as
``mean (±std)`` after the tag, the best validation metric, progress and ETA."""

import pytest
import torch
from torch import nn

from cadence.core.best import BestTracker
from cadence.core.callbacks import Callback, CallbackList
from cadence.core.clock import RunClock
from cadence.tfsnippet.events import EventKeys, EventSource
from cadence.tfsnippet.formatting import DefaultMetricFormatter
from cadence.tfsnippet.metric_log import MetricLog
from cadence.tfsnippet.params import TrainedParameters
from cadence.tfsnippet.reporting import LoopReport


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0  # every reading advances a second
        return self.now


def make_report(model=None, callbacks=(), max_epoch=None, max_step=None, **kwargs):
    lines = []
    run_clock = RunClock(callbacks=CallbackList(callbacks), max_epoch=max_epoch,
                         max_step=max_step)
    report = LoopReport(
        run_clock, MetricLog(DefaultMetricFormatter(), "metrics/", None, {}),
        BestTracker("valid_loss"), TrainedParameters(model or nn.Linear(2, 1)),
        EventSource(EventKeys.all()), source="the loop", summary_writer=lambda: None,
        print_func=lines.append, clock=kwargs.pop("clock", FakeClock()), **kwargs)
    return report, run_clock, lines


def steps(report, run_clock, n, body=lambda step: None):
    """Runs `n` steps the way TrainLoop.iter_steps does."""
    run_clock.begin_loop()
    for _ in range(n):
        run_clock.begin_step()
        report.begin_step()
        body(run_clock.state.global_step)
        report.end_step()
        run_clock.end_step(False)
    run_clock.end_loop()
    report.end_step_loop()


def test_it_prints_mean_and_std_of_collected_metrics_after_its_tag():
    report, run_clock, lines = make_report(max_epoch=2, show_eta=False)
    report.start()
    run_clock.begin_epoch(announce=report.begin_epoch)
    steps(report, run_clock, 2, lambda step: report.collect_metrics(loss=float(step)))
    report.print_logs()  # a clock reading is a second: each step 1 s, the epoch 5 s
    assert lines == ["[Epoch 1/2, Step 2] epoch time: 5s; step time: 1s (±0s); loss: 1.5 (±0.5)"]


def test_print_logs_puts_the_means_where_callbacks_see_them():
    seen = []

    class Spy(Callback):
        def on_loop_end(self, state, logs):
            seen.append((state.global_step, dict(logs)))

    report, run_clock, _ = make_report(callbacks=[Spy()], show_eta=False)
    report.start()
    run_clock.begin_epoch(announce=report.begin_epoch)
    steps(report, run_clock, 1, lambda step: report.collect_metrics(loss=torch.tensor(3.0)))
    report.print_logs()
    assert seen == [(1, {"loss": 3.0, "step_time": 1.0, "epoch_time": 3.0})]


def test_it_tracks_the_best_validation_metric_and_marks_its_line():
    report, run_clock, lines = make_report(show_eta=False)
    report.start()
    for valid_loss in (2.0, 1.0, 1.5):
        run_clock.begin_epoch(announce=report.begin_epoch)
        report.collect_metrics(valid_loss=valid_loss)
        report.print_logs()
        run_clock.end_epoch(announce=report.end_epoch)
    assert (report.best.best, report.best.best_step) == (1.0, 0)
    assert [line.endswith("(*)") for line in lines] == [True, True, False]
    assert report.state_dict()["best"]["best"] == 1.0


def test_early_stopping_restores_the_best_parameters_at_finish():
    model = nn.Linear(1, 1, bias=False)
    report, run_clock, lines = make_report(model, early_stopping=True)
    report.start()
    run_clock.begin_epoch(announce=report.begin_epoch)
    with torch.no_grad():
        model.weight.fill_(1.0)
    report.collect_metrics(valid_loss=0.5)
    with torch.no_grad():
        model.weight.fill_(2.0)
    report.collect_metrics(valid_loss=0.9)
    report.finish()
    assert model.weight.item() == 1.0
    assert lines[-1].startswith("Restored the early-stopping parameters")


def test_progress_and_eta_come_from_the_progress_and_the_limits():
    clock = FakeClock()
    report, run_clock, _ = make_report(max_step=4, clock=clock)
    assert report.get_progress() == 0.0
    report.start()  # the ETA counts from here: one clock reading
    run_clock.begin_epoch(announce=report.begin_epoch)
    steps(report, run_clock, 2)
    assert report.get_progress() == 0.5
    assert report.get_eta() == pytest.approx(clock.now - 1.0)  # half done: as long again
    run_clock.max_step = None  # the limits are settable; without one, no progress
    assert report.get_progress() is None and report.get_eta() is None
    run_clock.max_epoch = 2  # one epoch open, none finished: 0 of 2 epochs
    assert report.get_progress() == 0.0
    run_clock.end_epoch(announce=report.end_epoch)  # an epoch of 2 steps finished
    assert report.get_progress() == 0.5


def test_reporting_outside_an_epoch_or_before_start_is_an_error():
    report, _, _ = make_report()
    with pytest.raises(RuntimeError, match="inside its `with` block"):
        report.collect_metrics(loss=1.0)
    report.start()
    with pytest.raises(RuntimeError, match="inside an epoch or a step"):
        report.print_logs()
    with pytest.raises(RuntimeError, match="needs a summary writer"):
        report.add_summary({"x": 1.0})


def test_a_steps_print_shows_its_values_and_the_epochs_print_shows_every_value_of_the_epoch():
    """A value collected in a step is added once (to the step's statistics, which join the
    epoch's when printed or when the step loop ends): the step's print shows the values since
    the last step print, the epoch's every value -- from before the step loop, printed at a
    step, or never printed at a step."""
    report, run_clock, lines = make_report(show_eta=False)
    report.start()
    run_clock.begin_epoch(announce=report.begin_epoch)
    report.collect_metrics(loss=torch.tensor(10.0))  # in the epoch, outside a step

    def body(step):
        report.collect_metrics(loss=torch.tensor(float(step)), acc=float(step))
        if step == 2:
            report.print_logs()  # steps 1 and 2

    steps(report, run_clock, 3, body)
    steps(report, run_clock, 1, lambda step: report.collect_metrics(loss=torch.tensor(6.0)))
    report.print_logs()
    step_line, epoch_line = lines
    assert step_line.endswith("acc: 1.5 (±0.5); loss: 1.5 (±0.5)"), step_line
    # the epoch: loss 10, 1, 2, 3, 6 (mean 4.4, std 3.2), acc 1, 2, 3
    assert epoch_line.endswith("acc: 2 (±0.816497); loss: 4.4 (±3.2619)"), epoch_line
