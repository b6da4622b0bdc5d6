"""What the config reaches beyond the loop itself: early stopping, a time limit and the profiler
(``trainer.early_stopping``, ``trainer.time_limit``, ``runtime.profiler``), and the model
summary at the start of a run."""

import json
import logging

import pytest
import torch
from torch import nn

from cadence.callbacks.model_summary import count_parameters, summary_table
from cadence.engine.exporter import read_weights
from cadence.task.cli import main
from cadence.task.config_checks import duration_seconds
from cadence.task.config_files import load_config
from cadence.task.train_lib import run_experiment

FAST = ["trainer.steps_per_loop=10", "trainer.validation_interval=10",
        "trainer.checkpoint_interval=1000", "task.model.hidden_sizes=[16]",
        "trainer.optimizer_config.learning_rate.warmup_steps=0"]


def digits(*overrides):
    return load_config("digits", overrides=[*FAST, *overrides])


def sets(*overrides):
    return [arg for o in overrides for arg in ("--set", o)]


def eval_steps(run):
    lines = (run / "eval" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def test_early_stopping_set_on_the_command_line_stops_training_early(tmp_path):
    run = tmp_path / "run"
    # No later evaluation improves by 100: the second one is the first without improvement.
    argv = ["train", "-m", str(run), "--no-progress", *sets(
        *FAST, "trainer.train_steps=200", "trainer.early_stopping.monitor=validation_loss",
        "trainer.early_stopping.patience=1", "trainer.early_stopping.min_delta=100")]
    assert main(argv) == 0
    assert eval_steps(run) == [10, 20]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt-20"]
    state = load_config(config_files=[run / "params.yaml"]).trainer.early_stopping
    assert (state.monitor, state.patience, state.min_delta) == ("validation_loss", 1, 100)
    # Run again, it resumes with the checkpointed best and stops at its next evaluation.
    assert main(argv) == 0
    assert eval_steps(run) == [10, 20, 30]


def test_early_stopping_can_put_the_best_weights_back(tmp_path):
    """The best evaluation is not the last one -- "best" is the lowest accuracy here, the
    first evaluation's, while training improves it -- so that putting the best weights back
    changes the model: it ends with the best export's weights, not the last checkpoint's."""
    model, _ = run_experiment(digits(
        "trainer.train_steps=40", "trainer.early_stopping.monitor=accuracy",
        "trainer.early_stopping.mode=min", "trainer.early_stopping.patience=10",
        "trainer.early_stopping.restore_best=true", "trainer.best_checkpoint_eval_metric=accuracy",
        "trainer.best_checkpoint_metric_comp=lower"), "train_and_eval", tmp_path)
    records = [json.loads(line) for line in
               (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()]
    best_step = min(records, key=lambda r: r["accuracy"])["step"]
    assert best_step != records[-1]["step"] == 40  # the best is not the last evaluation
    ledger = json.loads((tmp_path / "best" / "info.json").read_text())
    assert ledger["exports"][0]["step"] == best_step
    best = read_weights(tmp_path / "best")  # the best export: the same metric, the same step
    last = read_weights(tmp_path / "checkpoints" / "ckpt-40")
    assert all(torch.equal(best[k], v) for k, v in model.state_dict().items())
    assert not all(torch.equal(last[k], v) for k, v in model.state_dict().items())


def test_a_time_limit_stops_training_and_saves_a_checkpoint(tmp_path, caplog):
    run = tmp_path / "run"
    argv = ["train", "-m", str(run), "--no-progress", "--mode", "train",
            *sets(*FAST, "trainer.train_steps=1000000", "trainer.checkpoint_interval=null",
                  "trainer.time_limit=00:00:01")]
    with caplog.at_level(logging.INFO, logger="cadence"):
        assert main(argv) == 0
    (saved,) = (run / "checkpoints").iterdir()
    assert 0 < int(saved.name.split("-")[1]) < 1000000
    assert "Time limit of 1s reached" in caplog.text
    # params.yaml keeps the string (unquoted YAML would read 00:00:01 as a number)
    assert load_config(config_files=[run / "params.yaml"]).trainer.time_limit == "00:00:01"


@pytest.mark.parametrize(("value", "seconds"), [
    (90, 90.0), (0.5, 0.5), ("00:01:30", 90.0), ("1:00:00:00", 86400.0), ("00:00:00", None),
    (0, None), (-5, None), (float("inf"), None), ("90m", None), ("1:30", None), (True, None),
])
def test_time_limits_are_seconds_or_hh_mm_ss(value, seconds):
    assert duration_seconds(value) == seconds


def test_the_profiler_writes_a_tensorboard_trace_into_the_run_directory(tmp_path):
    run_experiment(digits("trainer.train_steps=10", "runtime.profiler.enabled=true",
                          "runtime.profiler.wait=1", "runtime.profiler.warmup=1",
                          "runtime.profiler.active=2"), "train", tmp_path)
    (trace,) = (tmp_path / "profile").glob("*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#2", "ProfilerStep#3"}  # after 1 waiting and 1 warming up


def test_the_run_logs_a_model_summary_once_with_its_parameters(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="cadence"):
        run_experiment(digits("trainer.train_steps=20"), "train_and_eval", tmp_path)
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Model ")]
    # 64 inputs -> 16 hidden -> 10 classes: 64 * 16 + 16 + 16 * 10 + 10 = 1210 float32s
    assert len(summaries) == 1
    assert summaries[0].splitlines()[0] == ("Model Sequential: 1,210 parameters "
                                            "(1,210 trainable), 4.7 KiB")


def test_the_summary_counts_trainable_parameters_bytes_and_each_top_level_module():
    model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.ReLU(), nn.Linear(8, 2)))
    model[0].requires_grad_(False)
    model.half()
    assert count_parameters(model.parameters()) == (58, 18, 116, 0)
    lines = summary_table(model).splitlines()
    assert lines[0] == "Model Sequential: 58 parameters (18 trainable), 116 B"
    assert lines[2].split() == ["0", "Linear", "40", "0", "80", "B"]
    assert lines[3].split() == ["1", "Sequential", "18", "18", "36", "B"]


def test_the_summary_counts_a_shared_parameter_once_and_waits_for_lazy_ones():
    shared = nn.Linear(3, 3)
    model = nn.ModuleDict({"a": shared, "b": shared, "lazy": nn.LazyLinear(2)})
    first = summary_table(model).splitlines()[0]
    assert first == ("Model ModuleDict: 12 parameters (12 trainable), 48 B, and 2 "
                     "uninitialized (lazy) parameters")
