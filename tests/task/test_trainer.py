"""The Task front-end's Trainer: seed 002's methods and the features the config switches on."""

import json
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from fakes import make_classification
from torch import nn

import cadence
from cadence.core.errors import HookValueError
from cadence.task.config import TaskConfig
from cadence.task.config_files import load_config


@dataclass
class ToyConfig(TaskConfig):
    features: int = 4
    classes: int = 3


class ToyTask(cadence.Task):
    """A linear classifier over a fixed list of batches."""

    def __init__(self, params: Any = None, batches: Any = None, **kwargs: Any) -> None:
        super().__init__(params or ToyConfig(), **kwargs)
        x, y = make_classification(32)
        self.batches = batches if batches is not None else [
            (x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]

    _TRACKING_IGNORED = frozenset({"batches"})

    def build_model(self) -> nn.Module:
        return nn.Linear(self.task_config.features, self.task_config.classes)

    def build_inputs(self, params: Any, input_context: Any = None) -> Any:
        return self.batches

    def build_losses(self, labels: Any, model_outputs: Any, aux_losses: Any = None) -> Any:
        return nn.functional.cross_entropy(model_outputs, labels)

    def build_metrics(self, training: bool = True) -> dict[str, Any]:
        return {"accuracy": cadence.Accuracy()}


def make_trainer(*overrides: str, task: cadence.Task | None = None,
                 trainer_cls: type = cadence.Trainer, **kwargs: Any) -> cadence.Trainer:
    config = load_config(cadence.ExperimentConfig(),
                         overrides=["trainer.train_steps=100", *overrides])
    task = task or ToyTask()
    model = task.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return trainer_cls(config, task, model, optimizer, **kwargs)


def test_train_runs_steps_and_returns_the_loop_means():
    trainer = make_trainer()
    logs = trainer.train(6)
    assert trainer.global_step == 6
    assert set(logs) == {"training_loss", "accuracy", "learning_rate"}
    assert 0.0 <= float(logs["accuracy"]) <= 1.0
    assert logs["learning_rate"] == pytest.approx(0.1)


def test_train_loop_begin_resets_the_metrics_before_the_iterator_exists():
    events = []

    class Batches(list):
        def __iter__(self):
            events.append("iterator")
            return super().__iter__()

    class Recording(cadence.Trainer):
        def train_loop_begin(self):
            events.append("train_loop_begin")
            super().train_loop_begin()

    x, y = make_classification(16)
    trainer = make_trainer(task=ToyTask(batches=Batches([(x, y)])), trainer_cls=Recording)
    first = trainer.train(1)
    assert events[:2] == ["train_loop_begin", "iterator"]
    second = trainer.train(1)  # the metrics cover one loop only
    assert float(second["training_loss"]) < float(first["training_loss"])


def test_the_training_loop_makes_no_host_syncs(monkeypatch):
    trainer = make_trainer("trainer.optimizer_config.gradient_clip_norm=1.0",
                           "trainer.ema.enabled=true",
                           "trainer.optimizer_config.learning_rate.schedule=cosine")
    trainer.train(1)  # warm-up: lazily created accumulators
    with cadence.debug.count_host_syncs() as syncs:
        trainer.train(9)  # crosses epoch boundaries
    assert syncs.count == 0, syncs.calls


def test_evaluate_runs_steps_or_until_the_data_is_exhausted():
    seen = []

    class Counting(ToyTask):
        def validation_step(self, inputs, model, metrics=None):
            seen.append(len(inputs[0]))
            return super().validation_step(inputs, model, metrics)

    trainer = make_trainer(task=Counting())
    logs = trainer.evaluate(-1)
    assert seen == [8, 8, 8, 8]
    assert set(logs) == {"accuracy", "validation_loss"}
    seen.clear()
    trainer.evaluate(2)
    assert seen == [8, 8]


def test_host_logs_from_next_eval_inputs_reach_aggregate_logs_and_stay_on_the_host():
    class WithIds(ToyTask):
        def validation_step(self, inputs, model, metrics=None):
            logs = super().validation_step(inputs, model, metrics)
            return {**logs, "ids": torch.zeros(1)}  # clashes with a host log: the model wins

        def aggregate_logs(self, state=None, step_logs=None):
            state = state if state is not None else {"names": [], "clashes": []}
            state["names"] += step_logs["names"]
            state["clashes"].append(type(step_logs["ids"]).__name__)
            return state

        def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
            return {"examples": len(aggregated_logs["names"]),
                    "distinct": len(set(aggregated_logs["names"])),
                    "clash_kept": aggregated_logs["clashes"][0]}

    class NamedInputs(cadence.Trainer):
        batch = 0

        def next_eval_inputs(self, iterator):
            inputs = next(iterator)
            self.batch += 1
            names = [f"example-{self.batch}-{i}" for i in range(len(inputs[1]))]
            return inputs, {"names": names, "ids": "host value"}

    trainer = make_trainer(task=WithIds(), trainer_cls=NamedInputs)
    logs = trainer.evaluate(-1)
    assert logs["examples"] == 32 and logs["distinct"] == 32
    assert logs["clash_kept"] == "Tensor"


def test_distribute_dataset_passes_an_input_context_to_functions_that_take_one():
    trainer = make_trainer()
    received = {}

    def build(params, input_context=None):
        received["context"] = input_context
        return [params]

    assert trainer.distribute_dataset(build, "params") == ["params"]
    assert received["context"] == cadence.InputContext(1, 0, 1)
    assert received["context"].get_per_replica_batch_size(64) == 64
    assert trainer.distribute_dataset(lambda: [1]) == [1]  # no input_context parameter
    assert trainer.distribute_dataset([1, 2]) == [1, 2]  # a dataset is returned as it is
    with pytest.raises(ValueError, match="not divisible by the 3 replicas"):
        cadence.InputContext(3, 0, 3).get_per_replica_batch_size(64)


def final_weights(*overrides, batches, steps):
    torch.manual_seed(0)
    trainer = make_trainer(*overrides, task=ToyTask(batches=batches))
    trainer.train(steps)
    return trainer.model.weight.detach().clone()


def test_gradient_accumulation_matches_one_large_batch():
    x, y = make_classification(16)
    whole = final_weights(batches=[(x, y)], steps=3)
    halves = final_weights("trainer.optimizer_config.gradient_accumulation_steps=2",
                           batches=[(x[:8], y[:8]), (x[8:], y[8:])], steps=3)
    torch.testing.assert_close(halves, whole)


def test_gradient_clipping_bounds_the_update_and_reports_the_norm():
    trainer = make_trainer("trainer.optimizer_config.gradient_clip_norm=0.001")
    before = trainer.model.weight.detach().clone()
    logs = trainer.train(1)
    change = (trainer.model.weight.detach() - before).norm()
    assert float(change) <= 0.1 * 0.001 + 1e-7  # at most lr x the clipped norm
    assert float(logs["gradient_norm"]) > 0.001  # the norm before clipping


def test_the_learning_rate_warms_up_then_decays_once_per_step():
    trainer = make_trainer("trainer.optimizer_config.learning_rate.schedule=linear",
                           "trainer.optimizer_config.learning_rate.warmup_steps=10",
                           "trainer.train_steps=20")
    rates = [trainer.train(5)["learning_rate"] for _ in range(4)]
    assert rates == pytest.approx([0.05, 0.1, 0.05, 0.0])


def test_evaluation_and_exports_use_the_moving_average_when_enabled():
    trainer = make_trainer("trainer.ema.enabled=true", "trainer.ema.decay=0.5",
                           "trainer.ema.dynamic_decay=false")
    trainer.initialize()
    trainer.train(3)
    assert trainer.eval_model is trainer.ema.average
    assert not torch.equal(trainer.ema.average.weight, trainer.model.weight)
    used = []
    original = trainer.task.validation_step
    trainer.task.validation_step = lambda inputs, model, metrics=None: (
        used.append(model), original(inputs, model, metrics))[1]
    trainer.evaluate(1)
    assert used == [trainer.ema.average]


def test_ema_follows_the_weights_with_the_configured_decay():
    model = nn.Linear(2, 1, bias=False)
    ema = cadence.task.optimization.ExponentialMovingAverage(model, decay=0.5, dynamic_decay=False)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(1)
    torch.testing.assert_close(ema.average.weight, start + 0.5)
    assert ema.decay_at(0) == 0.0  # before start_step the average copies the weights
    dynamic = cadence.task.optimization.ExponentialMovingAverage(model, decay=0.999)
    assert dynamic.decay_at(1) == pytest.approx(2 / 11)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs_the_step_under_autocast(precision):
    dtypes = []

    class Spy(ToyTask):
        def train_step(self, inputs, model, optimizer, metrics=None):
            logs = super().train_step(inputs, model, optimizer, metrics)
            dtypes.append(model(inputs[0]).dtype)
            return logs

    trainer = make_trainer(f"runtime.mixed_precision={precision}", task=Spy())
    before = trainer.model.weight.detach().clone()
    trainer.train(2)
    assert dtypes == [{"bf16": torch.bfloat16, "fp16": torch.float16}[precision]] * 2
    assert (trainer.grad_scaler is not None) == (precision == "fp16")
    assert not torch.equal(trainer.model.weight, before)
    if precision == "fp16":
        assert "grad_scaler" in trainer.state_dict()  # the loss scale is checkpointed


def test_a_task_that_updates_the_weights_itself_is_only_counted():
    class SelfUpdating(ToyTask):
        def train_step(self, inputs, model, optimizer, metrics=None):
            x, y = inputs
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return {"loss": loss.detach(), "scale": torch.tensor(2.0)}

    trainer = make_trainer(task=SelfUpdating())
    updates = []
    trainer.optimizer.register_step_post_hook(lambda *args: updates.append(1))
    logs = trainer.train(3)
    assert len(updates) == 3  # the task's own updates, none added by the Trainer
    assert float(logs["scale"]) == 2.0  # other scalars a step returns are averaged per loop


class DetachedLoss(ToyTask):
    """Computes the loss with the Task's machinery, then loses its gradient."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def train_step(self, inputs, model, optimizer, metrics=None):
        if self.how == "no_grad":
            with torch.no_grad():
                return super().train_step(inputs, model, optimizer, metrics)
        logs = super().train_step(inputs, model, optimizer, metrics)
        return {self.loss: logs[self.loss].detach()}


@pytest.mark.parametrize("how", ["detach", "no_grad"])
def test_an_overridden_train_step_whose_loss_has_no_gradient_is_refused_at_its_first_step(how):
    trainer = make_trainer(task=DetachedLoss(how))
    before = trainer.model.weight.detach().clone()
    with pytest.raises(HookValueError, match=(
            r"^DetachedLoss\.train_step\(\) returned a loss 'loss' that has no gradient "
            r"\(requires_grad=False\) and updated no weight, so training would change nothing\. "
            r"Was the loss computed under torch\.no_grad\(\) or \.detach\(\)ed\? Return it "
            r"with its gradient for the Trainer to update the weights, or update them in "
            r"train_step with the optimizer \(and return detached values\)\.$")):
        trainer.train(5)
    assert trainer.global_step == 0  # the first step, before any was counted
    assert torch.equal(trainer.model.weight, before)


class Accumulating(ToyTask):
    """Updates the weights itself every second step: the first computes gradients only."""

    calls = 0

    def train_step(self, inputs, model, optimizer, metrics=None):
        x, y = inputs
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        self.calls += 1
        if self.calls % 2 == 0:
            optimizer.step()
            optimizer.zero_grad()
        return {"loss": loss.detach()}


class Frozen(DetachedLoss):
    """A model with nothing to train: a detached loss changes nothing it could have changed."""

    def build_model(self):
        return super().build_model().requires_grad_(False)


@pytest.mark.parametrize("task", [ToyTask, Accumulating, lambda: Frozen("detach")],
                         ids=["default", "accumulating", "frozen"])
def test_a_step_that_trains_or_has_nothing_to_train_is_not_refused(task):
    trainer = make_trainer(task=task())
    before = trainer.model.weight.detach().clone()
    trainer.train(4)
    assert trainer.global_step == 4
    moved = not torch.equal(trainer.model.weight, before)
    assert moved == trainer.model.weight.requires_grad  # the weights move if they can


def test_a_train_step_without_the_loss_is_a_clear_error():
    class NoLoss(ToyTask):
        def train_step(self, inputs, model, optimizer, metrics=None):
            return {"cost": model(inputs[0]).sum()}

    with pytest.raises(TypeError, match=r"^NoLoss\.train_step\(\) returned a dict with keys "
                       r"\['cost'\]: it must return a dict with the loss under 'loss'"):
        make_trainer(task=NoLoss()).train(1)


def test_the_step_hooks_are_checked_at_their_first_call_and_then_are_the_methods_themselves(
        monkeypatch):
    """The default training step is the Trainer's own forward (`build_losses`' loss, no logs
    dict): its first result is checked, then it is the bound method itself, as are the
    task's hooks."""
    from cadence.task import step_checks

    checked = []
    for name in ("_check_default_loss", "_check_validation_logs", "_check_process_metrics"):
        check = getattr(step_checks, name)
        monkeypatch.setattr(step_checks, name, lambda task, result, check=check, name=name: (
            checked.append(name), check(task, result)))
    trainer = make_trainer()
    task = trainer.task
    assert {"validation_step", "process_metrics"} <= set(vars(task))
    assert "train_step" not in vars(task)  # the Trainer runs the default forward itself
    trainer.train(5)
    assert checked == ["_check_process_metrics", "_check_default_loss"]  # the first step's
    assert "process_metrics" not in vars(task)
    assert trainer._task_train_step == trainer._default_forward  # no wrapper on the way
    trainer.evaluate(-1)
    assert checked[2:] == ["_check_validation_logs"]
    assert not {"train_step", "validation_step", "process_metrics"} & set(vars(task))
    trainer.train(5)
    trainer.evaluate(-1)
    assert len(checked) == 3


