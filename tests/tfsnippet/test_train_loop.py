"""TrainLoop (seed 004): counters, events, metrics and logs, early stopping, exact resume."""

import json
import re

import numpy as np
import pytest
import torch
from torch import nn

import cadence
from cadence.core.best import infer_smaller_is_better
from cadence.core.logs import humanize_duration
from cadence.data.dataflow import DataFlow
from cadence.tfsnippet.events import EventKeys
from cadence.tfsnippet.train_loop import TrainLoop


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.5  # every reading advances half a second
        return self.now


def make_loop(**kwargs):
    kwargs.setdefault("print_func", lambda line: None)
    return TrainLoop(nn.Linear(2, 1), **kwargs)


def test_counters_start_at_one_and_limits_end_the_loops():
    with make_loop(max_epoch=2) as loop:
        seen = [(epoch, step) for epoch in loop.iter_epochs()
                for step, _ in loop.iter_steps([1, 2, 3])]
    assert seen == [(1, 1), (1, 2), (1, 3), (2, 4), (2, 5), (2, 6)]
    with make_loop(max_step=4) as loop:  # max_step mid-epoch: that epoch still ends normally
        ends = []
        loop.events.on(EventKeys.AFTER_EPOCH, lambda loop: ends.append(loop.step))
        for _ in loop.iter_epochs():
            for _ in loop.iter_steps([1, 2, 3]):
                pass
        assert (loop.epoch, loop.step, ends) == (2, 4, [3, 4])


def test_limits_can_change_while_running():
    with make_loop(max_epoch=5) as loop:
        for epoch in loop.iter_epochs():
            if epoch == 2:
                loop.max_epoch = 3
        assert loop.epoch == 3


def test_every_event_fires_in_the_documented_order():
    calls = []
    loop = make_loop(max_epoch=2, summary_writer=None)
    for key in EventKeys.all():
        loop.events.on(key, lambda *args, _key=key: calls.append(_key))
    loop._summary_writer = cadence.SummaryManager(None, lambda: 0)  # accepts and drops summaries
    with loop:
        for _ in loop.iter_epochs():
            for _ in loop.iter_steps([1]):
                loop.collect_metrics(loss=1.0)
            with loop.timeit("valid_time"):
                pass
            loop.add_summary({"x": 1.0})
            loop.print_logs()
    K = EventKeys
    epoch = [K.BEFORE_EPOCH, K.BEFORE_STEP, K.METRICS_COLLECTED, K.AFTER_STEP,
             K.TIME_METRICS_COLLECTED,  # step_time
             K.TIME_METRICS_COLLECTED,  # valid_time
             K.SUMMARY_ADDED,
             K.TIME_METRICS_COLLECTED,  # epoch_time, committed by the print
             K.METRIC_STATS_PRINTED, K.TIME_METRIC_STATS_PRINTED, K.AFTER_EPOCH]
    assert calls == [K.ENTER_LOOP, *epoch, *epoch, K.EXIT_LOOP]


def test_after_events_fire_in_reverse_registration_order_and_exit_fires_on_errors():
    calls = []
    loop = make_loop(max_epoch=1)
    loop.events.on(EventKeys.AFTER_STEP, lambda loop: calls.append("first"))
    loop.events.on(EventKeys.AFTER_STEP, lambda loop: calls.append("second"))
    loop.events.on(EventKeys.EXIT_LOOP, lambda loop: calls.append("exit"))
    with pytest.raises(ZeroDivisionError), loop:
        for _ in loop.iter_epochs():
            for step, _ in loop.iter_steps([1, 2]):
                if step == 2:
                    raise ZeroDivisionError
    assert calls == ["second", "first", "exit"]
    loop.events.off(EventKeys.EXIT_LOOP, loop.events._handlers[EventKeys.EXIT_LOOP][0])
    with pytest.raises(ValueError, match="is not registered"):
        loop.events.off(EventKeys.EXIT_LOOP, print)
    with pytest.raises(KeyError, match="not allowed"):
        loop.events.on("after_everything", print)


