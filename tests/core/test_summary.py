import ast
import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import cadence
from cadence.core.scope import push_scope
from cadence.core.summary import SummaryManager, closing_summaries, scalar


def read_scalars(directory):
    accumulator = EventAccumulator(str(directory))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def test_nested_logs_become_subdirectories_that_tensorboard_reads(tmp_path):
    manager = SummaryManager(tmp_path)
    manager.write_summaries({"loss": 0.5, "eval": {"accuracy": 0.75, "deep": {"x": 1}}}, step=10)
    manager.write_summaries({"loss": 0.25, "eval": {"accuracy": 1.0, "deep": {"x": 2}}}, step=20)
    manager.close()
    assert read_scalars(tmp_path) == {"loss": [(10, 0.5), (20, 0.25)]}
    assert read_scalars(tmp_path / "eval") == {"accuracy": [(10, 0.75), (20, 1.0)]}
    assert read_scalars(tmp_path / "eval" / "deep") == {"x": [(10, 1.0), (20, 2.0)]}
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r.pop("wall_time") > 1.7e9 for r in records] == [True, True]  # seconds since epoch
    assert records == [{"step": 10, "loss": 0.5}, {"step": 20, "loss": 0.25}]


def test_tensors_and_numpy_values_are_written_as_numbers(tmp_path):
    np = pytest.importorskip("numpy")
    manager = SummaryManager(tmp_path)
    manager.write_summaries({"a": np.float32(1.5), "b": np.array(2.0)}, step=1,
                            extra={"checkpoint": "ckpt-1"})
    manager.close()
    assert read_scalars(tmp_path) == {"a": [(1, 1.5)], "b": [(1, 2.0)]}
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert list(record)[:2] == ["step", "wall_time"] and record.pop("wall_time") > 1.7e9
    assert record == {"step": 1, "checkpoint": "ckpt-1", "a": 1.5, "b": 2.0}


def test_only_rank_zero_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    manager = SummaryManager(tmp_path / "s")
    manager.write_summaries({"loss": 1.0}, step=1)
    manager.close()
    assert not (tmp_path / "s").exists()


def test_no_directory_makes_everything_a_no_op():
    manager = SummaryManager(None)
    manager.write_summaries({"loss": 1.0}, step=1)
    with manager.as_default():
        assert scalar("x", 1.0, step=1) is False


def test_in_step_scalars_are_prefixed_by_the_name_scope_and_follow_record_if(tmp_path):
    steps = iter(range(1, 5))
    manager = SummaryManager(tmp_path, global_step=lambda: next(steps))
    with manager.as_default(record_if=lambda step: step % 2 == 0):
        with push_scope("trainer"), push_scope("encoder"):
            recorded = [scalar("norm", float(i)) for i in range(4)]
    manager.close()
    assert recorded == [False, True, False, True]
    assert read_scalars(tmp_path) == {"trainer/encoder/norm": [(2, 1.0), (4, 3.0)]}


def test_write_without_a_step_names_the_fix(tmp_path):
    with pytest.raises(ValueError, match="global_step"):
        SummaryManager(tmp_path).write_summaries({"loss": 1.0})


def test_tensorboard_is_imported_when_a_writing_manager_or_loop_is_built_not_before(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys, cadence\n"
        "from cadence.core.summary import SummaryManager\n"
        "writer = 'tensorboard.summary.writer.record_writer'\n"
        "SummaryManager(None)\n"
        "print(writer in sys.modules)\n"
        f"SummaryManager({str(tmp_path / 'a')!r})\n"
        "print(writer in sys.modules)\n"
    )
    loop_code = (
        "import sys, torch, cadence\n"
        f"cadence.TrainLoop(torch.nn.Linear(1, 1), summary_dir={str(tmp_path / 'b')!r})\n"
        "print('tensorboard.summary.writer.record_writer' in sys.modules)\n"
    )
    outputs = [subprocess.run([sys.executable, "-c", c], capture_output=True, text=True,
                              timeout=120, check=True).stdout.split() for c in (code, loop_code)]
    assert outputs == [["False", "True"], ["True"]]
    assert not (tmp_path / "a").exists()  # built, not written: no files yet