def test_a_task_train_step_is_checked_at_its_first_call_and_then_is_the_method_itself(
        monkeypatch):
    from cadence.task import step_checks

    checked = []
    check = step_checks._check_train_logs
    monkeypatch.setattr(step_checks, "_check_train_logs",
                        lambda task, result: (checked.append(result), check(task, result)))

    class Own(ToyTask):
        def train_step(self, inputs, model, optimizer, metrics=None):
            logs = super().train_step(inputs, model, optimizer, metrics)
            return {**logs, "twice": 2 * logs["loss"].detach()}

    trainer = make_trainer(task=Own())
    logs = trainer.train(3)
    assert len(checked) == 1 and set(checked[0]) == {"loss", "twice"}
    assert trainer._task_train_step.__func__ is Own.train_step  # the task's, unwrapped
    assert logs["twice"] == pytest.approx(2 * logs["training_loss"])


def test_a_compiled_steps_first_call_is_checked_too():
    pytest.importorskip("torch._dynamo")

    class PerExample(ToyTask):
        def build_losses(self, labels, model_outputs, aux_losses=None):
            return nn.functional.cross_entropy(model_outputs, labels, reduction="none")

    trainer = make_trainer("trainer.compile_step=true", task=PerExample())
    with pytest.raises(cadence.HookError, match=r"^PerExample\.build_losses\(\) returned a "
                       r"Tensor of shape \(8,\): it must return a scalar tensor"):
        trainer.train(1)
    assert "_task_train_step" in vars(trainer) and "train_step" not in vars(trainer.task)