def test_step_handlers_registered_or_cleared_during_the_loop_take_effect_at_the_next_step():
    calls = []
    loop = make_loop(max_epoch=1)
    with loop:
        for _ in loop.iter_epochs():
            for step, _ in loop.iter_steps([1, 2, 3, 4]):
                if step == 1:
                    loop.events.on(EventKeys.BEFORE_STEP, lambda loop: calls.append(loop.step))
                if step == 2:
                    loop.events.clear_event_handlers()
                if step == 3:
                    loop.events.on(EventKeys.AFTER_STEP, lambda loop: calls.append(-loop.step))
    assert calls == [2, -3, -4]


def test_callbacks_see_the_same_run_and_can_stop_it_cleanly():
    calls = []

    class Recorder(cadence.Callback):
        def on_train_begin(self, state):
            calls.append("train_begin")

        def on_epoch_begin(self, state):
            calls.append(f"epoch_begin {state.epoch}")

        def on_step_end(self, state):
            calls.append(f"step_end {state.global_step}")
            if state.global_step == 3:
                state.request_stop("enough")

        def on_epoch_end(self, state):
            calls.append(f"epoch_end {state.epoch}")

        def on_loop_end(self, state, logs):
            calls.append(f"printed {sorted(logs)}")

        def on_train_end(self, state):
            calls.append("train_end")

    with make_loop(max_epoch=5, callbacks=[Recorder()]) as loop:
        for _ in loop.iter_epochs():
            for _ in loop.iter_steps([1, 2]):
                loop.collect_metrics(loss=1.0)
            loop.print_logs()
    assert calls == ["train_begin", "epoch_begin 1", "step_end 1", "step_end 2",
                     "printed ['epoch_time', 'loss', 'step_time']", "epoch_end 1",
                     "epoch_begin 2", "step_end 3",
                     "printed ['epoch_time', 'loss', 'step_time']", "epoch_end 2", "train_end"]


def test_log_lines_show_counters_eta_mean_and_std_and_the_best_marker():
    lines = []
    with TrainLoop(nn.Linear(2, 1), max_epoch=2, max_step=4, print_func=lines.append,
                   clock=FakeClock()) as loop:
        for _ in loop.iter_epochs():
            for step, _ in loop.iter_steps([1, 2]):
                loop.collect_metrics(loss=float(step), accuracy_top=1.0)
            loop.collect_metrics(valid_loss=1.0 / loop.epoch)
            loop.print_logs()
    # Every clock reading advances 0.5s: a step takes one reading after its start.
    assert lines[0] == ("[Epoch 1/2, Step 2/4, ETA 3.5s] epoch time: 2.5s; step time: 0.5s (±0s); "
                        "accuracy top: 1 (±0); loss: 1.5 (±0.5); valid loss: 1 (*)")
    assert lines[1].startswith("[Epoch 2/2, Step 4/4, ETA 0s] epoch time: 2.5s;")
    assert lines[1].endswith("loss: 3.5 (±0.5); valid loss: 0.5 (*)")


def test_durations_are_humanized():
    assert [humanize_duration(s) for s in (0.5, 61, 3600 * 26 + 1)] == ["0.5s", "1m 1s",
                                                                          "1d 2h 1s"]


def test_the_metric_direction_is_inferred_from_a_documented_list_or_given():
    for name in ("valid_acc", "val_accuracy", "auc", "valid_f1", "precision", "top1_recall"):
        assert not infer_smaller_is_better(name), name
    for name in ("valid_loss", "error_rate", "perplexity"):
        assert infer_smaller_is_better(name), name
    assert make_loop(valid_metric_name="valid_auc").valid_metric_smaller_is_better is False
    assert make_loop(valid_metric_name="valid_auc",
                     valid_metric_smaller_is_better=True).valid_metric_smaller_is_better


