"""Evaluating a step again replaces its records in the evaluation directory instead of
repeating them: in ``metrics.jsonl``, ``metrics.csv`` and TensorBoard's event files, read back
with the files themselves, TensorBoard's ``EventAccumulator`` and cadence's own reader. The
training directory is never rewritten."""

import csv
import json
import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cadence.core.controller import Controller
from cadence.task.config_files import load_config
from cadence.task.train_lib import run_experiment
from cadence.writers.reading import read_run


class Evaluations:
    """An evaluator at a settable step whose n-th evaluation has accuracy n."""

    def __init__(self):
        self.global_step, self.calls = 0, 0

    def evaluate(self, num_steps):
        self.calls += 1
        return {"accuracy": float(self.calls), "top": {"k5": 10.0 * self.calls}}


def evaluate_at(run, evaluator, steps):
    for step in steps:  # one entry point each: the writers are closed and built again
        evaluator.global_step = step
        Controller(evaluator=evaluator, summary_dir=str(run / "train"),
                   eval_summary_dir=str(run / "eval"),
                   writers=["tensorboard", "jsonl", "csv"]).evaluate(1)


def jsonl_points(path, key="accuracy"):
    return [(r["step"], r[key]) for r in map(json.loads, path.read_text().splitlines())]


def csv_points(path, key="accuracy"):
    with open(path, newline="") as handle:
        return [(int(r["step"]), float(r[key])) for r in csv.DictReader(handle)]


def tensorboard_points(directory, tag="accuracy"):
    accumulator = EventAccumulator(str(directory))  # TensorBoard's defaults
    accumulator.Reload()
    return sorted((e.step, e.value) for e in accumulator.Scalars(tag))


def test_a_step_evaluated_again_holds_the_new_evaluation_alone_and_later_steps_stay(tmp_path):
    evaluate_at(tmp_path, Evaluations(), [10, 20, 30, 10, 20, 20])  # accuracy 1..6
    expected = [(10, 4.0), (20, 6.0), (30, 3.0)]
    evaluations = tmp_path / "eval"
    assert sorted(jsonl_points(evaluations / "metrics.jsonl")) == expected
    assert sorted(csv_points(evaluations / "metrics.csv")) == expected
    assert tensorboard_points(evaluations) == expected
    # a nested group (a sub-directory) is replaced the same way
    assert sorted(jsonl_points(evaluations / "top" / "metrics.jsonl", "k5")) == [
        (10, 40.0), (20, 60.0), (30, 30.0)]
    assert tensorboard_points(evaluations / "top", "k5") == [(10, 40.0), (20, 60.0), (30, 30.0)]
    (series,) = read_run(tmp_path).get("accuracy")
    assert list(zip(series.steps, series.values)) == expected


def test_records_written_in_one_session_all_stay(tmp_path):
    """Only what earlier writers left is replaced: two writes at one step by one manager
    (an evaluation's logs and in-step summaries, say) are both kept."""
    from cadence.core.summary import SummaryManager

    manager = SummaryManager(tmp_path, writers=["jsonl", "csv"], replace_steps=True)
    manager.write_summaries({"accuracy": 1.0}, step=10)
    manager.write_summaries({"accuracy": 2.0}, step=10)
    manager.close()
    assert jsonl_points(tmp_path / "metrics.jsonl") == [(10, 1.0), (10, 2.0)]
    assert csv_points(tmp_path / "metrics.csv") == [(10, 1.0), (10, 2.0)]


FAST = ["trainer.train_steps=40", "trainer.steps_per_loop=10", "trainer.checkpoint_interval=20",
        "trainer.validation_interval=20", "task.model.hidden_sizes=[16]",
        "runtime.writers=[tensorboard,jsonl,csv]"]


def test_cadence_eval_adds_records_that_name_their_weights_and_training_s_stay(tmp_path):
    """An evaluation job never rewrites what training recorded (the records that chose the best
    export among them): each of its evaluations is a record of its own, naming its weights."""
    config = load_config("digits", overrides=FAST)
    run = tmp_path / "run"
    run_experiment(config, "train_and_eval", run, progress_bar=False)  # evaluates 20 and 40
    train_before = {p.name: p.read_bytes() for p in (run / "train").iterdir() if p.is_file()}
    training = (run / "eval" / "metrics.jsonl").read_text().splitlines()
    ckpt_20 = str(run / "checkpoints" / "ckpt-20")
    run_experiment(config, "eval", run, checkpoint=ckpt_20)
    _, logs = run_experiment(config, "eval", run, checkpoint=ckpt_20)

    lines = (run / "eval" / "metrics.jsonl").read_text().splitlines()
    assert lines[:2] == training  # as training wrote them, byte for byte
    added = [json.loads(line) for line in lines[2:]]
    assert [(r["step"], r["checkpoint"]) for r in added] == [(20, ckpt_20)] * 2
    assert added[-1]["accuracy"] == logs["accuracy"] == json.loads(training[0])["accuracy"]
    with open(run / "eval" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows] == [20, 40, 20, 20]
    accumulator = EventAccumulator(str(run / "eval"))
    accumulator.Reload()
    assert sorted(e.step for e in accumulator.Scalars("accuracy")) == [20, 20, 20, 40]
    # the training directory is never rewritten
    assert {p.name: p.read_bytes() for p in (run / "train").iterdir()
            if p.is_file()} == train_before


def test_training_resumed_before_a_step_it_evaluated_replaces_that_step_s_records(tmp_path):
    """A run resumed from a checkpoint before a step it had evaluated makes that step again:
    its new evaluation replaces the record of the abandoned continuation."""
    import shutil

    config = load_config("digits", overrides=FAST)
    run = tmp_path / "run"
    run_experiment(config, "train_and_eval", run, progress_bar=False)
    shutil.rmtree(run / "checkpoints" / "ckpt-40")  # as if it died before committing step 40
    resumed = time.time()
    run_experiment(config, "train_and_eval", run, progress_bar=False)
    records = [json.loads(line) for line in (run / "eval" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [20, 40]
    assert records[1]["wall_time"] >= round(resumed, 3) - 0.001  # the resumed run's