def test_a_loss_that_loses_its_gradient_after_the_first_step_is_still_refused():
    class Later(ToyTask):
        calls = 0

        def build_losses(self, labels, model_outputs, aux_losses=None):
            self.calls += 1
            loss = super().build_losses(labels, model_outputs)
            return loss if self.calls < 3 else loss.detach()

    with pytest.raises(cadence.HookError, match=r"^Later\.build_losses\(\) returned a Tensor "
                       r"of shape \(\) without a gradient"):
        make_trainer(task=Later()).train(5)


def test_training_without_validation_is_said_once(caplog):
    caplog.set_level("INFO", logger="cadence")
    trainer = make_trainer(evaluate=False)
    trainer.train(3)
    said = [r.getMessage() for r in caplog.records if "without validation" in r.getMessage()]
    assert said == ["Training without validation (mode 'train', Trainer(evaluate=False)): no "
                    "validation data is built and nothing is evaluated."]


def test_validation_data_that_is_an_iterator_loses_no_batch_to_the_look_for_one():
    x, y = make_classification(8)

    class OneShot(ToyTask):
        def build_inputs(self, params, input_context=None):
            return super().build_inputs(params) if params.is_training else iter([(x, y)])

    trainer = make_trainer(task=OneShot())
    assert trainer.evaluate(-1)["accuracy"] is not None  # the batch read to look is evaluated
    assert trainer.last_eval_steps == 1