def test_early_stopping_restores_the_best_parameters_at_the_end():
    lines = []
    model = nn.Linear(1, 1, bias=False)
    with TrainLoop(model, max_epoch=3, early_stopping=True, print_func=lines.append) as loop:
        for epoch in loop.iter_epochs():
            with torch.no_grad():
                model.weight.fill_(float(epoch))
            loop.collect_metrics(valid_loss=[0.5, 0.1, 0.9][epoch - 1])  # best at epoch 2
    assert model.weight.item() == 2.0
    assert loop.best_valid_metric == 0.1
    assert lines[-1] == "Restored the early-stopping parameters of step 0 (valid_loss = 0.1)."


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_early_stopping_restores_on_an_exception_or_ctrl_c_too(error):
    model = nn.Linear(1, 1, bias=False)
    with pytest.raises(type(error)), TrainLoop(model, max_epoch=3, early_stopping=True,
                                                 print_func=lambda line: None) as loop:
        for epoch in loop.iter_epochs():
            with torch.no_grad():
                model.weight.fill_(float(epoch))
            loop.collect_metrics(valid_loss=[0.5, 0.1, 0.9][epoch - 1])
            if epoch == 3:
                raise error
    assert model.weight.item() == 2.0


def test_tensors_are_collected_without_host_syncs_until_printing(monkeypatch):
    with make_loop(max_epoch=1) as loop:
        for _ in loop.iter_epochs():
            with cadence.debug.count_host_syncs() as syncs:
                for _ in loop.iter_steps([1, 2, 3]):
                    loop.collect_metrics(loss=torch.tensor(2.0))
            assert syncs.count == 0, syncs.calls
            loop.print_logs()


def test_metrics_reach_tensorboard_when_printed_durations_skipped_commit_freqs_applied(tmp_path):
    with make_loop(max_epoch=4, summary_dir=tmp_path, summary_commit_freqs={"rare": 2}) as loop:
        for _ in loop.iter_epochs():
            for _ in loop.iter_steps([1, 2]):
                loop.collect_metrics(loss=torch.tensor(1.0), rare=3.0)
            loop.print_logs()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    assert all(r["metrics/loss"] == 1.0 and "metrics/epoch_time" not in r for r in records)
    assert ["metrics/rare" in r for r in records] == [True, False, True, False]
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_misuse_is_a_clear_error(tmp_path):
    loop = make_loop(max_epoch=1)
    with pytest.raises(RuntimeError, match="inside its `with` block"):
        next(loop.iter_epochs())
    with loop:
        with pytest.raises(RuntimeError, match="inside an epoch or a step"):
            loop.collect_metrics(loss=1.0)
        with pytest.raises(RuntimeError, match="must run inside iter_epochs"):
            next(loop.iter_steps([1]))
        for _ in loop.iter_epochs():
            with pytest.raises(ValueError, match="needs data or a max_step"):
                next(loop.iter_steps())
            with pytest.raises(RuntimeError, match="epoch loops do not nest"):
                next(loop.iter_epochs())
            with pytest.raises(TypeError, match="must be a dict"):
                loop.collect_metrics([1.0])
            with pytest.raises(RuntimeError, match="needs a checkpoint_dir"):
                loop.make_checkpoint()
            with pytest.raises(RuntimeError, match="needs a summary writer"):
                loop.add_summary({"x": 1})
    with pytest.raises(RuntimeError, match="entered only once"), loop:
        pass
    with pytest.raises(KeyError, match="reserved"):
        make_loop(checkpoint_dir=tmp_path, checkpoint_save_objects={"loop": nn.Linear(1, 1)})
    with pytest.raises(ValueError, match="checkpoint_epoch_freq"):
        make_loop(checkpoint_dir=tmp_path, checkpoint_epoch_freq=0)


def test_a_generator_exhausted_after_one_pass_is_an_error_not_an_endless_loop():
    data = (i for i in range(2))
    with pytest.raises(ValueError, match="yields no batches"), make_loop(max_step=10) as loop:
        for _ in loop.iter_epochs():
            for _ in loop.iter_steps(data):
                pass


