"""torchmetrics' metrics in every front-end: updated without host syncs, computed once per loop or
evaluation, reset where cadence resets its own, saved in checkpoints, never all-reduced by cadence
(their compute() gathers the ranks; tests/test_distributed.py runs that under torchrun)."""

import subprocess
import sys

import pytest
import torch
from fakes import make_classification
from torch import nn

import cadence
from cadence.callbacks import InferenceRunner
from cadence.core.errors import CheckpointError, CheckpointMismatchError
from cadence.engine.external_metrics import MetricState, checkpoint_part, is_torchmetric
from cadence.task.config import TaskConfig
from cadence.task.config_files import load_config

torchmetrics = pytest.importorskip("torchmetrics")
from torchmetrics.classification import (  # noqa: E402
    MulticlassAccuracy,
    MulticlassAUROC,
)


def accuracy(**kwargs):
    return MulticlassAccuracy(num_classes=3, average="micro", validate_args=False, **kwargs)


class CountingAccuracy(MulticlassAccuracy):
    """Counts its compute() calls."""

    computes = 0

    def compute(self):
        type(self).computes += 1
        return super().compute()


X, Y = make_classification(32)
BATCHES = [(X[i:i + 8], Y[i:i + 8]) for i in range(0, 32, 8)]


# ---------------------------------------------------------------------------- the Task Trainer


class MetricsTask(cadence.Task):
    """A linear classifier reporting torchmetrics' accuracy next to cadence's."""

    def __init__(self, metrics=None):
        super().__init__(TaskConfig())
        self.metrics = metrics

    _TRACKING_IGNORED = frozenset({"metrics"})

    def build_model(self):
        return nn.Linear(4, 3)

    def build_inputs(self, params, input_context=None):
        return BATCHES

    def build_losses(self, labels, model_outputs, aux_losses=None):
        return nn.functional.cross_entropy(model_outputs, labels)

    def build_metrics(self, training=True):
        if self.metrics is not None:
            return self.metrics()
        return {"accuracy": accuracy(), "cadence_accuracy": cadence.Accuracy(),
                "collection": torchmetrics.MetricCollection(
                    {"macro": MulticlassAccuracy(num_classes=3, average="macro"),
                     "auroc": MulticlassAUROC(num_classes=3, thresholds=None)})}


def make_trainer(task=None):
    config = load_config(cadence.ExperimentConfig(), overrides=["trainer.train_steps=100"])
    task = task or MetricsTask()
    model = task.build_model()
    return cadence.Trainer(config, task, model, torch.optim.SGD(model.parameters(), lr=0.5))


def reference(model, metric):
    with torch.no_grad():
        for x, y in BATCHES:
            metric.update(model(x), y)
    return metric.compute()


def test_a_trainer_evaluates_torchmetrics_as_torchmetrics_computes_them_over_the_data():
    trainer = make_trainer()
    trainer.train(6)
    logs = trainer.evaluate(-1)
    assert torch.equal(logs["accuracy"], reference(trainer.model, accuracy()))
    collection = torchmetrics.MetricCollection(
        {"macro": MulticlassAccuracy(num_classes=3, average="macro"),
         "auroc": MulticlassAUROC(num_classes=3, thresholds=None)})
    expected = reference(trainer.model, collection)
    assert set(logs["collection"]) == {"macro", "auroc"}
    for key, value in expected.items():
        assert torch.equal(logs["collection"][key], value), key
    assert float(logs["accuracy"]) == pytest.approx(float(logs["cadence_accuracy"]))
    again = trainer.evaluate(-1)  # reset at the evaluation's start: not counted twice
    assert torch.equal(again["accuracy"], logs["accuracy"])


def test_a_trainer_computes_torchmetrics_once_per_loop_and_resets_them_where_it_resets_its_own():
    CountingAccuracy.computes = 0
    trainer = make_trainer(MetricsTask(lambda: {
        "accuracy": CountingAccuracy(num_classes=3, average="micro"),
        "cadence_accuracy": cadence.Accuracy()}))
    for steps in (3, 5, 2):
        logs = trainer.train(steps)
        # the same examples as cadence's own accuracy: this loop's only
        assert float(logs["accuracy"]) == pytest.approx(float(logs["cadence_accuracy"]))
    assert CountingAccuracy.computes == 3


