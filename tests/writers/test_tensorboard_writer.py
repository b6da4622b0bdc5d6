"""The ``tensorboard`` writer, read back with TensorBoard's own readers: the scalars (its
``EventAccumulator``) and the run's hyper-parameters with its final metrics and status, as
the HPARAMS tab gets them (the hparams plugin's own session-group handler)."""

import pytest
from tensorboard import context
from tensorboard.backend.event_processing import (
    data_provider,
    event_file_loader,
    plugin_event_multiplexer,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups, metadata

from cadence.core.errors import DivergenceError, Preempted
from cadence.core.summary import SummaryManager
from cadence.task.config_files import load_config
from cadence.task.train_lib import run_experiment

FAST = ["trainer.train_steps=40", "trainer.steps_per_loop=10", "trainer.checkpoint_interval=20",
        "trainer.validation_interval=20", "task.model.hidden_sizes=[16]"]


def scalars(directory):
    """``{tag: [(step, value), ...]}`` of a directory's event files, and the number of events
    that hold scalars."""
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, pytest.approx(e.value)) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def hparams_tab(logdir):
    """What TensorBoard's HPARAMS tab lists for `logdir`: ``{run: {"hparams", "metrics",
    "status"}}``, through the hparams plugin's own handler of its ``session_groups`` request."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    tb_context = base_plugin.TBContext(
        logdir=str(logdir), multiplexer=multiplexer,
        data_provider=data_provider.MultiplexerDataProvider(multiplexer, str(logdir)))
    request = api_pb2.ListSessionGroupsRequest(
        start_index=0, slice_size=100, allowed_statuses=list(api_pb2.Status.values()))
    response = list_session_groups.Handler(context.RequestContext(),
                                           backend_context.Context(tb_context), "",
                                           request).run()
    found = {}
    for group in response.session_groups:
        hparams = {name: getattr(value, value.WhichOneof("kind"))
                   for name, value in group.hparams.items()}
        for session in group.sessions:
            found[session.name] = {
                "hparams": hparams,
                "metrics": {f"{m.name.group}/{m.name.tag}": (m.training_step,
                                                              pytest.approx(m.value))
                            for m in session.metric_values},
                "status": api_pb2.Status.Name(session.status)}
    return found


def run_summaries(run_dir):
    return (SummaryManager(run_dir / "train", writers=["tensorboard"], run_dir=run_dir),
            SummaryManager(run_dir / "eval", writers=["tensorboard"], run_dir=run_dir))


def test_each_record_is_one_event_of_its_scalars_and_nested_logs_are_runs(tmp_path):
    manager = SummaryManager(tmp_path, writers=["tensorboard"])
    manager.write_summaries({"loss": 0.5, "lr": 0.1, "name": "text", "eval": {"accuracy": 0.75}},
                            step=10)
    manager.write_summaries({"loss": 0.25, "lr": 0.1}, step=20)
    manager.close()
    assert scalars(tmp_path) == {"loss": [(10, 0.5), (20, 0.25)], "lr": [(10, 0.1), (20, 0.1)]}
    assert scalars(tmp_path / "eval") == {"accuracy": [(10, 0.75)]}
    (path,) = tmp_path.glob("events.out.tfevents.*")
    events = list(event_file_loader.EventFileLoader(str(path)).Load())
    assert events[0].file_version == "brain.Event:2"
    # One event per record, its scalars together (the text is not TensorBoard's to show).
    assert [(e.step, [v.tag for v in e.summary.value]) for e in events[1:]] == [
        (10, ["loss", "lr"]), (20, ["loss", "lr"])]


def test_files_reopened_within_one_second_are_read_in_the_order_they_were_written(tmp_path):
    for step in range(10, 130, 10):  # a Controller reopens its files after each entry point
        manager = SummaryManager(tmp_path, writers=["tensorboard"])
        manager.write_summaries({"loss": 1.0 / step}, step=step)
        manager.close()
    assert [step for step, _ in scalars(tmp_path)["loss"]] == list(range(10, 130, 10))


def test_runs_of_a_folder_list_their_config_final_metrics_and_status_in_the_hparams_tab(
        tmp_path):
    runs = tmp_path / "runs"
    for name, learning_rate, error in (("a", 0.1, None), ("b", 0.01, DivergenceError("NaN"))):
        train, evaluation = run_summaries(runs / name)
        train.write_hparams({"optimizer": {"learning_rate": learning_rate},
                             "hidden_sizes": [32, 16], "init_checkpoint": None, "ema": True})
        train.write_summaries({"training_loss": 2.0}, step=10)
        train.write_summaries({"training_loss": 1.0}, step=20)
        evaluation.write_summaries({"accuracy": 0.5 + learning_rate}, step=20)
        train.close(error)
        evaluation.close(error)
    # The hparams session is in the run's root, next to train/ and eval/.
    root = EventAccumulator(str(runs / "a"))
    root.Reload()
    content = root.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(
        content[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["optimizer.learning_rate"].number_value == 0.1

    assert hparams_tab(runs) == {
        "a": {"hparams": {"optimizer.learning_rate": 0.1, "hidden_sizes": "[32, 16]",
                          "init_checkpoint": "None", "ema": True},
              "metrics": {"train/training_loss": (20, 1.0), "eval/accuracy": (20, 0.6)},
              "status": "STATUS_SUCCESS"},
        "b": {"hparams": {"optimizer.learning_rate": 0.01, "hidden_sizes": "[32, 16]",
                          "init_checkpoint": "None", "ema": True},
              "metrics": {"train/training_loss": (20, 1.0), "eval/accuracy": (20, 0.51)},
              "status": "STATUS_FAILURE"},
    }


def test_a_resumed_run_replaces_its_session_and_a_stopped_one_is_left_open(tmp_path):
    run = tmp_path / "run"
    train, _ = run_summaries(run)
    train.write_hparams({"train_steps": 40})
    train.write_summaries({"loss": 1.0}, step=20)
    train.close(Preempted(15, "ckpt-20"))
    assert hparams_tab(tmp_path)["run"]["status"] == "STATUS_UNKNOWN"  # not ended: it resumes

    resumed, _ = run_summaries(run)  # a new process, with a longer target
    resumed.write_hparams({"train_steps": 60})
    resumed.write_summaries({"loss": 0.5}, step=60)
    resumed.close()
    assert len(list(run.glob("events.out.tfevents.*.hparams"))) == 1
    tab = hparams_tab(tmp_path)["run"]
    assert tab["hparams"] == {"train_steps": 60} and tab["status"] == "STATUS_SUCCESS"
    assert tab["metrics"] == {"train/loss": (60, 0.5)}


def test_a_task_run_shows_its_final_config_and_metrics_in_the_hparams_tab(tmp_path):
    config = load_config("digits", overrides=FAST)
    _, logs = run_experiment(config, "train_and_eval", tmp_path / "digits-1",
                             progress_bar=False)
    tab = hparams_tab(tmp_path)["digits-1"]
    assert tab["status"] == "STATUS_SUCCESS"
    assert tab["hparams"]["trainer.train_steps"] == 40
    assert tab["hparams"]["task.model.hidden_sizes"] == "[16]"
    assert tab["hparams"]["trainer.optimizer_config.optimizer.name"] == "adamw"
    assert tab["metrics"]["eval/accuracy"] == (40, pytest.approx(logs["accuracy"]))
    assert tab["metrics"]["train/training_loss"][0] == 40
