"""run_experiment: every mode, resuming, the saved config, and the loss guard."""

import json
import math
from dataclasses import dataclass

import pytest
import torch

import cadence
from cadence.engine.exporter import read_weights
from cadence.task.config_files import load_config
from cadence.task.experiments.digits import DigitsTask, DigitsTaskConfig
from cadence.task.registry import register_task
from cadence.task.train_lib import in_config_terms, run_experiment

FAST = ["trainer.train_steps=40", "trainer.steps_per_loop=10", "trainer.checkpoint_interval=20",
        "trainer.validation_interval=20", "task.model.hidden_sizes=[32]",
        "trainer.optimizer_config.learning_rate.warmup_steps=0"]


def digits(*overrides):
    return load_config("digits", overrides=[*FAST, *overrides])


def eval_records(model_dir):
    lines = (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_the_default_experiment_reaches_95_percent_validation_accuracy(tmp_path):
    _, logs = run_experiment(load_config("digits"), "train_and_eval", tmp_path)
    assert logs["accuracy"] >= 0.95
    assert logs["best_accuracy"] >= logs["accuracy"]
    assert list((tmp_path / "train").glob("events.out.tfevents.*"))
    assert list((tmp_path / "eval").glob("events.out.tfevents.*"))
    ledger = json.loads((tmp_path / "best" / "info.json").read_text())
    assert ledger["exports"][0]["value"] == logs["best_accuracy"]


def test_train_and_eval_writes_config_checkpoints_summaries_and_the_best_export(tmp_path):
    model, logs = run_experiment(digits(), "train_and_eval", tmp_path)
    assert isinstance(model, torch.nn.Module)
    assert {"accuracy", "validation_loss", "best_accuracy"} <= set(logs)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-20", "ckpt-40"]
    assert [r["step"] for r in eval_records(tmp_path)] == [20, 40]
    assert load_config(config_files=[tmp_path / "params.yaml"]) == digits()
    best = json.loads((tmp_path / "best" / "info.json").read_text())["exports"][0]
    assert best["value"] == logs["best_accuracy"]
    weights = read_weights(tmp_path / "best")
    assert set(weights) == set(model.state_dict())


def test_train_then_eval_and_continuous_eval_read_the_checkpoints(tmp_path):
    run = tmp_path / "run"  # beside the reference run: a run never holds another
    _, in_memory = run_experiment(digits(), "train_and_post_eval", tmp_path / "reference")
    run_experiment(digits(), "train", run)
    assert not (run / "eval").exists()
    _, logs = run_experiment(digits(), "eval", run)
    assert logs["accuracy"] == in_memory["accuracy"] > 0.5  # the restored weights were used
    assert eval_records(run)[-1]["step"] == 40
    _, logs = run_experiment(digits(), "continuous_eval", run)
    # every checkpoint; each evaluation a record of its own, naming the checkpoint it read
    assert [(r["step"], r["checkpoint"]) for r in eval_records(run)] == [
        (40, str(run / "checkpoints" / "ckpt-40")), (20, str(run / "checkpoints" / "ckpt-20")),
        (40, str(run / "checkpoints" / "ckpt-40"))]
    assert [r["step"] for r in eval_records(tmp_path / "reference")] == [40]  # once, at the end


def test_running_again_resumes_and_a_longer_target_continues(tmp_path):
    run_experiment(digits(), "train", tmp_path)
    manifest = tmp_path / "checkpoints" / "ckpt-40" / "manifest.json"
    written = manifest.stat().st_mtime_ns
    run_experiment(digits(), "train", tmp_path)  # finished: nothing to do
    assert manifest.stat().st_mtime_ns == written
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-20", "ckpt-40"]
    config = digits("trainer.train_steps=60")
    run_experiment(config, "train", tmp_path, allow_config_change=True)
    assert (tmp_path / "checkpoints" / "ckpt-60").is_dir()
    assert list(tmp_path.glob("params.*.yaml"))  # the old config is kept beside the new one


@pytest.mark.parametrize("mode", ["train_and_eval", "train_and_post_eval"])
def test_a_finished_run_run_again_returns_its_final_evaluation_without_repeating_it(
        mode, tmp_path):
    _, first = run_experiment(digits(), mode, tmp_path)
    records = eval_records(tmp_path)
    _, again = run_experiment(digits(), mode, tmp_path)  # finished: nothing to train
    assert again == first and again["accuracy"] > 0.5  # keys and values, as TFM users expect
    assert eval_records(tmp_path) == records  # evaluated once, recorded once
    assert not (tmp_path / "resumes.jsonl").exists()  # nothing continued


STATEFUL_LOADER = pytest.param(
    ["task.train_data.stateful_loader=true"], id="stateful_loader",
    marks=pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"))  # torchdata's


@pytest.mark.parametrize("loader", [pytest.param([], id="dataloader"), STATEFUL_LOADER])
def test_an_interrupted_run_resumes_to_the_same_weights(tmp_path, loader):
    if loader:
        pytest.importorskip("torchdata.stateful_dataloader")

    def digits(*overrides):
        return load_config("digits", overrides=[*FAST, *loader, *overrides])

    run_experiment(digits(), "train", tmp_path / "straight")

    class StopAt(cadence.Callback):
        def on_loop_end(self, state, logs):
            if state.global_step == 30:
                state.request_stop("test")

    run_experiment(digits(), "train", tmp_path / "stopped", callbacks=[StopAt()])
    assert (tmp_path / "stopped" / "checkpoints" / "ckpt-30").is_dir()

    class FirstStep(cadence.Callback):
        begun: list[int] = []

        def on_train_begin(self, state):
            FirstStep.begun.append(state.global_step)

    # The same seed as the straight run: only the checkpoint makes it go on from step 30.
    run_experiment(digits(), "train", tmp_path / "stopped", callbacks=[FirstStep()])
    assert FirstStep.begun == [30]
    for key, value in read_weights(tmp_path / "straight" / "checkpoints").items():
        torch.testing.assert_close(read_weights(tmp_path / "stopped" / "checkpoints")[key], value,
                                   rtol=0, atol=0)


def test_tfm_run_experiment_locks_the_config_it_runs(tmp_path):
    refused = []

    class ChangeTheConfig(cadence.Callback):
        def on_train_begin(self, state):
            try:
                state.trainer.config.trainer.train_steps = 1000
            except cadence.ConfigError as error:
                refused.append(str(error))

    config = digits("trainer.train_steps=20")
    run_experiment(config, "train", tmp_path, callbacks=[ChangeTheConfig()])
    assert config.locked and len(refused) == 1 and "locked" in refused[0]


def test_a_different_config_in_the_same_directory_is_refused_before_anything_is_written(
        tmp_path):
    run_experiment(digits(), "train", tmp_path)
    before = (tmp_path / "params.yaml").read_text()
    with pytest.raises(cadence.ConfigError) as error:
        run_experiment(digits("task.model.dropout=0.3"), "train", tmp_path)
    assert "task.model.dropout: 0.1 -> 0.3" in str(error.value)
    assert "--allow-config-change" in str(error.value)
    assert (tmp_path / "params.yaml").read_text() == before


def test_bad_modes_and_missing_train_steps_are_refused(tmp_path):
    with pytest.raises(ValueError, match="Unknown mode 'fit'; valid: train, train_and_eval"):
        run_experiment(digits(), "fit", tmp_path)
    with pytest.raises(ValueError, match="trainer.train_steps is 0"):
        run_experiment(digits("trainer.train_steps=0"), "train", tmp_path)


@dataclass
class ExplodingConfig(DigitsTaskConfig):
    explode_at_call: int = 25
    explosions: int = 1


@register_task(ExplodingConfig)
class ExplodingTask(DigitsTask):
    """Returns a NaN loss on the configured calls of train_step."""

    calls = 0

    def train_step(self, inputs, model, optimizer, metrics=None):
        type(self).calls += 1
        logs = super().train_step(inputs, model, optimizer, metrics)
        first = self.task_config.explode_at_call
        if first <= type(self).calls < first + self.task_config.explosions:
            logs["loss"] = logs["loss"] * float("nan")
        return logs


def exploding(*overrides):
    ExplodingTask.calls = 0
    config = digits(*overrides)
    config.task = ExplodingConfig(**{f: getattr(config.task, f)
                                     for f in DigitsTaskConfig.__dataclass_fields__})
    return config


def test_a_nan_loss_stops_training_before_the_bad_weights_are_saved(tmp_path):
    with pytest.raises(FloatingPointError, match=r"diverged at step 30: training_loss is nan"):
        run_experiment(exploding(), "train", tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-20"]


def test_tfm_divergence_raises_a_runtime_error(tmp_path):
    """TF Model Garden raises RuntimeError when the loss diverges; cadence's error is that and a
    FloatingPointError, with cadence's message."""
    with pytest.raises(RuntimeError, match=r"diverged at step 30: training_loss is nan") as error:
        run_experiment(exploding(), "train", tmp_path)
    assert isinstance(error.value, FloatingPointError)
    assert isinstance(error.value, cadence.DivergenceError)
    # LossGuard names its own argument; the Task layer adds the config key that sets it.
    assert "LossGuard max_trials=k" in str(error.value)
    assert "trainer.recovery_max_trials is LossGuard's max_trials" in str(error.value)


def test_a_collective_timeout_in_a_task_run_names_the_config_key_and_other_errors_stay():
    from cadence.engine.distributed import CollectiveTimeout

    error = in_config_terms(CollectiveTimeout("training: a collective did not complete."))
    assert type(error) is CollectiveTimeout
    assert str(error) == ("training: a collective did not complete. In the Task config, the "
                          "process group's timeout is runtime.collective_timeout.")
    other = ValueError("x")
    assert in_config_terms(other) is other


def test_recovery_restores_the_last_checkpoint_and_skips_the_bad_batches(tmp_path, caplog):
    model, _ = run_experiment(exploding("trainer.recovery_max_trials=2"), "train", tmp_path)
    assert "restored" in caplog.text and "skipping the batches" in caplog.text
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert (tmp_path / "checkpoints" / "ckpt-40").is_dir()


def test_a_recovery_is_recorded_where_the_training_summaries_go_back(tmp_path):
    from cadence.writers.reading import Resume, read_run

    run_experiment(exploding("trainer.recovery_max_trials=2"), "train", tmp_path)
    run = read_run(tmp_path)  # the loop ending at step 30 blew up: ckpt-20 was restored
    assert run.resumes == (Resume(20, "recovery", str(tmp_path / "checkpoints" / "ckpt-20")),)
    (loss,) = run.get("training_loss")
    assert loss.steps == (10, 20, 30, 40) and all(math.isfinite(v) for v in loss.values)


def test_recovery_gives_up_after_the_configured_failures_in_a_row(tmp_path):
    config = exploding("trainer.recovery_max_trials=1")
    config.task.explosions = 100
    with pytest.raises(FloatingPointError, match="diverged"):
        run_experiment(config, "train", tmp_path)


def test_a_loss_above_the_upper_bound_counts_as_divergence(tmp_path):
    config = digits("trainer.loss_upper_bound=0.0", "trainer.recovery_begin_steps=21")
    with pytest.raises(FloatingPointError, match="above the upper bound 0"):
        run_experiment(config, "train", tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-20"]


@pytest.mark.slow
def test_the_char_lm_trains_and_reports_bits_per_char(tmp_path):
    config = load_config("char_lm", overrides=[
        "trainer.train_steps=20", "trainer.steps_per_loop=10", "trainer.validation_interval=10",
        "trainer.validation_steps=2", "task.max_bytes=60000", "task.sequence_length=32",
        "task.model.d_model=32", "task.model.num_layers=1", "task.model.dim_feedforward=64",
        "task.train_data.global_batch_size=8", "task.validation_data.global_batch_size=8",
        "trainer.optimizer_config.learning_rate.warmup_steps=5",
    ])
    model, logs = run_experiment(config, "train_and_eval", tmp_path)
    assert math.isfinite(logs["bits_per_char"]) and logs["bits_per_char"] < 8.0
    assert logs["best_bits_per_char"] == min(r["bits_per_char"] for r in eval_records(tmp_path))
    sample = model.generate(b"def ", 16, generator=torch.Generator().manual_seed(0))
    assert len(sample) == 16


class ScaledDigitsTask(DigitsTask):
    """Returns one more scalar than the loss from its training step."""

    def train_step(self, inputs, model, optimizer, metrics=None):
        logs = super().train_step(inputs, model, optimizer, metrics)
        return {**logs, "scale": logs[self.loss].detach() * 2}


def test_a_task_that_returns_extra_scalars_resumes_in_a_new_trainer(tmp_path):
    """A checkpoint holds the parts the Trainer declares: the per-loop mean of an extra scalar is
    not one of them, so a new Trainer (a new process) restores it without a mismatch."""
    config = digits("trainer.train_steps=20")
    trainer = cadence.task.train_lib.create_trainer(config, ScaledDigitsTask(config.task),
                                                    train=True, evaluate=False)
    trainer.train(10)
    cadence.CheckpointManager(trainer, tmp_path).save(trainer.global_step)
    assert "scale" in trainer.train_loop_end()
    fresh = cadence.task.train_lib.create_trainer(config, ScaledDigitsTask(config.task),
                                                  train=True, evaluate=False)
    assert cadence.CheckpointManager(fresh, tmp_path).restore_or_initialize() is not None
    assert fresh.global_step == 10
    for a, b in zip(trainer.model.parameters(), fresh.model.parameters()):
        assert torch.equal(a, b)


def _assert_same(left, right, path=""):
    """Tensors bitwise equal, everything else equal, all the way down."""
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and torch.equal(left.cpu(), right.cpu()), path
    elif isinstance(left, dict):
        assert left.keys() == right.keys(), path
        for key in left:
            _assert_same(left[key], right[key], f"{path}/{key}")
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right), path
        for index, (a, b) in enumerate(zip(left, right)):
            _assert_same(a, b, f"{path}/{index}")
    else:
        assert left == right, path


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_an_interrupted_run_resumes_bitwise_equal(tmp_path, monkeypatch):
    """fp16 (the grad scaler), EMA, dropout (the CUDA generator) and metrics, on the GPU: the
    resumed run's last checkpoint -- every tensor of its state and every generator -- is the
    uninterrupted run's."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    overrides = ["runtime.device=cuda", "runtime.mixed_precision=fp16",
                 "runtime.deterministic=true", "trainer.ema.enabled=true"]

    class StopAt(cadence.Callback):
        def on_loop_end(self, state, logs):
            if state.global_step == 30:
                state.request_stop("test")

    try:
        run_experiment(digits(*overrides), "train", tmp_path / "straight")
        run_experiment(digits(*overrides), "train", tmp_path / "stopped", callbacks=[StopAt()])
        assert (tmp_path / "stopped" / "checkpoints" / "ckpt-30").is_dir()
        run_experiment(digits(*overrides), "train", tmp_path / "stopped")
    finally:
        torch.use_deterministic_algorithms(False)
    straight, stopped = (tmp_path / run / "checkpoints" / "ckpt-40"
                         for run in ("straight", "stopped"))
    assert {p.name for p in straight.iterdir()} == {p.name for p in stopped.iterdir()}
    for part in straight.glob("*.pt"):
        _assert_same(torch.load(part, weights_only=True),
                     torch.load(stopped / part.name, weights_only=True), part.name)
