"""`cadence plot` and the scalars it reads: two digits runs, one of them stopped and resumed;
the PNGs, the resume and best-export steps, the TensorBoard fallback, rewinds, bad input."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cadence
from cadence.core.errors import StopTraining
from cadence.core.run_dir import RunDirectory
from cadence.core.summary import SummaryManager
from cadence.task.cli import main
from cadence.task.config_files import load_config
from cadence.task.plot import (
    DPI,
    FIGSIZE,
    file_name,
    plot_runs,
    ranked_by_best,
    select_metrics,
    smoothed,
)
from cadence.task.train_lib import run_experiment
from cadence.writers.jsonl import JSONLWriter
from cadence.writers.reading import BestExport, Resume, Series, read_run

FAST = ["trainer.train_steps=40", "trainer.steps_per_loop=10", "trainer.checkpoint_interval=20",
        "trainer.validation_interval=20", "task.model.hidden_sizes=[16]"]
PIXELS = (int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI))


class StopAt(cadence.Callback):
    """Stops training once `step` is reached, as a preemption would (a checkpoint is saved)."""

    def __init__(self, step):
        self.step = step

    def on_loop_end(self, state, logs):
        if state.global_step >= self.step:
            raise StopTraining


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``straight``: 40 steps in one go; ``resumed``: stopped at step 20, then run again with
    the same config (a new Controller resumes from ckpt-20)."""
    root = tmp_path_factory.mktemp("runs")
    config = load_config("digits", overrides=FAST)
    run_experiment(config, "train_and_eval", root / "straight", progress_bar=False)
    run_experiment(config, "train_and_eval", root / "resumed", progress_bar=False,
                   callbacks=[StopAt(20)])
    assert not (root / "resumed" / "checkpoints" / "ckpt-40").exists()
    run_experiment(config, "train_and_eval", root / "resumed", progress_bar=False)
    return root / "straight", root / "resumed"


def ledger_best_step(run):
    return json.loads((run / "best" / "info.json").read_text())["exports"][0]["step"]


