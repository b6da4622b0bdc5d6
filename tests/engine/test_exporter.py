"""BestCheckpointExporter: top-K by a metric, safetensors + JSON, surviving restarts."""

import json

import pytest
import torch
from torch import nn

import cadence
from cadence.engine.exporter import BestCheckpointExporter, load_weights, read_weights


def model_with(value: float) -> nn.Module:
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(value)
    return model


def test_keeps_the_best_by_the_metric_across_restarts(tmp_path):
    exporter = BestCheckpointExporter(tmp_path, "accuracy", "higher")
    assert exporter.maybe_export_checkpoint(model_with(1), {"accuracy": 0.5}, 100)
    assert not exporter.maybe_export_checkpoint(model_with(2), {"accuracy": 0.4}, 200)
    assert exporter.maybe_export_checkpoint(model_with(3), {"accuracy": 0.7}, 300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-300", "info.json"]

    restarted = BestCheckpointExporter(tmp_path, "accuracy", "higher")
    assert restarted.best_value == 0.7
    assert restarted.best_ckpt_logs == {"accuracy": 0.7, "best_ckpt_global_step": 300}
    assert not restarted.maybe_export_checkpoint(model_with(4), {"accuracy": 0.6}, 400)
    assert read_weights(restarted.best_ckpt_path)["weight"].flatten().tolist() == [3.0, 3.0]
    metrics = json.loads((tmp_path / "best-300" / "metrics.json").read_text())
    assert metrics == {"step": 300, "metric": "accuracy", "value": 0.7,
                       "logs": {"accuracy": 0.7}}


def test_keeps_the_top_k_named_by_step_lower_is_better(tmp_path):
    exporter = BestCheckpointExporter(tmp_path, "loss", "lower", max_to_keep=2)
    for step, loss in [(1, 0.9), (2, 0.5), (3, 0.7), (4, 0.6), (5, 0.8)]:
        exporter.maybe_export_checkpoint(model_with(step), {"loss": loss}, step)
    assert [(e["step"], e["value"]) for e in exporter.best_exports] == [(2, 0.5), (4, 0.6)]
    assert sorted(p.name for p in tmp_path.glob("best-*")) == ["best-2", "best-4"]


def test_nested_metric_names_work_with_either_separator(tmp_path):
    logs = {"validation": {"top1": 0.8, "top5": 0.95}, "loss": 0.3}
    for name in ("validation/top1", "validation|top1"):
        exporter = BestCheckpointExporter(tmp_path / name.replace("|", "_"), name)
        assert exporter.maybe_export_checkpoint(model_with(1), logs, 10)
        assert exporter.best_value == 0.8
        assert exporter.best_ckpt_logs["validation/top5"] == 0.95


def test_a_missing_metric_lists_the_available_ones(tmp_path):
    exporter = BestCheckpointExporter(tmp_path, "acc")
    with pytest.raises(KeyError, match="no metric 'acc'; they have: accuracy, loss"):
        exporter.maybe_export_checkpoint(model_with(1), {"accuracy": 1.0, "loss": 0.1}, 1)


def test_nan_is_never_the_best_and_a_step_is_exported_once(tmp_path):
    exporter = BestCheckpointExporter(tmp_path, "accuracy")
    assert not exporter.maybe_export_checkpoint(model_with(1), {"accuracy": float("nan")}, 1)
    assert exporter.maybe_export_checkpoint(model_with(1), {"accuracy": 0.1}, 2)
    assert not exporter.maybe_export_checkpoint(model_with(1), {"accuracy": 0.9}, 2)


def test_bad_arguments_and_a_ledger_for_another_metric_are_refused(tmp_path):
    with pytest.raises(ValueError, match="'higher' or 'lower'"):
        BestCheckpointExporter(tmp_path, "accuracy", "bigger")
    with pytest.raises(ValueError, match="max_to_keep"):
        BestCheckpointExporter(tmp_path, "accuracy", max_to_keep=0)
    BestCheckpointExporter(tmp_path, "accuracy").maybe_export_checkpoint(
        model_with(1), {"accuracy": 0.5}, 1)
    with pytest.raises(cadence.CheckpointError, match="ranks exports by 'accuracy', not 'loss'"):
        BestCheckpointExporter(tmp_path, "loss")


def test_load_weights_reads_exports_and_checkpoints_and_names_mismatches(tmp_path):
    exporter = BestCheckpointExporter(tmp_path / "best", "accuracy")
    exporter.maybe_export_checkpoint(model_with(5), {"accuracy": 1.0}, 7)
    for path in (tmp_path / "best", tmp_path / "best" / "best-7",
                 tmp_path / "best" / "best-7" / "model.safetensors"):
        target = model_with(0)
        load_weights(target, path)
        assert target.weight.flatten().tolist() == [5.0, 5.0]

    class Holder(cadence.Module):
        def __init__(self):
            super().__init__()
            self.model = model_with(6)

    cadence.CheckpointManager(Holder(), tmp_path / "ckpts").save(3)
    for path in (tmp_path / "ckpts", tmp_path / "ckpts" / "ckpt-3"):
        target = model_with(0)
        load_weights(target, path)
        assert target.weight.flatten().tolist() == [6.0, 6.0]

    with pytest.raises(cadence.CheckpointMismatchError,
                       match=r"'weight' has shape \(1, 2\) in .*, \(1, 3\) in the model"):
        load_weights(nn.Linear(3, 1), tmp_path / "best")
    with pytest.raises(cadence.CheckpointError, match="holds no weights"):
        load_weights(model_with(0), tmp_path)
    with pytest.raises(cadence.CheckpointError, match="does not exist"):
        load_weights(model_with(0), tmp_path / "nowhere")


def fresh_gpt():
    from cadence.task.experiments.gpt import GPT, GPTModelConfig

    return GPT(GPTModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=8))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_the_export_of_a_wrapped_or_sharded_model_loads_strictly_by_its_own_names_tied_as_it_ties(
        tmp_path, strategy):
    """A DDP wrapper (``module.`` names) and an FSDP2 model (DTensor shards), checkpointed
    blocks and all, export the plain model's whole weights: a fresh model takes them with
    ``load_state_dict(strict=True)`` and keeps its tied head, and safetensors alone reads them
    (the metadata says ``format: pt``, as transformers' loader wants)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from cadence.engine.runtime import shutdown

    model = fresh_gpt()
    expected = {name: value.clone() for name, value in model.state_dict().items()}
    try:
        trained = cadence.prepare_model(model, strategy, torch.device("cpu"),
                                        options=cadence.ParallelOptions(
                                            activation_checkpointing=True))
        exporter = BestCheckpointExporter(tmp_path, "loss", "lower")
        assert exporter.maybe_export_checkpoint(trained, {"loss": 1.0}, 3)
    finally:
        shutdown()
    weights = load_file(str(exporter.best_ckpt_path))
    assert sorted(weights) == sorted(expected)  # the head under its own name too
    fresh = fresh_gpt()
    fresh.load_state_dict(weights, strict=True)
    assert fresh.lm_head.weight is fresh.wte.weight
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, expected[name]), name
    with safe_open(str(exporter.best_ckpt_path), framework="pt") as opened:
        assert opened.metadata()["format"] == "pt"


def test_a_job_that_does_not_write_decides_from_the_ledger_the_writer_keeps(tmp_path):
    """Replica groups evaluate alike and one of them writes the exports (`writes`): the others
    write no file, and decide from the ledger on disk, read again before each decision, so that
    every group reports the same best value -- also one that started after the writer
    exported, or becomes the writer later."""
    model = nn.Linear(2, 2)
    writer = BestCheckpointExporter(tmp_path, "accuracy", "higher", 2, writes=lambda: True)
    other = BestCheckpointExporter(tmp_path, "accuracy", "higher", 2, writes=lambda: False)
    assert writer.maybe_export_checkpoint(model, {"accuracy": 0.5}, 10)
    assert not other.maybe_export_checkpoint(model, {"accuracy": 0.5}, 10)  # exported already
    assert other.best_value == writer.best_value == 0.5
    assert writer.maybe_export_checkpoint(model, {"accuracy": 0.7}, 20)
    assert not other.maybe_export_checkpoint(model, {"accuracy": 0.6}, 30)  # writes no file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-10", "best-20", "info.json"]
    assert other.best_value == 0.7  # the writer's 0.7 from its ledger, then its own 0.6
    assert [e["step"] for e in other.best_exports] == [20, 30]
