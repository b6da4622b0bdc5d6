"""A crash in the middle of appending leaves a last line without its newline. Every file cadence
appends lines to drops that fragment when it is opened again (`cadence.core.files.open_append`),
so the next record is a whole line; the reader skips a line that does not parse and reads on."""

import csv
import json

import pytest

from cadence.callbacks.monitors import JSONWriter
from cadence.core.callbacks import RunState
from cadence.core.files import drop_torn_line
from cadence.core.run_dir import RunDirectory
from cadence.core.summary import SummaryManager
from cadence.writers.csv import CSVWriter
from cadence.writers.reading import read_run

TORN = '{"step": 3, "loss": 0.'  # the process died in the middle of this line


def write_train_metrics(run, step):
    manager = SummaryManager(run.train, writers=["jsonl"])
    manager.write_summaries({"loss": 0.5}, step=step)
    manager.close()


def write_eval_metrics(run, step):
    manager = SummaryManager(run.eval, writers=["jsonl"])
    manager.write_summaries({"accuracy": 0.75}, step=step,
                            extra={"checkpoint": f"ckpt-{step}"})
    manager.close()


def write_stats(run, step):
    monitor = JSONWriter(run.root)
    state = RunState(global_step=step, epoch=step)
    monitor.on_loop_end(state, {"loss": 0.5})
    monitor.on_train_end(state)


def write_resume(run, step):
    run.record_resume(step, str(run.checkpoints / f"ckpt-{step}"))


KINDS = {  # file kind: (its path in the run, a write of one record at a step)
    "train metrics.jsonl": (lambda run: run.train / "metrics.jsonl", write_train_metrics),
    "eval metrics.jsonl": (lambda run: run.eval / "metrics.jsonl", write_eval_metrics),
    "stats.jsonl": (lambda run: run.stats, write_stats),
    "resumes.jsonl": (lambda run: run.resumes, write_resume),
}
STEP_KEY = {"stats.jsonl": "global_step"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_record_appended_after_a_torn_line_reads_back_whole(kind, tmp_path):
    run = RunDirectory(tmp_path)
    path_of, write = KINDS[kind]
    path = path_of(run)
    write(run, 1)
    write(run, 2)
    with open(path, "a") as handle:
        handle.write(TORN)
    write(run, 3)  # a new process, resuming from the checkpoint of step 2
    lines = path.read_text().splitlines()
    step = STEP_KEY.get(kind, "step")
    assert [json.loads(line)[step] for line in lines] == [1, 2, 3]  # earlier ones intact
    assert path.read_text().endswith("\n")


def test_a_csv_row_appended_after_a_torn_line_reads_back_whole(tmp_path):
    writer = CSVWriter(tmp_path)
    writer.write(1, {"loss": 1.0})
    writer.close()
    with open(tmp_path / "metrics.csv", "a") as table:
        table.write("2,0.")
    writer = CSVWriter(tmp_path)
    writer.write(3, {"loss": 0.25})
    writer.close()
    with open(tmp_path / "metrics.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["step", "wall_time", "loss"]
    assert [(step, loss) for step, _, loss in rows[1:]] == [("1", "1.0"), ("3", "0.25")]


def test_a_file_that_ends_with_a_newline_or_is_empty_is_left_as_it_is(tmp_path):
    whole, empty = tmp_path / "whole.jsonl", tmp_path / "empty.jsonl"
    whole.write_text('{"step": 1}\n')
    empty.write_text("")
    assert drop_torn_line(whole) == drop_torn_line(empty) == 0
    assert whole.read_text() == '{"step": 1}\n' and empty.read_text() == ""
    single = tmp_path / "single.jsonl"  # one line, cut short: nothing is left of it
    single.write_text(TORN)
    assert drop_torn_line(single) == len(TORN) and single.read_text() == ""


def test_the_reader_skips_a_torn_line_and_keeps_every_whole_record(tmp_path, caplog):
    run = RunDirectory(tmp_path)
    run.train.mkdir(parents=True)
    run.eval.mkdir()
    # As an older cadence left them: a record glued to the fragment a crash left, and a
    # fragment at the end.
    (run.train / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 1.0}\n'
        '{"step": 2, "loss": 0.{"step": 2, "loss": 0.5}\n'
        '{"step": 3, "loss": 0.25}\n'
        '{"step": 4, "lo')
    (run.eval / "metrics.jsonl").write_text(
        '{"step": 2, "accuracy": 0.5}\n{"step"\n{"step": 3, "accuracy": 0.75}\n')
    (run.resumes).write_text('{"step": 1, "checkpoint": null, "reason": "resume", "ti'
                             '{"step": 2, "checkpoint": null, "reason": "resume"}\n')
    scalars = read_run(tmp_path)
    (loss,) = scalars.get("loss")
    assert (loss.steps, loss.values) == ((1, 2, 3), (1.0, 0.5, 0.25))
    (accuracy,) = scalars.get("accuracy")
    assert (accuracy.steps, accuracy.values) == ((2, 3), (0.5, 0.75))
    assert [r.step for r in scalars.resumes] == [2]
    assert "Skipped 2 unreadable line(s)" in caplog.text