def test_the_training_summary_lists_parameters_by_group():
    lines = []
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    with TrainLoop({"net": model}, var_groups=["net.0"], print_func=lines.append) as loop:
        loop.print_training_summary()
    text = lines[0]
    assert "torch " + torch.__version__ in text
    assert "Trainable Parameters (net.0) (9 in total)" in text
    assert "Other Trainable Parameters (4 in total)" in text
    assert "weight  (3, 2)  6" in text


def test_tfsnippet_print_training_summary_keeps_the_order_with_group_and_grand_totals():
    """tfsnippet's ``summarize_variables``: parameters in their own order (not sorted), a
    table per variable group with its total, and the grand total above the groups."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Linear(2, 3)  # weight (6) then bias (3): not alphabetical
            self.decoder = nn.Linear(3, 1)
            self.scale = nn.Parameter(torch.ones(2))

    lines = []
    with TrainLoop(Net(), var_groups=["model.encoder"], print_func=lines.append) as loop:
        loop.print_training_summary()
    tables = lines[0].split("Trainable Parameters (15 in total)\n", 1)[1]
    assert tables.splitlines() == [
        "==================================",
        "",
        "Trainable Parameters (model.encoder) (9 in total)",
        "-------------------------------------------------",
        "weight  (3, 2)  6",
        "bias    (3,)    3",
        "",
        "Other Trainable Parameters (6 in total)",
        "---------------------------------------",
        "model.scale           (2,)    2",  # torch's order: a module's own parameters first
        "model.decoder.weight  (1, 3)  3",
        "model.decoder.bias    (1,)    1",
    ]
    lines.clear()
    with TrainLoop([torch.zeros(3, requires_grad=True), nn.Linear(1, 1)],
                   print_func=lines.append) as loop:  # a loose tensor, then a module
        loop.print_training_summary()
    assert lines[0].splitlines()[-5:] == ["Trainable Parameters (5 in total)",
                                          "---------------------------------",
                                          "0         (3,)    3",
                                          "1.weight  (1, 1)  1",
                                          "1.bias    (1,)    1"]


def test_progress_and_eta_follow_the_limits():
    with TrainLoop(nn.Linear(1, 1), max_step=10, print_func=lambda line: None,
                   clock=FakeClock()) as loop:
        assert loop.get_progress() == 0.0
        for _ in loop.iter_epochs():
            for step in loop.iter_steps():
                if step == 5:
                    assert loop.get_progress() == 0.4  # the running step is not done yet
                    assert loop.get_eta() is not None
                    loop.max_step = 5
    with make_loop() as loop:
        assert loop.get_progress() is None and loop.get_eta() is None


class ManualClock:
    """A clock that moves only when told."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_tfsnippet_progress_and_eta_are_right_inside_every_epoch_with_only_max_epoch():
    """tfsnippet's README configuration (only `max_epoch`): three epochs of two 1-second steps.
    Progress counts finished steps against max_epoch x the steps of a finished epoch."""
    clock, lines, progress = ManualClock(), [], []
    with TrainLoop(nn.Linear(2, 1), max_epoch=3, print_func=lines.append, clock=clock) as loop:
        for _ in loop.iter_epochs():
            for _ in loop.iter_steps([1, 2]):
                progress.append(loop.get_progress())
                clock.now += 1.0
            progress.append(loop.get_progress())
            loop.print_logs()
    # In epoch 1 nothing says how long an epoch is: progress is 0 until it ends.
    assert progress == pytest.approx([0, 0, 0, 2 / 6, 3 / 6, 4 / 6, 4 / 6, 5 / 6, 1.0])
    assert [line.split("]")[0] for line in lines] == [
        "[Epoch 1/3, Step 2, ETA 4s", "[Epoch 2/3, Step 4, ETA 2s", "[Epoch 3/3, Step 6, ETA 0s"]


