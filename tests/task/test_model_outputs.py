"""Batches and outputs as the users of other libraries write them reach the task's hooks as
they are: a dict batch is the model's keyword arguments (transformers' ``model(**batch)``), a
dict (or ``ModelOutput``) of outputs reaches ``build_losses`` untouched, whose default takes the
model's own loss; a model's ``aux_losses`` are found through a DDP or compile wrapper."""

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

import cadence
from cadence.engine.runtime import shutdown
from cadence.task.config_files import load_config
from cadence.task.task import aux_losses_of, call_model


class Outputs(OrderedDict):
    """What a transformers model returns: an ordered mapping (``ModelOutput``)."""


class KeywordModel(nn.Module):
    """A model called as transformers' are: ``model(input_ids=..., labels=...)``; it computes
    its loss itself and leaves a balance loss as ``aux_losses``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 8)
        self.aux_losses: list[torch.Tensor] = []

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.embed(input_ids)
        self.aux_losses = [logits.pow(2).mean() * 0.0 + 0.5]
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return Outputs(loss=loss, logits=logits)


class DictModel(nn.Module):
    """A model that takes the whole batch as one argument, as before."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, batch):
        return self.linear(batch["x"])


def batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 8, (4, 5))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


class KeywordTask(cadence.Task):
    seen: list = []

    def build_model(self):
        return KeywordModel()

    def build_inputs(self, params, input_context=None):
        return [batch() for _ in range(4)]

    def build_losses(self, labels, model_outputs, aux_losses=None):
        KeywordTask.seen.append((labels, model_outputs, aux_losses))
        return super().build_losses(labels, model_outputs, aux_losses)


def test_a_dict_batch_is_the_models_keyword_arguments_and_a_dict_of_one_is_its_argument():
    inputs = batch()
    outputs = call_model(KeywordModel(), inputs)
    assert type(outputs) is Outputs and set(outputs) == {"loss", "logits"}
    assert call_model(DictModel(), {"x": torch.ones(3, 4)}).shape == (3, 2)


def test_outputs_reach_build_losses_as_they_are_and_the_default_loss_is_the_models_plus_aux():
    KeywordTask.seen.clear()
    task = KeywordTask(cadence.TaskConfig())
    model = task.build_model()
    inputs = batch()
    logs = task.train_step(inputs, model, None)
    labels, outputs, aux = KeywordTask.seen[-1]
    assert labels is inputs and type(outputs) is Outputs
    assert torch.allclose(logs["loss"], outputs["loss"] + 0.5)
    assert aux == model.aux_losses
    assert float(cadence.Task(cadence.TaskConfig()).build_losses(None, torch.ones(2))) == 0.0


def test_aux_losses_are_found_through_ddp_and_compile_wrappers():
    model = KeywordModel()
    model(**batch())
    try:
        wrapped = cadence.prepare_model(model, "ddp", torch.device("cpu"))
        assert isinstance(wrapped, nn.parallel.DistributedDataParallel)
        assert aux_losses_of(wrapped) is model.aux_losses
    finally:
        shutdown()
    assert aux_losses_of(torch.compile(model)) is model.aux_losses
    assert aux_losses_of(nn.Linear(1, 1)) is None


def test_a_dict_batch_trains_end_to_end_under_ddp_with_the_models_aux_losses():
    KeywordTask.seen.clear()
    config = load_config(cadence.ExperimentConfig(), overrides=[
        "trainer.train_steps=2", "trainer.steps_per_loop=2", "runtime.device=cpu",
        "runtime.strategy=ddp"])
    task = KeywordTask(config.task)
    model = task.build_model()
    try:
        trainer = cadence.Trainer(config, task, model, torch.optim.SGD(model.parameters(), 0.1),
                                  evaluate=False)
        logs: Any = trainer.train(2)
    finally:
        shutdown()
    assert trainer.global_step == 2 and len(KeywordTask.seen) == 2
    _, outputs, aux = KeywordTask.seen[-1]
    assert type(outputs) is Outputs and aux is not None and float(aux[0].detach()) == 0.5
    assert float(logs["training_loss"]) > 0.5