def read_png(path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    return image.shape[1], image.shape[0]  # width, height


# ---------------------------------------------------------------------------- the data


def test_a_resume_is_recorded_once_with_its_step_and_checkpoint(runs):
    straight, resumed = runs
    assert not RunDirectory(straight).resumes.exists()
    (record,) = [json.loads(line) for line in RunDirectory(resumed).resumes.read_text()
                 .splitlines()]
    assert record["step"] == 20 and record["reason"] == "resume"
    assert Path(record["checkpoint"]) == resumed / "checkpoints" / "ckpt-20"


def test_read_run_finds_the_curves_the_resume_and_the_best_export(runs):
    straight, resumed = runs
    run = read_run(resumed)
    assert run.source == "jsonl" and run.name == "resumed"
    assert run.resumes == (Resume(20, "resume", str(resumed / "checkpoints" / "ckpt-20")),)
    assert {"training_loss", "accuracy", "validation_loss", "learning_rate"} <= set(run.metrics)
    (loss,) = run.get("training_loss")
    assert loss.split == "train" and loss.is_train and loss.steps == (10, 20, 30, 40)
    splits = {s.split: s.steps for s in run.get("accuracy")}
    assert splits == {"train": (10, 20, 30, 40), "eval": (20, 40)}
    assert run.best is not None and run.best.metric == "accuracy"
    assert run.best.step == ledger_best_step(resumed)
    assert run.best.path == resumed / "best" / f"best-{run.best.step}"
    assert read_run(straight).resumes == ()


def test_without_json_lines_the_tensorboard_event_files_give_the_same_curves(runs, tmp_path):
    _, resumed = runs
    copy = tmp_path / "resumed"
    shutil.copytree(resumed, copy)
    for path in copy.rglob("metrics.jsonl"):
        path.unlink()
    from_events, from_jsonl = read_run(copy), read_run(resumed)
    assert from_events.source == "tensorboard"
    assert [(s.split, s.metric, s.steps) for s in from_events.series] == [
        (s.split, s.metric, s.steps) for s in from_jsonl.series]
    for a, b in zip(from_events.series, from_jsonl.series):  # event files hold float32
        assert a.values == pytest.approx(b.values, rel=1e-6)
    assert from_events.resumes == from_jsonl.resumes  # the record is the same file
    assert from_events.best is not None and from_jsonl.best is not None
    assert from_events.best.step == from_jsonl.best.step
    assert from_events.best.path == copy / "best" / from_jsonl.best.path.name


def test_rewinds_are_inferred_when_nothing_was_recorded_and_keep_what_tensorboard_keeps(
        tmp_path):
    writer = JSONLWriter(tmp_path)
    for step, loss in [(10, 1.0), (20, 0.9), (30, 0.8), (20, 0.7), (30, 0.6), (40, 0.5)]:
        writer.write(step, {"loss": loss}, group=("train",))
    for step, accuracy in [(20, 0.5), (40, 0.6), (40, 0.65)]:  # evaluated twice at step 40
        writer.write(step, {"accuracy": accuracy, "checkpoint": "ckpt"}, group=("eval",))
    writer.close()
    with (tmp_path / "train" / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 50, "loss": 0.')  # the process died mid-line
    run = read_run(tmp_path)
    (loss,) = run.get("loss")
    assert (loss.steps, loss.values) == ((10, 20, 30, 40), (1.0, 0.7, 0.6, 0.5))
    (accuracy,) = run.get("accuracy")
    assert (accuracy.steps, accuracy.values) == ((20, 40), (0.5, 0.65))
    assert run.resumes == (Resume(20, "rewind"),)
    RunDirectory(tmp_path).record_resume(10, "ckpt-10")  # a record is what counts
    assert read_run(tmp_path).resumes == (Resume(10, "resume", "ckpt-10"),)


def test_record_resume_refuses_a_bad_step_or_reason(tmp_path):
    run = RunDirectory(tmp_path)
    with pytest.raises(ValueError, match="`step` .* non-negative int"):
        run.record_resume(-1, None)
    with pytest.raises(ValueError, match="`reason` .* resume, recovery"):
        run.record_resume(3, None, reason="restart")
    assert not run.resumes.exists()


def test_read_run_refuses_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="must be a directory"):
        read_run(tmp_path / "file")


def test_select_metrics_takes_names_and_patterns_and_names_what_there_is(runs):
    data = [read_run(run) for run in runs]
    assert select_metrics(data, ["*loss", "accuracy"]) == [
        "training_loss", "validation_loss", "accuracy"]
    with pytest.raises(ValueError, match="'acc' matches no scalar .* there are: accuracy, "):
        select_metrics(data, ["acc"])


def test_a_csv_only_run_gives_the_curves_its_json_lines_would(tmp_path, capsys):
    run = tmp_path / "run"
    records = {"train": [(10, {"loss": 1.0, "learning_rate": 0.1}),
                         (20, {"loss": 0.5, "learning_rate": 0.05})],
               "eval": [(20, {"accuracy": 0.75, "per_class": {"cat": 0.5}})]}
    for split, logs_at in records.items():
        manager = SummaryManager(run / split, writers=["jsonl", "csv"])
        for step, logs in logs_at:
            manager.write_summaries(logs, step=step, extra={"checkpoint": f"ckpt-{step}"})
        manager.close()
    from_jsonl = read_run(run)
    for path in run.rglob("metrics.jsonl"):
        path.unlink()  # as a run with runtime.writers=[csv] leaves it
    from_csv = read_run(run)
    assert (from_jsonl.source, from_csv.source) == ("jsonl", "csv")
    assert from_csv.series == from_jsonl.series
    # The step, the wall time and the checkpoint's name are not scalars.
    assert from_csv.metrics == ["accuracy", "cat", "learning_rate", "loss"]
    assert main(["plot", str(run), "--out", str(tmp_path / "plots")]) == 0
    assert f"{run}: 4 scalars (csv), no resumes, no best export" in capsys.readouterr().err


def test_the_wall_time_of_every_record_is_not_a_scalar(runs):
    _, resumed = runs
    lines = (resumed / "train" / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line)["wall_time"] > 1.7e9 for line in lines)  # seconds since epoch
    assert "wall_time" not in read_run(resumed).metrics


def test_the_best_export_is_ranked_by_one_evaluation_curve():
    best = BestExport(40, "accuracy", 0.9, Path("best/best-40"))
    assert ranked_by_best(Series("eval", "accuracy", (40,), (0.9,)), best)
    assert not ranked_by_best(Series("train", "accuracy", (40,), (0.9,)), best)
    assert not ranked_by_best(Series("eval", "validation_loss", (40,), (0.1,)), best)
    assert not ranked_by_best(Series("eval/task_a", "accuracy", (40,), (0.9,)), best)
    nested = BestExport(40, "per_class/cat", 0.9, Path("best/best-40"))
    assert ranked_by_best(Series("eval/per_class", "cat", (40,), (0.9,)), nested)
    assert not ranked_by_best(Series("eval", "cat", (40,), (0.9,)), nested)