def test_tfsnippet_print_logs_eta_counts_the_step_it_just_closed():
    clock, lines = ManualClock(), []
    with TrainLoop(nn.Linear(2, 1), max_step=4, max_epoch=1, print_func=lines.append,
                   clock=clock) as loop:
        for _ in loop.iter_epochs():
            for _ in loop.iter_steps([1, 2, 3, 4]):
                clock.now += 1.0
                loop.print_logs()
    assert [line.split("]")[0] for line in lines] == [
        "[Step 1/4, ETA 3s", "[Step 2/4, ETA 2s", "[Step 3/4, ETA 1s", "[Step 4/4, ETA 0s"]


def test_tfsnippet_misuse_of_timeit_metric_collector_and_println_with_tag_is_an_error():
    """tfsnippet requires an open epoch or step for `timeit` and `metric_collector`, and for
    `println(with_tag=True)` (its tag names them)."""
    with make_loop(max_epoch=1) as loop:
        with pytest.raises(RuntimeError, match="inside an epoch or a step"):
            with loop.timeit("valid_time"):
                pass
        with pytest.raises(RuntimeError, match="inside an epoch or a step"):
            with loop.metric_collector("valid_loss"):
                pass
        with pytest.raises(RuntimeError, match="inside an epoch or a step"):
            loop.println("hello", with_tag=True)
        loop.println("hello")  # without the tag: anywhere
        for _ in loop.iter_epochs():
            with loop.timeit("valid_time"), loop.metric_collector("valid_loss") as collector:
                collector.collect(1.0)
            loop.println("hello", with_tag=True)


def test_a_flow_left_mid_pass_by_a_finished_loop_can_be_used_again():
    flow = DataFlow.arrays([np.arange(6)], 2)
    with make_loop(max_step=1) as first:  # stops after one of three batches
        for _ in first.iter_epochs():
            for _ in first.iter_steps(flow):
                pass
    with make_loop(max_epoch=1) as second:  # `first` is still alive: its pass ended on exit
        for _ in second.iter_epochs():
            steps = [batch[0].tolist() for _, batch in second.iter_steps(flow)]
    assert steps == [[0, 1], [2, 3], [4, 5]]


# ---------------------------------------------------------------------------- exact resume


class Crash(Exception):
    pass