def test_the_config_must_name_data_for_datasets_it_builds():
    config = load_config(cadence.ExperimentConfig())
    config.task.train_data = None
    task = ToyTask()
    model = task.build_model()
    with pytest.raises(ValueError, match="config.task.train_data is not set"):
        cadence.Trainer(config, task, model, None)
    with pytest.raises(ValueError, match="has no 'task'; pass a cadence.ExperimentConfig"):
        cadence.Trainer(object(), task, model, None)


def test_initialize_loads_the_init_checkpoint_only_when_no_checkpoint_exists(tmp_path):
    source = nn.Linear(4, 3)
    exporter = cadence.BestCheckpointExporter(tmp_path / "pretrained", "accuracy")
    exporter.maybe_export_checkpoint(source, {"accuracy": 0.5}, 1)
    trainer = make_trainer(f"task.init_checkpoint={tmp_path / 'pretrained'}",
                           task=ToyTask(ToyConfig(init_checkpoint=str(tmp_path / "pretrained"))))
    manager = cadence.CheckpointManager(trainer, tmp_path / "run", init_fn=trainer.initialize)
    controller = cadence.Controller(trainer=trainer, steps_per_loop=2, checkpoint_manager=manager)
    assert trainer.model.weight.device.type == trainer.device.type  # where the Trainer runs
    torch.testing.assert_close(trainer.model.weight.cpu(), source.weight)  # initialized
    controller.train(2)
    trained = trainer.model.weight.detach().clone()
    again = make_trainer(task=ToyTask(ToyConfig(init_checkpoint=str(tmp_path / "pretrained"))))
    calls = []
    again.task.initialize = lambda model: calls.append(model)
    manager = cadence.CheckpointManager(again, tmp_path / "run", init_fn=again.initialize)
    cadence.Controller(trainer=again, steps_per_loop=2, checkpoint_manager=manager)
    assert calls == []  # a checkpoint exists: it is restored, initialize() is not called
    torch.testing.assert_close(again.model.weight, trained)