def test_a_metric_collection_returned_by_build_metrics_is_its_metrics_by_name():
    trainer = make_trainer(MetricsTask(lambda: torchmetrics.MetricCollection(
        {"micro": accuracy(), "macro": MulticlassAccuracy(num_classes=3, average="macro")},
        prefix="val_")))
    logs = trainer.evaluate(-1)
    assert {"val_micro", "val_macro"} <= set(logs)
    assert torch.equal(logs["val_micro"], reference(trainer.model, accuracy()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_trainer_puts_the_torchmetrics_states_on_its_device():
    """Built on the CPU, every state of every torchmetrics metric ends on the Trainer's GPU.
    (On a CPU-only machine the states are on the Trainer's device from the start: the test
    would prove nothing there, so it is a GPU test.)"""
    config = load_config(cadence.ExperimentConfig(), overrides=[
        "trainer.train_steps=100", "runtime.device=cuda"])
    task = MetricsTask()
    model = task.build_model()
    trainer = cadence.Trainer(config, task, model, torch.optim.SGD(model.parameters(), lr=0.5))
    assert trainer.device.type == "cuda"
    for metric in (*trainer.train_metrics.values(), *trainer.validation_metrics.values()):
        if is_torchmetric(metric):
            assert all(state.device == trainer.device for state in
                       torch.utils._pytree.tree_leaves(metric.metric_state))


def test_a_trainer_with_torchmetrics_makes_no_host_syncs_between_log_points():
    trainer = make_trainer(MetricsTask(lambda: {
        "accuracy": accuracy(), "macro": MulticlassAccuracy(num_classes=3, average="macro"),
        "collection": torchmetrics.MetricCollection([MulticlassAccuracy(3)])}))
    trainer.train(1)  # warm-up
    with cadence.debug.count_host_syncs() as syncs:
        trainer.train(9)  # crosses epoch boundaries; compute() at the loop's end
        trainer.evaluate(-1)
    assert syncs.count == 0, syncs.calls


def test_a_metric_that_is_neither_cadences_nor_torchmetrics_is_refused_by_name():
    task = MetricsTask()
    with pytest.raises(TypeError, match="Metric 'odd' .* is not a torchmetrics Metric"):
        task.process_metrics({"odd": object()}, Y[:2], torch.zeros(2, 3))


# ---------------------------------------------------------------------------- StandardTrainer


class Classifier(cadence.StandardTrainer, cadence.StandardEvaluator):
    """Keeps torchmetrics' metrics as attributes and returns them in its logs; they accumulate
    over the whole run (no reset), so a resume must bring their states back."""

    def __init__(self):
        cadence.StandardTrainer.__init__(self, BATCHES)
        cadence.StandardEvaluator.__init__(self, BATCHES)
        self.model = nn.Linear(4, 3)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.5)
        self.accuracy = accuracy()
        self.curves = torchmetrics.MetricCollection(  # list states (cat) too
            {"auroc": MulticlassAUROC(num_classes=3, thresholds=None), "micro": accuracy()})
        self.eval_accuracy = accuracy()

    def train_step(self, iterator):
        x, y = next(iterator)
        outputs = self.model(x)
        loss = nn.functional.cross_entropy(outputs, y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.accuracy.update(outputs.detach(), y)
        self.curves.update(outputs.detach(), y)

    def train_loop_end(self):
        return {"accuracy": self.accuracy, "curves": self.curves}

    def eval_begin(self):
        self.eval_accuracy.reset()

    def eval_step(self, iterator):
        x, y = next(iterator)
        self.eval_accuracy.update(self.model(x), y)

    def eval_end(self):
        return {"accuracy": self.eval_accuracy}


def test_metrics_in_standard_runner_logs_are_computed_when_the_loop_ends():
    trainer = Classifier()
    logs = trainer.train(3)
    assert isinstance(logs["accuracy"], torch.Tensor) and logs["accuracy"].dim() == 0
    assert set(logs["curves"]) == {"auroc", "micro"}
    assert torch.equal(logs["accuracy"], logs["curves"]["micro"])
    evaluated = trainer.evaluate(-1)
    assert torch.equal(evaluated["accuracy"], reference(trainer.model, accuracy()))


def test_a_standard_trainer_with_torchmetrics_makes_no_host_syncs_between_log_points():
    class Plain(Classifier):  # MulticlassAUROC reads its inputs on the host (on the CPU only)
        def train_step(self, iterator):
            x, y = next(iterator)
            self.accuracy.update(self.model(x).detach(), y)

        def train_loop_end(self):
            return {"accuracy": self.accuracy}

    trainer = Plain()
    cadence.Controller(trainer=trainer, steps_per_loop=5)
    trainer.train(1)
    with cadence.debug.count_host_syncs() as syncs:
        trainer.train(10)
    assert syncs.count == 0, syncs.calls


def test_a_resumed_standard_trainer_continues_its_torchmetrics_exactly(tmp_path):
    torch.manual_seed(0)
    straight = Classifier()
    straight.train(6)
    expected = straight.train(5)

    torch.manual_seed(0)
    first = Classifier()
    first.train(6)
    cadence.CheckpointManager(first, tmp_path).save(6)
    torch.manual_seed(1)  # another process: other initial weights until the restore
    second = Classifier()
    cadence.CheckpointManager(second, tmp_path).restore(tmp_path / "ckpt-6")
    resumed = second.train(5)
    assert torch.equal(resumed["accuracy"], expected["accuracy"])
    for key in ("auroc", "micro"):
        assert torch.equal(resumed["curves"][key], expected["curves"][key]), key
    assert second.accuracy.update_count == straight.accuracy.update_count == 11


# ---------------------------------------------------------------------------- TrainLoop


class Printed(cadence.Callback):
    def __init__(self):
        self.means = []

    def on_loop_end(self, state, logs):
        self.means.append({k: v for k, v in logs.items() if not k.endswith("time")})


class Interrupt(Exception):
    pass


def train_loop(directory, stop_at=None, record=None):
    """Two epochs of SGD; the accuracy and the AUROC collected at every step, printed per
    epoch. With `stop_at`, a checkpoint at that step and an exception."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    metric = accuracy()
    curves = torchmetrics.MetricCollection({"auroc": MulticlassAUROC(3, thresholds=None)})
    printed = Printed()
    with cadence.TrainLoop(model, max_epoch=2, checkpoint_dir=directory, print_func=str,
                           checkpoint_save_objects={"optimizer": optimizer, "metric": metric,
                                                    "curves": curves},
                           callbacks=[printed]) as loop:
        for epoch in loop.iter_epochs():
            for step, (x, y) in loop.iter_steps(BATCHES):
                outputs = model(x)
                loss = nn.functional.cross_entropy(outputs, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                metric.update(outputs.detach(), y)
                curves.update(outputs.detach(), y)
                if record is not None:
                    record.setdefault(epoch, []).append((outputs.detach(), y))
                loop.collect_metrics(accuracy=metric, curves=curves)
                if step == stop_at:
                    loop.make_checkpoint()
                    raise Interrupt
            loop.print_logs()
    return printed.means, metric


def test_train_loop_reads_collected_torchmetrics_when_printing_and_resets_them_per_epoch(
        tmp_path):
    record = {}
    means, metric = train_loop(tmp_path, record=record)
    assert len(means) == 2
    for epoch, printed in zip((1, 2), means):  # each epoch's own examples
        expected = accuracy()
        auroc = MulticlassAUROC(3, thresholds=None)
        for outputs, y in record[epoch]:
            expected.update(outputs, y)
            auroc.update(outputs, y)
        assert printed["accuracy"] == pytest.approx(float(expected.compute()))
        assert printed["curves/auroc"] == pytest.approx(float(auroc.compute()))
    assert not metric.update_called  # reset by the last epoch's print


def test_a_train_loop_resumed_mid_epoch_continues_its_torchmetrics_exactly(tmp_path):
    straight, _ = train_loop(tmp_path / "straight")
    with pytest.raises(Interrupt):
        train_loop(tmp_path / "resumed", stop_at=3)  # in epoch 1 (4 steps an epoch)
    resumed, _ = train_loop(tmp_path / "resumed")
    assert resumed == straight[:len(resumed)] and len(resumed) == 2


def test_train_loop_torchmetrics_make_no_host_syncs_until_printing():
    metric = accuracy()
    model = nn.Linear(4, 3)
    with cadence.TrainLoop(model, max_epoch=1, print_func=str) as loop:
        for _ in loop.iter_epochs():
            with cadence.debug.count_host_syncs() as syncs:
                for _, (x, y) in loop.iter_steps(BATCHES):
                    metric.update(model(x).detach(), y)
                    loop.collect_metrics(accuracy=metric)
            assert syncs.count == 0, syncs.calls
            loop.print_logs()


def test_a_name_is_collected_as_values_or_as_a_metric_not_both():
    with cadence.TrainLoop(nn.Linear(4, 3), max_epoch=1, print_func=str) as loop:
        for _ in loop.iter_epochs():
            loop.collect_metrics(accuracy=0.5)
            with pytest.raises(TypeError, match="collect one or the other"):
                loop.collect_metrics(accuracy=accuracy())


def test_a_torchmetric_as_the_validation_metric_updates_the_best_value():
    metric = accuracy()
    metric.update(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
    with cadence.TrainLoop(nn.Linear(4, 3), max_epoch=1, print_func=str,
                           valid_metric_name="valid_acc") as loop:
        for _ in loop.iter_epochs():
            loop.collect_metrics(valid_acc=metric)
        assert loop.best_valid_metric == 1.0


# ---------------------------------------------------------------------------- InferenceRunner


def test_inference_runner_resets_updates_and_computes_torchmetrics_once_per_pass():
    metric = accuracy()
    metric.update(torch.tensor([[0.0, 0.0, 9.0]]), torch.tensor([0]))  # stale: reset first

    def infer(model, batch):
        x, y = batch
        outputs = model(x)
        metric.update(outputs, y)
        return {"loss": nn.functional.cross_entropy(outputs, y)}

    model = nn.Linear(4, 3)
    runner = InferenceRunner(BATCHES, infer, names=["loss"], model=model,
                             metrics={"accuracy": metric})
    assert runner.provides == ("validation_loss", "validation_accuracy")
    state = cadence.RunState()
    runner.trigger(state)
    assert runner.last_results["validation_accuracy"] == pytest.approx(
        float(reference(model, accuracy())))
    assert state.metrics["validation_accuracy"] == runner.last_results["validation_accuracy"]


# ---------------------------------------------------------------------------- checkpoint state


def test_metric_state_round_trips_states_and_update_count_onto_the_metrics_device():
    metric = accuracy()
    metric.update(torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]]), torch.tensor([0, 0]))
    saved = checkpoint_part(metric).state_dict()
    assert saved["update_count"] == 1
    fresh = accuracy()
    MetricState(fresh).load_state_dict(saved)
    assert fresh.update_count == 1 and torch.equal(fresh.compute(), metric.compute())
    assert checkpoint_part(nn.Linear(2, 2)).__class__ is nn.Linear  # only metrics are wrapped


def test_a_checkpointed_metric_of_another_kind_is_refused(tmp_path):
    metric = accuracy()
    metric.update(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
    cadence.CheckpointManager({"metric": metric}, tmp_path).save(1)
    other = torchmetrics.MeanMetric()
    with pytest.raises(CheckpointMismatchError, match="saved from another metric"):
        cadence.CheckpointManager({"metric": other}, tmp_path).restore(tmp_path / "ckpt-1")


def test_an_earlier_checkpoint_of_a_metric_loads_as_torchmetrics_loads_it():
    metric = accuracy()
    metric.update(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
    MetricState(metric).load_state_dict({})  # what metric.state_dict() held: no states
    assert not metric.update_called


def test_metric_states_of_several_ranks_are_merged_on_rank_0_at_another_world_size():
    ranks = [accuracy(), accuracy()]
    ranks[0].update(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
    ranks[1].update(torch.tensor([[2.0, 0.0, 0.0], [2.0, 0.0, 0.0]]), torch.tensor([1, 2]))
    saved = [MetricState(m).state_dict() for m in ranks]
    zero, one = accuracy(), accuracy()
    MetricState(zero).load_resharded(saved, rank=0, world_size=1)
    MetricState(one).load_resharded(saved, rank=1, world_size=2)
    assert float(zero.compute()) == pytest.approx(1 / 3) and zero.update_count == 2
    assert not one.update_called

    class Averaged(torchmetrics.Metric):
        full_state_update = False

        def __init__(self):
            super().__init__()
            self.add_state("value", torch.tensor(0.0), dist_reduce_fx="mean")

        def update(self, value):
            self.value = value

        def compute(self):
            return self.value

    states = [MetricState(Averaged()).state_dict()] * 2
    with pytest.raises(CheckpointError, match="cannot be merged for 1"):
        MetricState(Averaged()).load_resharded(states, rank=0, world_size=1)


@pytest.mark.slow
def test_cadence_never_imports_torchmetrics_itself():
    code = ("import sys, cadence, cadence.task.trainer, cadence.tfsnippet.train_loop, "
            "cadence.callbacks; from cadence.engine.external_metrics import is_torchmetric; "
            "assert not is_torchmetric(object()); assert 'torchmetrics' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