class ListWriter:
    """A metric writer that keeps what it is given (any backend plugs in the same way)."""

    def __init__(self, directory):
        self.directory, self.records, self.closed = directory, [], False

    def write(self, step, values, group=(), extra=None):
        self.records.append((step, group, dict(values), extra))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_any_backend_plugs_in_as_a_writer_and_gets_one_call_per_group(tmp_path):
    built = []
    manager = SummaryManager(tmp_path, writers=[lambda d: built.append(ListWriter(d)) or built[-1]])
    manager.write_summaries({"loss": 0.5, "eval": {"accuracy": 0.75}}, step=3,
                            extra={"checkpoint": "ckpt-3"})
    manager.close()
    (writer,) = built
    assert writer.directory == tmp_path and writer.closed
    assert writer.records == [(3, (), {"loss": 0.5}, {"checkpoint": "ckpt-3"}),
                              (3, ("eval",), {"accuracy": 0.75}, None)]
    assert not tmp_path.joinpath("metrics.jsonl").exists()  # only the writers asked for


def test_an_unknown_writer_is_named_with_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="Unknown metric writer 'tensorbord'; known: "
                                         "tensorboard, jsonl"):
        SummaryManager(tmp_path, writers=["tensorbord"])


def test_a_closed_manager_writes_again_to_new_files(tmp_path):
    manager = SummaryManager(tmp_path)
    manager.write_summaries({"loss": 1.0}, step=1)
    manager.close()
    manager.write_summaries({"loss": 2.0}, step=2)
    manager.close()
    assert read_scalars(tmp_path) == {"loss": [(1, 1.0), (2, 2.0)]}
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


# ---------------------------------------------------------------------------- issue 30, item 4:
# the writers are closed with the run's outcome in one place


class RecordingManager:
    """A summary manager that records how it was ended."""

    def __init__(self):
        self.calls = []

    def close(self, error=None):
        self.calls.append(("close", error))

    def flush(self):
        self.calls.append(("flush",))


def test_closing_summaries_closes_its_own_with_the_error_raised_and_flushes_the_injected():
    own, injected = RecordingManager(), RecordingManager()
    with pytest.raises(RuntimeError) as raised:
        with closing_summaries(close=[own, own], flush=[injected, own]):
            raise RuntimeError("a bug")
    # listed twice (train and eval of one directory): ended once, the first way it is listed
    assert own.calls == [("close", raised.value)]
    assert injected.calls == [("flush",)]


def test_closing_summaries_keeps_the_exception_of_an_exit_unless_the_block_raises_another():
    leaving, raised_here = KeyboardInterrupt("the user's block"), RuntimeError("a failed save")
    kept = RecordingManager()
    with closing_summaries(close=[kept], error=leaving):
        pass
    replaced = RecordingManager()
    with pytest.raises(RuntimeError), closing_summaries(close=[replaced], error=leaving):
        raise raised_here
    completed = RecordingManager()
    with closing_summaries(close=[completed]):
        pass
    assert kept.calls == [("close", leaving)]
    assert replaced.calls == [("close", raised_here)]
    assert completed.calls == [("close", None)]


def test_close_summaries_is_the_only_code_that_closes_a_summary_manager_with_an_outcome():
    """Every front-end (the Controller's entry points, `run_experiment`, `TrainLoop`, the
    `TFEventWriter` monitor) ends its summaries through `close_summaries`: no other code calls
    ``close`` with an argument (``os.close(fd)`` aside) or ``set_outcome``."""
    package = Path(cadence.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name, owner = node.func.attr, ast.unparse(node.func.value)
            if ((name == "close" and (node.args or node.keywords) and owner != "os")
                    or name == "set_outcome"):
                found.append(f"{path.relative_to(package)}: {ast.unparse(node)}")
    assert found == ["core/summary.py: manager.close(error)",
                     "core/summary.py: writer.set_outcome(error)"]


def test_a_manager_that_another_job_writes_for_writes_nothing(tmp_path):
    """Replica groups evaluate alike: the group that writes the checkpoints writes the
    evaluations (`writes`), asked at each write."""
    turn = {"writes": False}
    manager = SummaryManager(tmp_path, lambda: 1, writers=["jsonl"],
                             writes=lambda: turn["writes"])
    manager.write_summaries({"accuracy": 0.5}, step=10)
    manager.flush()
    assert not (tmp_path / "metrics.jsonl").exists()
    turn["writes"] = True
    manager.write_summaries({"accuracy": 0.6}, step=20)
    manager.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [20]