def test_tfm_evaluate_returns_after_the_best_export_it_triggered_is_on_disk(tmp_path,
                                                                          monkeypatch):
    """TF Model Garden exports the best checkpoint inside `evaluate`: when it returns, the
    export is there (cadence writes it off the loop, and waits for it before returning)."""
    import time

    exporter = cadence.BestCheckpointExporter(tmp_path / "best", "accuracy")
    write = exporter._write

    def slow_write(*args):
        time.sleep(0.3)
        write(*args)

    monkeypatch.setattr(exporter, "_write", slow_write)
    trainer = make_trainer(checkpoint_exporter=exporter)
    trainer.evaluate(-1)
    assert (tmp_path / "best" / "best-0" / "model.safetensors").is_file()
    assert [e["step"] for e in json.loads((tmp_path / "best" / "info.json").read_text())[
        "exports"]] == [0]


class _LoadsOntoTheCpu(ToyTask):
    def build_model(self) -> nn.Module:
        model = super().build_model()
        model.register_buffer("scale", torch.ones(3))
        return model

    def initialize(self, model: nn.Module) -> None:
        model.scale = torch.full((3,), 2.0)  # e.g. pretrained statistics loaded on the host


def test_initialize_keeps_the_weights_and_the_ema_on_the_trainers_device() -> None:
    # "meta" stands in for a GPU: what a task's initialize left on the CPU moves back to it
    trainer = make_trainer("runtime.device=meta", "trainer.ema.enabled=true",
                           task=_LoadsOntoTheCpu())
    parameters = list(trainer.model.parameters())
    trainer.initialize()
    assert list(trainer.model.parameters()) == parameters  # the optimizer's, still
    assert {t.device.type for t in trainer.model.state_dict().values()} == {"meta"}
    assert trainer.ema is not None
    assert {t.device.type for t in trainer.ema.average.state_dict().values()} == {"meta"}
    assert trainer.ema._pairs[-1][1] is trainer.model.scale  # the EMA follows the moved buffer


class _ReplacesParameters(ToyTask):
    def initialize(self, model: nn.Module) -> None:
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()},
                              assign=True)


