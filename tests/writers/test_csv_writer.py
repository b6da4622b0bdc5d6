"""The ``csv`` writer: one wide table per summary directory -- a step column, then a column per
name -- as spreadsheets and ``pandas.read_csv`` expect. Read back with the ``csv`` module."""

import csv
import time

from cadence.core.summary import SummaryManager
from cadence.writers.csv import CSVWriter


def read_table(path):
    """The table's columns and rows, less its ``wall_time`` column (the second), whose cells
    must be when the rows were written: seconds since the epoch, in the last minute."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    columns = list(reader.fieldnames)
    assert columns[1] == "wall_time"
    now = time.time()
    for row in rows:
        assert now - 60 < float(row.pop("wall_time")) <= now + 0.001  # to the millisecond
    return [c for c in columns if c != "wall_time"], rows


def test_each_directory_of_nested_logs_gets_a_table_of_step_and_scalars(tmp_path):
    manager = SummaryManager(tmp_path, writers=["csv"])
    manager.write_summaries({"loss": 0.5, "eval": {"accuracy": 0.75}}, step=10)
    manager.write_summaries({"loss": 0.25, "eval": {"accuracy": 1.0}}, step=20)
    manager.close()
    assert read_table(tmp_path / "metrics.csv") == (
        ["step", "loss"], [{"step": "10", "loss": "0.5"}, {"step": "20", "loss": "0.25"}])
    assert read_table(tmp_path / "eval" / "metrics.csv") == (
        ["step", "accuracy"],
        [{"step": "10", "accuracy": "0.75"}, {"step": "20", "accuracy": "1.0"}])
    assert not list(tmp_path.glob("events.out.tfevents.*"))  # only the writers asked for


def test_a_name_that_appears_later_adds_a_column_and_earlier_rows_keep_their_cells(tmp_path):
    writer = CSVWriter(tmp_path)
    writer.write(1, {"loss": 3.0})
    writer.write(2, {"loss": 2.0, "learning_rate": 0.1})
    writer.write(3, {"learning_rate": 0.05})
    writer.close()
    columns, rows = read_table(tmp_path / "metrics.csv")
    assert columns == ["step", "loss", "learning_rate"]
    assert [(r["step"], r["loss"], r["learning_rate"]) for r in rows] == [
        ("1", "3.0", ""), ("2", "2.0", "0.1"), ("3", "", "0.05")]
    assert not list(tmp_path.glob(".*.tmp"))  # the wider table replaced the old one whole


def test_the_record_extra_fields_are_columns_and_values_that_are_not_numbers_are_left_out(
        tmp_path):
    writer = CSVWriter(tmp_path)
    writer.write(20, {"accuracy": 0.9, "confusion": [[1, 0], [0, 1]], "flag": True, "name": "x"},
                 extra={"checkpoint": "ckpt-20"})
    writer.write(40, {"accuracy": 0.95}, extra={"checkpoint": None})
    writer.close()
    assert read_table(tmp_path / "metrics.csv") == (
        ["step", "checkpoint", "accuracy"],
        [{"step": "20", "checkpoint": "ckpt-20", "accuracy": "0.9"},
         {"step": "40", "checkpoint": "", "accuracy": "0.95"}])


def test_floats_keep_full_precision_and_nan_reads_back_as_nan(tmp_path):
    writer = CSVWriter(tmp_path)
    writer.write(1, {"x": 0.1 + 0.2, "y": float("nan"), "z": float("inf")})
    writer.close()
    (row,) = read_table(tmp_path / "metrics.csv")[1]
    assert float(row["x"]) == 0.1 + 0.2
    assert row["y"] == "nan" and row["z"] == "inf"  # what float() and pandas read


def test_a_resumed_run_appends_under_the_header_it_finds_and_drops_a_line_cut_by_a_crash(
        tmp_path):
    first = CSVWriter(tmp_path)
    first.write(10, {"loss": 1.0, "accuracy": 0.5})
    first.close()
    with open(tmp_path / "metrics.csv", "a") as table:
        table.write("20,0.9")  # the process died in the middle of a line
    resumed = CSVWriter(tmp_path)  # a new process, resuming from the checkpoint of step 10
    resumed.write(20, {"accuracy": 0.6, "loss": 0.8})
    resumed.close()
    assert read_table(tmp_path / "metrics.csv") == (
        ["step", "loss", "accuracy"],
        [{"step": "10", "loss": "1.0", "accuracy": "0.5"},
         {"step": "20", "loss": "0.8", "accuracy": "0.6"}])
