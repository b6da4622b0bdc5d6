"""The Controller's outer loop, with torch-free fake runners (tests/fakes.py)."""

import json
import logging
import os
import signal

import pytest
from fakes import CountingEvaluator, CountingTrainer, FakeCheckpointManager

from cadence.core import Callback, Controller, Preempted


def make(steps_per_loop=10, checkpoint_interval=None, evaluator=False, **kwargs):
    trainer = CountingTrainer()
    manager = FakeCheckpointManager(trainer, checkpoint_interval)
    controller = Controller(
        trainer=trainer,
        evaluator=CountingEvaluator(trainer) if evaluator else None,
        steps_per_loop=steps_per_loop,
        checkpoint_manager=manager,
        **kwargs,
    )
    return controller, trainer, manager


@pytest.mark.parametrize(
    ("steps_per_loop", "interval", "loops", "saves"),
    [
        (5, 10, [5, 5, 5, 5, 5], [10, 20, 25]),          # divides: loops untouched
        (3, 10, [3, 3, 3, 1, 3, 3, 3, 1, 3, 2], [10, 20, 25]),  # does not divide: cut at 10, 20
        (20, 10, [10, 10, 5], [10, 20, 25]),              # interval shorter than a loop
    ],
)
def test_checkpoints_land_exactly_on_interval_multiples(steps_per_loop, interval, loops, saves):
    controller, trainer, manager = make(steps_per_loop, interval)
    controller.train(25)
    assert trainer.loops == loops
    assert sorted(manager.saved) == saves  # 25: the save at completion; no stray save at step 5


def test_train_takes_an_absolute_target():
    controller, trainer, _ = make(10)
    controller.train(15)
    controller.train(15)  # already there: nothing to do
    controller.train(30)
    assert trainer.loops == [10, 5, 10, 5]


def test_explicit_saves_do_not_depend_on_an_interval():
    controller, _, manager = make(10, checkpoint_interval=None)
    controller.train(20, checkpoint_at_completion=False)
    assert manager.saved == {}
    assert controller.save_checkpoint() == "ckpt-20"
    assert list(manager.saved) == [20]


def test_constructing_a_controller_restores_the_newest_checkpoint():
    controller, trainer, manager = make(10, 10)
    controller.train(30)
    trainer.global_step = 0
    again = Controller(trainer=trainer, steps_per_loop=10, checkpoint_manager=manager)
    assert again.global_step == 30 and trainer.global_step == 30


def test_eval_interval_is_exact_and_loops_are_cut_at_eval_boundaries():
    controller, trainer, _ = make(300, evaluator=True)
    controller.train_and_evaluate(train_steps=2000, eval_interval=1000)
    assert trainer.loops == [300, 300, 300, 100, 300, 300, 300, 100]
    assert controller.evaluator.evaluated_at == [1000, 2000]


def test_a_finished_run_restarted_runs_a_final_evaluation_it_never_ran():
    controller, trainer, manager = make(10, evaluator=True)
    controller.train(50)  # trained to the end, then stopped before evaluating
    restarted = Controller(trainer=trainer, evaluator=CountingEvaluator(trainer),
                           steps_per_loop=10, checkpoint_manager=manager)
    assert restarted.train_and_evaluate(train_steps=50) == {"accuracy": 0.5}
    assert restarted.evaluator.evaluated_at == [50]


def test_a_finished_run_restarted_returns_its_final_evaluation_without_repeating_it():
    controller, trainer, manager = make(10, evaluator=True)
    logs = controller.train_and_evaluate(train_steps=50)
    assert controller.evaluator.evaluated_at == [50]
    restarted = Controller(trainer=trainer, evaluator=CountingEvaluator(trainer),
                           steps_per_loop=10, checkpoint_manager=manager)
    # Orbit returns None here; the checkpoint saved after the evaluation kept its logs.
    assert restarted.train_and_evaluate(train_steps=50) == logs == {"accuracy": 0.5}
    assert restarted.evaluator.evaluated_at == []


def test_each_evaluation_records_its_step_and_checkpoint():
    controller, _, _ = make(10, 20, evaluator=True)
    seen = []

    class Spy(Callback):
        def on_eval_end(self, state, logs):
            seen.append(dict(state.extra["last_eval"]))

    controller.callbacks.append(Spy())
    controller.train(20)
    controller.evaluate()
    controller.train(25, checkpoint_at_completion=False)
    controller.evaluate()
    assert seen == [{"step": 20, "checkpoint": "ckpt-20"}, {"step": 25, "checkpoint": None}]


