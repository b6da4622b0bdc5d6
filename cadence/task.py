"""`Task` (seed 002): what to train, described for one process; the `Trainer` runs it.

A task builds the model, the inputs, the losses and the metrics, and says what one training step
and one validation step are. Everything around the step -- the optimizer and its schedule,
gradient accumulation and clipping, mixed precision, weight averaging, checkpoints, evaluation
intervals, exports -- comes from the config and the `Trainer`, not from the task.

The smallest task::

    class Digits(cadence.Task):
        def build_model(self):
            return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

        def build_inputs(self, params, input_context=None):
            return DataLoader(dataset, batch_size=input_context.get_per_replica_batch_size(
                params.global_batch_size), shuffle=params.is_training)

        def build_losses(self, labels, model_outputs, aux_losses=None):
            return nn.functional.cross_entropy(model_outputs, labels)

        def build_metrics(self, training=True):
            return {"accuracy": cadence.Accuracy()}

**Who updates the weights.** The default `train_step` computes the loss and returns it in its
logs without calling ``backward``: the `Trainer` then does the update with everything the config
asks for. A task that overrides `train_step` to update the weights itself (a GAN with two
optimizers) returns detached values; the Trainer sees that the loss needs no gradient and only
counts the step.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

from cadence.module import Module

logger = logging.getLogger("cadence")


@dataclass(frozen=True)
class InputContext:
    """Which share of the input this process reads (``tf.distribute.InputContext``).

    Attributes:
        num_input_pipelines: how many processes read input (the world size).
        input_pipeline_id: this process's index among them (its rank).
        num_replicas_in_sync: how many model replicas train together (the world size).
    """

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """The batch size of one replica.

        Raises:
            ValueError: if `global_batch_size` is not divisible by the number of replicas.
        """
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(
                f"The global batch size {global_batch_size} is not divisible by the "
                f"{self.num_replicas_in_sync} replicas; set global_batch_size to a multiple of "
                f"{self.num_replicas_in_sync}."
            )
        return global_batch_size // self.num_replicas_in_sync


class ShardSampler(Sampler[int]):
    """Every `num_replicas`-th example from `rank` on, in order, without padding: the shards of
    all processes together hold each example exactly once (``DistributedSampler`` pads shards
    to equal length by repeating examples, which would count some twice in an evaluation)."""

    def __init__(self, length: int, num_replicas: int, rank: int) -> None:
        self.length, self.num_replicas, self.rank = length, num_replicas, rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.num_replicas))


def build_dataloader(dataset: Dataset[Any], params: Any,
                     input_context: InputContext | None = None,
                     seed: int = 0) -> DataLoader[Any]:
    """A DataLoader over this process's share of `dataset`, as a `DataConfig` describes it.

    Training data (``params.is_training``) is shuffled unless ``params.shuffle`` says otherwise,
    with its own generator seeded by ``params.seed`` (else `seed`), so its order is part of the
    checkpoint. With several processes each reads its shard: training data through a
    ``DistributedSampler``, evaluation data through a `ShardSampler`, so that an evaluation over
    all processes sees every example exactly once (shards may differ by one batch; metrics are
    summed across processes at the end). Where CUDA is available, batches come in pinned memory,
    so that copying them to the GPU does not block the host.
    """
    context = input_context or InputContext()
    training = bool(params.is_training)
    shuffle = training if params.shuffle is None else bool(params.shuffle)
    seed = params.seed if params.seed is not None else seed
    sampler: Sampler[int] | None = None
    if context.num_input_pipelines > 1 and training:
        sampler = DistributedSampler(dataset, context.num_input_pipelines,
                                     context.input_pipeline_id, shuffle=shuffle, seed=seed)
    elif context.num_input_pipelines > 1:
        sampler = ShardSampler(len(dataset),  # type: ignore[arg-type]
                               context.num_input_pipelines, context.input_pipeline_id)
    return DataLoader(
        dataset,
        batch_size=context.get_per_replica_batch_size(params.global_batch_size),
        shuffle=shuffle if sampler is None else None,
        sampler=sampler,
        drop_last=params.drop_remainder,
        num_workers=params.num_workers,
        pin_memory=torch.cuda.is_available(),
        generator=torch.Generator().manual_seed(seed) if sampler is None else None,
    )


def split_inputs(inputs: Any) -> tuple[Any, Any]:
    """``(features, labels)`` from a batch: a pair is split, anything else is both."""
    if isinstance(inputs, (tuple, list)) and len(inputs) == 2:
        return inputs[0], inputs[1]
    return inputs, inputs


def aux_losses_of(model: Any) -> Any:
    """``model.aux_losses`` when the model has them (e.g. set in ``forward``), else None.

    Same answer as ``getattr(model, "aux_losses", None)``, without its cost on an ``nn.Module``
    that has none: there a missing attribute raises (and formats) an ``AttributeError`` inside
    ``__getattr__``, about a microsecond in every step.
    """
    if isinstance(model, nn.Module):
        if "aux_losses" in vars(model):
            return vars(model)["aux_losses"]
        if not (hasattr(type(model), "aux_losses") or "aux_losses" in model._parameters
                or "aux_losses" in model._buffers or "aux_losses" in model._modules):
            return None
    return getattr(model, "aux_losses", None)


def accepts_argument(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` can be called with the keyword argument `name`."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


class Task(Module):
    """A single-process description of what to train.

    Args:
        params: the task's config (a `cadence.config.TaskConfig` or a subclass).
        logging_dir: where the task may write its own files (the model directory).
        name: the module name; defaults to ``params.name`` or the class name.

    Attributes:
        loss: the key of the training loss in `train_step`'s logs.
    """

    loss = "loss"

    def __init__(self, params: Any, logging_dir: str | None = None,
                 name: str | None = None) -> None:
        super().__init__(name=name or getattr(params, "name", None))
        self._task_config = params
        self._logging_dir = logging_dir or ""

    _TRACKING_IGNORED = frozenset({"_task_config", "_logging_dir"})

    @property
    def task_config(self) -> Any:
        """The task's config."""
        return self._task_config

    @property
    def logging_dir(self) -> str:
        """Where the task may write files ("" = the working directory)."""
        return self._logging_dir

    # ------------------------------------------------------------------ building

    def initialize(self, model: nn.Module) -> None:
        """Runs only when the model directory has no checkpoint: loads
        ``task_config.init_checkpoint`` into `model` if it is set.

        The path may be a ``.safetensors`` file (a best export), a best-export directory, a
        cadence checkpoint directory or a directory of them (the newest is used). Override to
        load part of a model (a backbone).
        """
        path = getattr(self.task_config, "init_checkpoint", "")
        if not path:
            return
        from cadence.exporter import load_weights

        load_weights(model, path)
        logger.info("Initialized the model from %s.", path)

    def build_model(self) -> nn.Module:
        """Returns the model (an ``nn.Module``)."""
        raise NotImplementedError(
            f"{type(self).__name__}.build_model() is not implemented: return the model, or pass "
            "one to Trainer(model=...)."
        )

    def build_inputs(self, params: Any, input_context: InputContext | None = None) -> Any:
        """Returns the data for `params` (a `DataConfig`): a DataLoader or any iterable of
        batches, sized for one process (see `InputContext.get_per_replica_batch_size`)."""
        raise NotImplementedError(
            f"{type(self).__name__}.build_inputs() is not implemented: return a DataLoader (or "
            "any iterable of batches) for the given DataConfig."
        )

    def build_losses(self, labels: Any, model_outputs: Any, aux_losses: Any = None) -> Any:
        """The loss to minimize; the default is the sum of `aux_losses` (0 without any)."""
        if aux_losses is None:
            return torch.zeros(())
        if isinstance(aux_losses, torch.Tensor):
            return aux_losses
        return torch.stack([torch.as_tensor(loss) for loss in aux_losses]).sum()

    def build_metrics(self, training: bool = True) -> Mapping[str, Any]:
        """Metrics by name, built once for training and once for evaluation. Each needs
        ``update_state(labels, model_outputs)``, ``result()`` and ``reset()``."""
        return {}

    def process_metrics(self, metrics: Mapping[str, Any] | None, labels: Any,
                        model_outputs: Any, **kwargs: Any) -> None:
        """Updates every metric with ``update_state(labels, model_outputs)``."""
        for name, metric in (metrics or {}).items():
            update = getattr(metric, "update_state", None)
            if update is None:
                raise TypeError(
                    f"Metric {name!r} ({type(metric).__name__}) has no update_state(labels, "
                    "outputs); update it in train_step/validation_step, or use a metric such "
                    "as cadence.Accuracy."
                )
            update(labels, model_outputs)

    # ------------------------------------------------------------------ steps

    def train_step(self, inputs: Any, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                   metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One training step's forward pass: returns logs with the loss under `self.loss`.

        The loss keeps its gradient, so the `Trainer` does the update (see the module
        docstring). Override to update the weights yourself with `optimizer`.
        """
        features, labels = split_inputs(inputs)
        outputs = model(features)
        loss = self.build_losses(labels, outputs, aux_losses=aux_losses_of(model))
        self.process_metrics(metrics, labels, outputs)
        return {self.loss: loss}

    def validation_step(self, inputs: Any, model: nn.Module,
                        metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One evaluation step: returns logs with the loss; may add tensors for
        `aggregate_logs`."""
        features, labels = split_inputs(inputs)
        outputs = self.inference_step(features, model)
        loss = self.build_losses(labels, outputs, aux_losses=aux_losses_of(model))
        self.process_metrics(metrics, labels, outputs)
        return {self.loss: loss}

    def inference_step(self, inputs: Any, model: nn.Module) -> Any:
        """The model's outputs for `inputs` (the model is in eval mode)."""
        return model(inputs)

    # ------------------------------------------------------------------ host-side aggregation

    def aggregate_logs(self, state: Any = None, step_logs: Any = None) -> Any:
        """Folds one evaluation step's logs into `state` on the host, for metrics that cannot
        be computed on the device. Returns the new state; the default keeps None."""
        return None

    def reduce_aggregated_logs(self, aggregated_logs: Any,
                               global_step: int | None = None) -> dict[str, Any]:
        """Turns the aggregated state into metrics at the end of an evaluation."""
        return {}