def test_initialize_refuses_a_task_that_replaces_the_parameters() -> None:
    trainer = make_trainer(task=_ReplacesParameters())
    with pytest.raises(RuntimeError, match=r"replaced parameters .*load_state_dict\(weights\)"):
        trainer.initialize()


def test_join_waits_for_background_work_and_reraises_its_error():
    trainer = make_trainer()
    coordinator = trainer.coordinator_for_async()
    done = []
    coordinator.schedule(done.append, 1)
    trainer.join()
    assert done == [1]

    def fail():
        raise OSError("disk full")

    coordinator.schedule(fail)
    with pytest.raises(OSError, match="disk full"):
        trainer.join()


def test_init_async_starts_a_fresh_coordinator_that_still_joins_the_waitables():
    trainer = make_trainer()
    waited = []

    class Writer:
        def wait(self, retention):
            waited.append(retention)

    trainer.coordinator_for_async().add_waitable(Writer())
    first = trainer.coordinator_for_async()
    trainer.init_async()  # joins what is pending first
    assert trainer.coordinator_for_async() is not first and waited == [True]
    trainer.join()
    assert waited == [True, True]


def test_loop_functions_are_available_as_in_seed_002():
    trainer = make_trainer()
    loop = trainer.create_train_loop_fn()
    loop(trainer._train_data, 3)
    assert trainer.global_step == 3
    eval_loop = trainer.create_eval_loop_fn()
    state = eval_loop(iter(trainer.eval_dataset), 2, state=[],
                      reduce_fn=lambda state, outputs: [*state, outputs])
    assert len(state) == 2 and "loss" in state[0]


def test_a_device_that_is_not_there_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="CUDA is not available here: set runtime.device=auto"):
        make_trainer("runtime.device=cuda")
    with pytest.raises(ValueError, match="is not a device"):
        make_trainer("runtime.device=tpu9")


@pytest.mark.slow
def test_compiled_steps_train_like_eager_ones():
    torch.manual_seed(0)
    eager = make_trainer()
    torch.manual_seed(0)
    compiled = make_trainer("trainer.compile_step=true", "trainer.compile_mode=default")
    for trainer in (eager, compiled):
        trainer.train(4)
        trainer.evaluate(2)
    torch.testing.assert_close(compiled.model.weight, eager.model.weight)


def test_evaluation_shards_hold_each_example_once_and_training_shards_are_shuffled():
    from torch.utils.data import TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from cadence.data.sharding import ShardSampler, build_dataloader
    from cadence.task.config import DataConfig

    dataset = TensorDataset(torch.arange(7))
    seen = []
    for rank in (0, 1):
        loader = build_dataloader(dataset, DataConfig(global_batch_size=4, is_training=False,
                                                      drop_remainder=False),
                                  cadence.InputContext(2, rank, 2))
        assert isinstance(loader.sampler, ShardSampler)
        seen += [int(v) for (batch,) in loader for v in batch]
    assert sorted(seen) == list(range(7))  # uneven shards (4 and 3), nothing repeated
    train = build_dataloader(dataset, DataConfig(global_batch_size=4, is_training=True),
                             cadence.InputContext(2, 0, 2))
    assert isinstance(train.sampler, DistributedSampler)