def test_hooks_fire_in_the_documented_order():
    controller, _, _ = make(10, 10, evaluator=True)
    calls = []

    class Order(Callback):
        pass

    for hook in ("on_train_begin", "on_loop_begin", "on_loop_end", "on_checkpoint_saved",
                 "on_eval_begin", "on_eval_end", "on_train_end"):
        setattr(Order, hook, lambda self, state, *args, hook=hook: calls.append(hook))
    controller.callbacks.append(Order())
    controller.train_and_evaluate(train_steps=20, eval_interval=10)
    assert calls == [
        "on_train_begin",
        "on_loop_begin", "on_loop_end", "on_eval_begin", "on_eval_end", "on_checkpoint_saved",
        "on_loop_begin", "on_loop_end", "on_eval_begin", "on_eval_end", "on_checkpoint_saved",
        "on_train_end",
    ]


def test_a_callback_can_stop_training_cleanly():
    controller, trainer, manager = make(10, evaluator=True)

    class StopAt30(Callback):
        def on_loop_end(self, state, logs):
            if state.global_step >= 30:
                state.request_stop("enough")

    controller.callbacks.append(StopAt30())
    controller.train_and_evaluate(train_steps=100, eval_interval=50)
    assert trainer.global_step == 30
    assert list(manager.saved) == [30]
    assert controller.evaluator.evaluated_at == [30]  # the final evaluation still runs


def test_sigterm_stops_saves_and_raises_preempted():
    class SelfTerminating(CountingTrainer):
        def train(self, num_steps):
            if self.global_step == 20:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().train(num_steps)

    trainer = SelfTerminating()
    manager = FakeCheckpointManager(trainer)
    controller = Controller(trainer=trainer, steps_per_loop=10, checkpoint_manager=manager)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted) as raised:
        controller.train(100)
    assert raised.value.code == 128 + signal.SIGTERM
    assert raised.value.checkpoint == "ckpt-30"
    assert list(manager.saved) == [30]
    assert signal.getsignal(signal.SIGTERM) is previous  # the handler is put back


def test_actions_get_the_raw_output_and_logs_get_rates():
    outputs, ends = [], []

    class Ends(Callback):
        def on_loop_end(self, state, logs):
            ends.append(logs)

    controller, _, _ = make(10, train_actions=[outputs.append], callbacks=[Ends()])
    controller.train(10)
    assert outputs == [{"loss": 0.1, "nested": {"value": 10.0}}]
    assert set(ends[0]) == {"loss", "nested", "steps_per_second"}


def test_orbit_summary_interval_records_in_step_summaries_and_every_loop_is_written(tmp_path):
    """Orbit: `summary_interval` decides which steps record the summaries made inside steps;
    the Controller writes each loop's outputs after every loop, and loops are not cut."""
    from cadence.core.summary import scalar

    class InStepSummaries(CountingTrainer):
        def train(self, num_steps):
            self.loops.append(num_steps)
            for _ in range(num_steps):
                self.global_step += 1
                scalar("in_step", float(self.global_step))
            return {"loss": 1.0 / self.global_step}

    trainer = InStepSummaries()
    controller = Controller(trainer=trainer, steps_per_loop=3, summary_dir=str(tmp_path),
                            summary_interval=5, writers=["jsonl"])
    controller.train(20)
    controller.close()
    assert trainer.loops == [3, 3, 3, 3, 3, 3, 2]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [3, 6, 9, 12, 15, 18, 20]
    assert [(r["step"], r["in_step"]) for r in records if "in_step" in r] == [
        (5, 5.0), (10, 10.0), (15, 15.0), (20, 20.0)]


def test_evaluate_continuously_evaluates_every_checkpoint_not_only_the_newest():
    controller, _, _ = make(10, 10, evaluator=True)
    controller.train(30)
    evaluated = []

    class Spy(Callback):
        def on_eval_end(self, state, logs):
            evaluated.append(state.extra["last_eval"]["checkpoint"])

    controller.callbacks.append(Spy())
    controller.evaluate_continuously(timeout=0)
    assert evaluated == ["ckpt-10", "ckpt-20", "ckpt-30"]
    assert controller.evaluator.evaluated_at == [10, 20, 30]