def test_smoothing_and_file_names():
    assert smoothed([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # debiased
    assert smoothed([1.0, 3.0], 0.0) == [1.0, 3.0]
    assert file_name("train/loss") == "train_loss.png"


# ---------------------------------------------------------------------------- the command


def test_plot_writes_one_valid_png_per_scalar_and_names_resumes_and_best(runs, tmp_path,
                                                                          capsys):
    straight, resumed = runs
    out = tmp_path / "plots"
    assert main(["plot", str(straight), str(resumed), "--out", str(out), "--smooth", "0.5"]) == 0
    captured = capsys.readouterr()
    written = [Path(line) for line in captured.out.splitlines()]
    names = read_run(resumed).metrics
    assert written == [out / file_name(name) for name in names]
    for path in written:
        assert read_png(path) == PIXELS
    assert f"{resumed}: {len(names)} scalars (jsonl), resume at step 20, best export at step " \
           f"{ledger_best_step(resumed)} (accuracy = " in captured.err
    assert f"{straight}: {len(names)} scalars (jsonl), no resumes, best export at step " \
           f"{ledger_best_step(straight)}" in captured.err


def test_plot_defaults_to_the_first_runs_plots_directory_and_filters_metrics(runs, capsys):
    straight, resumed = runs
    assert main(["plot", str(resumed), str(straight), "--metrics", "accuracy"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(resumed / "plots" / "accuracy.png")]
    assert read_run(resumed).metrics == read_run(straight).metrics  # plots/ is not a run's


def test_the_figures_draw_each_run_each_split_the_resume_and_the_best(runs, tmp_path,
                                                                      monkeypatch):
    from matplotlib.figure import Figure

    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: saved.append(self))
    plot_runs([read_run(run) for run in runs], tmp_path, ["accuracy"])
    (axes,) = saved[0].axes
    labels = axes.get_legend_handles_labels()[1]
    best = ledger_best_step(runs[1])
    assert labels == ["straight eval", f"straight best export (step {ledger_best_step(runs[0])})",
                      "straight train", "resumed eval", f"resumed best export (step {best})",
                      "resumed train", "resumed resumed"]
    resume_line = axes.get_lines()[-1]
    assert list(resume_line.get_xdata()) == [20, 20] and resume_line.get_linestyle() == ":"


def saved_axes(monkeypatch):
    """The axes of each figure `plot_runs` saves from now on, in order."""
    from matplotlib.figure import Figure

    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: saved.extend(self.axes))
    return saved


def stars(axes):
    return [line for line in axes.get_lines() if line.get_marker() == "*"]


def test_the_best_export_star_is_drawn_only_on_the_metric_it_was_ranked_by(runs, tmp_path,
                                                                          monkeypatch):
    saved = saved_axes(monkeypatch)
    run = read_run(runs[1])
    plot_runs([run], tmp_path, ["accuracy", "validation_loss"])
    accuracy, validation_loss = saved
    (star,) = stars(accuracy)
    assert run.best is not None and run.best.metric == "accuracy"
    assert list(star.get_xdata()) == [run.best.step]
    assert list(star.get_ydata()) == [pytest.approx(run.best.value)]
    assert stars(validation_loss) == []  # its best export is not the lowest validation loss


def test_a_log_scale_is_used_for_metrics_whose_values_are_all_positive(tmp_path, monkeypatch):
    writer = JSONLWriter(tmp_path / "run")
    for step, loss, margin in [(10, 100.0, -1.0), (20, 1.0, 0.5), (30, 0.01, 1.0)]:
        writer.write(step, {"loss": loss, "margin": margin}, group=("train",))
    writer.close()
    saved = saved_axes(monkeypatch)
    plot_runs([read_run(tmp_path / "run")], tmp_path / "plots", log_scale=True)
    loss, margin = saved
    assert (loss.get_yscale(), loss.get_title()) == ("log", "loss")
    assert (margin.get_yscale(), margin.get_title()) == (
        "linear", "margin (linear axis: values <= 0)")
    plot_runs([read_run(tmp_path / "run")], tmp_path / "plots")  # linear by default
    assert [axes.get_yscale() for axes in saved[2:]] == ["linear", "linear"]


def test_plot_answers_without_importing_torch_or_pyplot(runs, tmp_path):
    code = ("import sys; from cadence.task.cli import main; "
            f"status = main(['plot', {str(runs[0])!r}, '--out', {str(tmp_path)!r}]); "
            "print(status, sorted(m for m in ('torch', 'matplotlib.pyplot') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, check=True)
    assert result.stdout.splitlines()[-1] == "0 []"


def a_file(root):
    (root / "file").write_text("")
    return root / "file"


@pytest.mark.parametrize(("make", "message"), [
    (lambda root: root / "missing", "does not exist: pass run directories"),
    (a_file, "is a file"),
    (lambda root: root, "holds no scalars. Is it a run directory?"),
])
def test_bad_input_is_one_error_line_and_exit_status_2(tmp_path, capsys, make, message):
    assert main(["plot", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: ") and message in err and err.count("\n") == 1


def test_a_directory_of_runs_is_refused_naming_the_runs(runs, capsys):
    assert main(["plot", str(runs[0].parent)]) == 2
    err = capsys.readouterr().err
    assert "holds no scalars. It holds run directories (" in err and str(runs[1]) in err


def test_an_unknown_metric_and_a_bad_smoothing_weight_are_refused(runs, capsys):
    assert main(["plot", str(runs[0]), "--metrics", "nope"]) == 2
    assert capsys.readouterr().err.startswith("cadence: error: --metrics 'nope' matches no ")
    assert main(["plot", str(runs[0]), "--smooth", "1.5"]) == 2  # argparse's, as one line
    assert capsys.readouterr().err.startswith(
        "cadence: error: cadence plot: argument --smooth: 1.5 is not in [0, 1)")


def test_without_matplotlib_the_error_says_how_to_install_it(runs, tmp_path, capsys,
                                                             monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["plot", str(runs[0]), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cadence: error: plotting needs matplotlib")
    assert err.rstrip().endswith("pip install 'cadence[plot]'") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