class _WithAuxLosses(nn.Linear):
    """Sets `aux_losses` in forward, as a model with a regularizer would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.aux_losses = [self.weight.square().sum(), torch.tensor(1.0)]
        return super().forward(x)


class _AuxAsProperty(nn.Linear):
    @property
    def aux_losses(self) -> torch.Tensor:
        return torch.tensor(2.0)


@pytest.mark.parametrize("model, expected", [
    (nn.Linear(2, 2), None),                       # none: the fast path
    (_AuxAsProperty(2, 2), 2.0),                   # a property of the class
])
def test_aux_losses_are_read_like_getattr(model: nn.Module, expected: Any) -> None:
    from cadence.task.task import aux_losses_of

    found = aux_losses_of(model)
    assert (found is None) if expected is None else float(found) == expected
    buffer_model = nn.Linear(2, 2)
    buffer_model.register_buffer("aux_losses", torch.tensor(3.0))  # registered: still found
    assert float(aux_losses_of(buffer_model)) == 3.0


def test_the_default_loss_sums_the_aux_losses_a_model_sets_in_forward() -> None:
    model = _WithAuxLosses(2, 1)
    logs = cadence.Task(ToyConfig()).train_step((torch.ones(3, 2), None), model, None)
    expected = float(model.weight.detach().square().sum()) + 1.0
    assert float(logs["loss"].detach()) == pytest.approx(expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_next_batch_is_copied_while_the_step_computes() -> None:
    trainer = make_trainer("runtime.device=cuda")
    assert trainer._train_data.prefetch_to == torch.device("cuda")
    logs = trainer.train(6)
    assert logs is not None and torch.isfinite(torch.as_tensor(logs["training_loss"]))


def test_each_training_loop_starts_with_every_module_in_training_mode() -> None:
    trainer = make_trainer(evaluate=True, validation_dataset=ToyTask().batches)
    trainer.train(1)
    trainer.evaluate(1)
    assert trainer.model.training  # eval_end restored it
    trainer.model.eval()  # changed between loops, e.g. by a callback
    trainer.train(1)
    assert all(module.training for module in trainer.model.modules())


def test_compiled_steps_compile_in_the_first_loop_and_never_again(compile_counter) -> None:
    backend = compile_counter
    x, y = make_classification(32)
    batches = [(x[i:i + 2], y[i:i + 2]) for i in range(0, 32, 2)]  # passes of 16 batches
    trainer = make_trainer("trainer.compile_step=true", task=ToyTask(batches=batches),
                           evaluate=True, validation_dataset=batches)
    trainer.train(3)  # the first loop: the task's step and its accuracy metric
    trainer.evaluate(-1)  # a whole evaluation: 16 steps
    compiled, ran = backend.compiles, backend.runs
    assert 0 < compiled <= 4  # not one per step (of training or of the evaluation)
    for _ in range(8):  # 40 more steps, across passes, and 8 more evaluations
        logs = trainer.train(5)
        trainer.evaluate(-1)
    assert backend.compiles == compiled  # no recompilation: not per step, not per loop
    assert backend.runs - ran >= 40 + 8 * 16  # and the compiled graphs ran every step
    assert 0 <= float(logs["accuracy"]) <= 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_steps_captured_in_cuda_graphs_train_and_count_like_eager_ones() -> None:
    def run(*overrides: str) -> tuple[list[float], float, torch.Tensor]:
        torch.manual_seed(0)
        trainer = make_trainer("runtime.device=cuda", *overrides, evaluate=True,
                               validation_dataset=ToyTask().batches)
        losses = [float(trainer.train(4)["training_loss"]) for _ in range(3)]
        accuracy = float(trainer.evaluate(-1)["accuracy"])
        return losses, accuracy, trainer.model.weight.detach().cpu()

    eager = run()
    graphed = run("trainer.cuda_graphs=true")
    assert graphed[0] == pytest.approx(eager[0], rel=1e-4)  # the kept losses were not overwritten
    assert graphed[1] == eager[1]
    torch.testing.assert_close(graphed[2], eager[2], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("where", ["on the device", "on the host, prefetched"])
def test_on_cuda_the_training_loop_makes_no_host_syncs(where) -> None:
    x, y = make_classification(64)
    if where == "on the device":
        x, y = x.cuda(), y.cuda()
    task = ToyTask(batches=[(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)])
    trainer = make_trainer("runtime.device=cuda", "trainer.optimizer_config.gradient_clip_norm=1.0",
                           "trainer.ema.enabled=true", task=task)
    trainer.train(10)  # warm-up
    with cadence.debug.count_host_syncs() as syncs:  # CUDA's sync debug mode is on too
        trainer.train(20)  # across passes
    assert syncs.count == 0, syncs.calls


def test_a_process_metrics_override_runs_at_every_step_even_with_no_training_metrics():
    """The default step skips ``process_metrics`` only where it would loop over nothing: no
    training metrics and the default method. A task's own one is called at every step."""
    calls = []

    class Counting(ToyTask):
        def build_metrics(self, training=True):
            return {}

        def process_metrics(self, metrics, labels, model_outputs, **kwargs):
            calls.append(len(labels))

    make_trainer(task=Counting()).train(3)
    assert calls == [8, 8, 8]