def train(directory, crash_at=None, max_epoch=3):
    """Dropout, SGD with momentum, a shuffled flow; checkpoints mid-epoch every 4 steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.3), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = np.random.RandomState(0).randn(40, 3).astype("float32")
    flow = DataFlow.arrays([x, x.sum(1, keepdims=True)], 6, shuffle=True, random_state=1)
    losses = []
    with TrainLoop(model, max_epoch=max_epoch, checkpoint_dir=directory,
                   checkpoint_save_objects={"optimizer": optimizer}, early_stopping=True,
                   print_func=lambda line: None) as loop:
        for _ in loop.iter_epochs():
            for step, (xb, yb) in loop.iter_steps(flow):
                loss = nn.functional.mse_loss(model(torch.as_tensor(xb)), torch.as_tensor(yb))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                if step % 4 == 0:
                    loop.make_checkpoint()
                if step == crash_at:
                    raise Crash
            loop.collect_metrics(valid_loss=losses[-1])
    return model, losses, loop


def test_a_run_resumed_mid_epoch_ends_bitwise_equal_to_an_uninterrupted_one(tmp_path):
    straight, straight_losses, _ = train(tmp_path / "straight")
    with pytest.raises(Crash):
        train(tmp_path / "crashed", crash_at=10)  # after the checkpoint of step 8, mid-epoch 2
    resumed, resumed_losses, loop = train(tmp_path / "crashed")
    assert resumed_losses == straight_losses[8:]  # continued with the batch after step 8
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    assert loop.epoch == 3 and loop.step == 21


def test_early_stopping_state_survives_resume(tmp_path):
    _, _, first = train(tmp_path, max_epoch=2)
    _, _, second = train(tmp_path, max_epoch=3)  # continues from the end of epoch 2
    assert second.best_valid_metric <= first.best_valid_metric
    assert second.step == 21


def test_sigterm_ends_the_loops_saves_and_raises_preempted(tmp_path):
    import os
    import signal

    model = nn.Linear(1, 1)
    with pytest.raises(cadence.Preempted) as stopped, TrainLoop(
            model, max_epoch=3, checkpoint_dir=tmp_path, print_func=lambda line: None) as loop:
        for _ in loop.iter_epochs():
            for step, _ in loop.iter_steps([1, 2, 3]):
                if step == 2:
                    os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.code == 143
    assert (loop.epoch, loop.step) == (1, 2)
    assert stopped.value.checkpoint == str(tmp_path / "ckpt-2")
    with TrainLoop(model, max_epoch=3, checkpoint_dir=tmp_path,
                   print_func=lambda line: None) as loop:
        assert loop.step == 2


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
@pytest.mark.parametrize("name", ["max_epoch", "max_step"])
def test_max_epoch_and_max_step_must_be_positive_ints(name, bad):
    with pytest.raises(ValueError, match=rf"`{name}` \(got {bad!r}\) must be a positive int"):
        cadence.TrainLoop(nn.Linear(1, 1), **{name: bad})


@pytest.mark.parametrize(("name", "bad", "fix"), [
    ("max_epoch", 0, "Pass the last epoch to train, e.g. max_epoch=10, or None for no limit."),
    ("max_step", 0, "Pass the last global step to train, e.g. max_step=1000, or None for no "
                    "limit."),
])
def test_max_epoch_and_max_step_errors_say_what_to_pass_instead(name, bad, fix):
    with pytest.raises(ValueError, match=rf"^TrainLoop: `{name}` \(got 0\) must be a positive "
                                         rf"int or None\. {re.escape(fix)}$"):
        cadence.TrainLoop(nn.Linear(1, 1), **{name: bad})


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "1"])
def test_checkpoint_epoch_freq_that_is_not_a_positive_int_is_refused_with_the_fix(bad, tmp_path):
    with pytest.raises(ValueError, match=(
            rf"^TrainLoop: `checkpoint_epoch_freq` \(got {re.escape(repr(bad))}\) must be a "
            r"positive int or None\. Pass how many epochs apart to checkpoint, e\.g\. "
            r"checkpoint_epoch_freq=1, or None to checkpoint only with make_checkpoint\(\)\.$")):
        make_loop(checkpoint_dir=tmp_path, checkpoint_epoch_freq=bad)


@pytest.mark.parametrize("bad", [-1, 2.5, True, "5"])
def test_checkpoint_max_to_keep_that_is_not_a_count_is_refused_naming_the_argument(bad):
    with pytest.raises(ValueError, match=(
            rf"^TrainLoop: `checkpoint_max_to_keep` \(got {re.escape(repr(bad))}\) must be a "
            r"non-negative int or None\. Pass how many checkpoints to keep, e\.g\. "
            r"checkpoint_max_to_keep=5, or None to keep all\.$")):
        make_loop(checkpoint_max_to_keep=bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_summary_commit_freq_that_is_not_a_positive_int_is_refused_naming_the_metric(bad):
    # 0 was a ZeroDivisionError at the first print; -1 wrote the metric at every print
    with pytest.raises(ValueError, match=(
            rf"^TrainLoop: `summary_commit_freqs\['loss'\]` \(got {re.escape(repr(bad))}\) "
            r"must be a positive int\. Pass how many prints apart to write 'loss', e\.g\. "
            r"summary_commit_freqs=\{'loss': 2\}; 1 writes it at every print\.$")):
        make_loop(max_epoch=1, summary_commit_freqs={"loss": bad})


@pytest.mark.parametrize("bad", [1, 0, 3, "True", None])
def test_early_stopping_that_is_not_a_bool_is_refused_as_it_has_no_patience(bad):
    with pytest.raises(TypeError, match=(
            rf"^TrainLoop: `early_stopping` \(got {re.escape(repr(bad))}\) must be True or "
            r"False: it keeps the best parameters and restores them on exit, and has no "
            r"patience\. To stop after epochs without improvement, add the callback "
            r"cadence\.callbacks\.EarlyStopping\(monitor, patience=\.\.\.\) instead\.$")):
        make_loop(max_epoch=1, early_stopping=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_steps_make_no_host_syncs_until_printing():
    model = nn.Linear(2, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [torch.randn(4, 2, device="cuda") for _ in range(5)]
    with TrainLoop(model, max_epoch=2, print_func=lambda line: None) as loop:
        for _ in loop.iter_epochs():
            with cadence.debug.count_host_syncs() as syncs:  # CUDA's sync debug mode too
                for _, x in loop.iter_steps(data):
                    loss = model(x).square().mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    loop.collect_metrics(loss=loss)
            assert syncs.count == 0, syncs.calls
            loop.print_logs()


def test_a_sigterm_at_the_last_step_of_an_epoch_resumes_with_the_next_epoch(tmp_path):
    """The stop came after the epoch's pass was over: the resumed run does not run that epoch
    again on a new pass."""
    import os
    import signal

    def run(directory, kill_at=None):
        flow = DataFlow.arrays([np.arange(8)], batch_size=2, shuffle=True, random_state=0)
        seen = []
        with TrainLoop(nn.Linear(1, 1), max_epoch=2, checkpoint_dir=directory,
                       checkpoint_save_objects={"flow": flow},
                       print_func=lambda line: None) as loop:
            for _ in loop.iter_epochs():
                for step, (x,) in loop.iter_steps(flow):
                    seen.append(x.tolist())
                    if step == kill_at:
                        os.kill(os.getpid(), signal.SIGTERM)
        return seen

    straight = run(tmp_path / "straight")
    with pytest.raises(cadence.Preempted):
        run(tmp_path / "stopped", kill_at=4)  # the first epoch's last step
    assert run(tmp_path / "stopped") == straight[4:]  # the second epoch, once


def test_a_train_loop_records_its_run_for_cadence_goodput_and_plot(tmp_path, capsys):
    """A TrainLoop's checkpoint_dir is its run's directory: it holds the run's lock while the
    loop runs, and records the timeline (``cadence goodput``) and where it resumed
    (``cadence plot``): here an attempt that crashed mid-run and one that resumed and finished."""
    from cadence.core.run_dir import RunLock, RunLockedError
    from cadence.records.goodput import run_goodput
    from cadence.task.cli import main
    from cadence.writers.reading import read_run

    run = tmp_path / "loop"
    with pytest.raises(Crash), make_loop(max_epoch=4, checkpoint_dir=run,
                                         checkpoint_epoch_freq=1) as loop:
        with pytest.raises(RunLockedError):  # one trainer in the run at a time
            RunLock(run / "train.lock").acquire()
        for epoch in loop.iter_epochs():
            for _ in loop.iter_steps([1, 2, 3]):
                pass
            if epoch == 2:
                raise Crash
    with make_loop(max_epoch=4, checkpoint_dir=run, checkpoint_epoch_freq=1) as loop:
        for _ in loop.iter_epochs():
            for _ in loop.iter_steps([1, 2, 3]):
                pass
    report = run_goodput(run)
    assert [(a.end, a.first_step, a.last_step) for a in report.attempts] == [
        ("error", 0, 6), ("finished", 3, 12)]  # the crash at 6 lost the steps after ckpt-3
    assert report.steps == 12 and report.attempts[0].lost_steps == 3
    assert report.productive_s > 0 and report.goodput is not None
    assert [(r.step, r.reason) for r in read_run(run).resumes] == [(3, "resume")]
    assert main(["goodput", str(run)]) == 0
    assert "2 attempt(s), 12 steps kept" in capsys.readouterr().out