def test_orbit_evaluate_continuously_calls_timeout_fn_and_ends_when_it_returns_true():
    """Orbit's `timeout_fn`: called each time `timeout` seconds pass without a new checkpoint;
    False keeps waiting, True ends the evaluation loop."""
    controller, trainer, manager = make(10, 10, evaluator=True)
    controller.train(20)
    calls = []

    def timeout_fn():
        calls.append(sorted(manager.saved))
        if len(calls) == 1:  # the trainer writes one more checkpoint while we wait
            trainer.global_step = 30
            manager.save(30)
            return False
        return True

    logs = controller.evaluate_continuously(timeout=0, timeout_fn=timeout_fn, poll_interval=0)
    assert controller.evaluator.evaluated_at == [10, 20, 30]
    assert calls == [[10, 20], [10, 20, 30]]
    assert logs == {"accuracy": 0.5}
    with pytest.raises(TypeError, match="timeout_fn"):
        controller.evaluate_continuously(timeout=0, timeout_fn=True)


def test_a_wrong_step_count_is_reported(caplog):
    class CountsUpdates(CountingTrainer):  # a GAN that wrongly counts two updates per step
        def train(self, num_steps):
            return super().train(2 * num_steps)

    controller = Controller(trainer=CountsUpdates(), steps_per_loop=10)
    with caplog.at_level(logging.WARNING, logger="cadence"):
        controller.train(20)
    assert "advanced the global step by 20" in caplog.text


def test_a_trainer_that_does_not_count_steps_fails_instead_of_looping_forever():
    class Stuck(CountingTrainer):
        def train(self, num_steps):
            return {}

    with pytest.raises(RuntimeError, match="did not advance the global step"):
        Controller(trainer=Stuck(), steps_per_loop=10).train(20)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "trainer"),
        ({"trainer": CountingTrainer()}, ValueError, "steps_per_loop"),
        ({"trainer": CountingTrainer(), "steps_per_loop": 0}, ValueError, "steps_per_loop"),
        ({"trainer": CountingTrainer(), "steps_per_loop": 5, "summary_interval": 0},
         ValueError, "summary_interval"),
        ({"trainer": object(), "steps_per_loop": 5}, TypeError, "train"),
        ({"evaluator": object()}, TypeError, "evaluate"),
        ({"evaluator": type("E", (), {"evaluate": lambda s, n: {}})()}, TypeError, "global step"),
    ],
)
def test_bad_arguments_are_rejected_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        Controller(**kwargs)


def test_bad_call_arguments_are_rejected():
    controller, _, _ = make(10, evaluator=True)
    with pytest.raises(ValueError, match="non-negative"):
        controller.train(-1)
    with pytest.raises(ValueError, match="-1"):
        controller.evaluate(0)
    with pytest.raises(ValueError, match="eval_interval"):
        controller.train_and_evaluate(10, eval_interval=0)
    with pytest.raises(ValueError, match="no evaluator"):
        Controller(trainer=CountingTrainer(), steps_per_loop=1).evaluate()
    with pytest.raises(ValueError, match="checkpoint manager"):
        Controller(trainer=CountingTrainer(), steps_per_loop=1).save_checkpoint()
    with pytest.raises(ValueError, match="checkpoint manager"):
        Controller(trainer=CountingTrainer(), steps_per_loop=1).restore_checkpoint()
    trainer = CountingTrainer()
    with pytest.raises(ValueError, match="checkpoint manager"):
        Controller(evaluator=CountingEvaluator(trainer),
                   global_step=lambda: 0).evaluate_continuously(timeout=0)


def open_files_under(directory):
    """Paths under `directory` that this process holds open (Linux: /proc/self/fd)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            found.append(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_every_entry_point_closes_the_files_it_opened(tmp_path):
    controller, _, _ = make(5, evaluator=True, summary_dir=str(tmp_path / "train"),
                            eval_summary_dir=str(tmp_path / "eval"))
    controller.train(10)
    assert open_files_under(tmp_path) == []
    controller.evaluate()
    controller.train_and_evaluate(20, eval_interval=10)
    assert open_files_under(tmp_path) == []
    lines = (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4  # one per loop, across the reopened files
    evaluated = [json.loads(line)["step"]
                 for line in (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert evaluated == [10, 20]  # step 10 was evaluated already: not again


def test_injected_summary_managers_are_used_and_flushed_but_not_closed():
    class Manager:
        def __init__(self):
            self.writes, self.calls = [], []

        def write_summaries(self, logs, step=None, *, extra=None):
            self.writes.append((step, sorted(logs)))

        def flush(self):
            self.calls.append("flush")

        def close(self):
            self.calls.append("close")

        def as_default(self, record_if=None):
            import contextlib

            return contextlib.nullcontext()

    train, evaluation = Manager(), Manager()
    controller, _, _ = make(5, evaluator=True, summary_manager=train,
                            eval_summary_manager=evaluation)
    controller.train_and_evaluate(10, eval_interval=5)
    controller.close()
    assert [step for step, _ in train.writes] == [5, 10]
    assert evaluation.writes == [(5, ["accuracy"]), (10, ["accuracy"])]
    assert "close" not in train.calls + evaluation.calls and "flush" in train.calls


def test_orbit_controller_takes_injected_summary_manager_and_eval_summary_manager(tmp_path):
    """Orbit's `summary_manager` / `eval_summary_manager`: the Controller writes train and eval
    logs through the managers it is given -- here `SummaryManager`s with a writer of our own,
    through the `MetricWriter` protocol -- at the global step, nested logs as groups."""
    from cadence.core.summary import SummaryManager

    class Recorder:
        def __init__(self, directory):
            self.records = []
            written.setdefault(directory.name, self.records)

        def write(self, step, values, group=(), extra=None):
            self.records.append((step, group, sorted(values)))

        def flush(self):
            pass

        def close(self):
            pass

    written = {}
    train = SummaryManager(tmp_path / "train", writers=[Recorder])
    evaluation = SummaryManager(tmp_path / "eval", writers=[Recorder])
    controller, _, _ = make(5, evaluator=True, summary_manager=train,
                            eval_summary_manager=evaluation)
    assert controller.summary_manager is train and controller.eval_summary_manager is evaluation
    controller.train_and_evaluate(10, eval_interval=5)
    assert written["train"] == [(5, (), ["loss", "steps_per_second"]), (5, ("nested",), ["value"]),
                                (10, (), ["loss", "steps_per_second"]),
                                (10, ("nested",), ["value"])]
    assert written["eval"] == [(5, (), ["accuracy"]), (10, (), ["accuracy"])]


def test_an_evaluator_and_eval_actions_set_after_construction_are_the_ones_used():
    controller, trainer, _ = make(5)
    outputs = []
    controller.evaluator = CountingEvaluator(trainer)
    controller.eval_actions = (outputs.append,)
    controller.train(5)
    assert controller.evaluate() == {"accuracy": 0.5}
    assert outputs == [{"accuracy": 0.5}] and controller.evaluator.evaluated_at == [5]


def test_a_bare_controller_given_its_run_record_writes_the_timeline_and_its_resumes(tmp_path,
                                                                                   capsys):
    """A Controller of a user's own (Orbit's way) given the run's record: the attempt's
    timeline (``cadence goodput``) and where it resumed (``cadence plot``), and the run's lock
    while the record is open."""
    from cadence.core.run_dir import RunLock, RunLockedError
    from cadence.records.goodput import run_goodput
    from cadence.records.run_record import RunRecord
    from cadence.task.cli import main
    from cadence.writers.reading import read_run

    trainer = CountingTrainer()
    manager = FakeCheckpointManager(trainer, checkpoint_interval=10)
    with RunRecord(tmp_path) as record:
        with pytest.raises(RunLockedError):
            RunLock(tmp_path / "train.lock").acquire()
        Controller(trainer=trainer, steps_per_loop=5, checkpoint_manager=manager,
                   record=record).train(20)
    manager.trainer = again = CountingTrainer()  # a new process: restores ckpt-20
    with RunRecord(tmp_path) as record:
        controller = Controller(trainer=again, steps_per_loop=5, checkpoint_manager=manager,
                                record=record)
        assert controller.state.run_dir.root == tmp_path  # the record's, for the callbacks
        controller.train(40)
    report = run_goodput(tmp_path)
    assert [(a.end, a.first_step, a.last_step) for a in report.attempts] == [
        ("finished", 0, 20), ("finished", 20, 40)]
    assert report.steps == 40 and report.productive_s > 0
    assert [(r.step, r.reason, r.checkpoint) for r in read_run(tmp_path).resumes] == [
        (20, "resume", "ckpt-20")]
    assert main(["goodput", str(tmp_path)]) == 0
    assert "2 attempt(s), 40 steps kept" in capsys.readouterr().out
