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
counts the step. An override whose loss has no gradient and that updates no weight itself (a loss
computed under ``torch.no_grad()`` or ``.detach()``ed) would train nothing: its first step is an
error.

**What the hooks return is checked** where the `Trainer` first gets it, and never again: the
``build_*`` hooks' when it is built (`cadence.task.build_checks`), the steps' and
``process_metrics``' at their first call (`cadence.task.step_checks`). A mistake is one
`cadence.HookError` line naming the hook, what it returned and what it must return.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from cadence.core.logs import is_scalar
from cadence.data.sharding import InputContext
from cadence.engine.external_metrics import is_torchmetric
from cadence.engine.module import Module
from cadence.engine.parallelize import ParallelOptions, parallelize_model

logger = logging.getLogger("cadence")


def split_inputs(inputs: Any) -> tuple[Any, Any]:
    """``(features, labels)`` from a batch: a pair is split, anything else is both (a dict of
    ``input_ids``, ``attention_mask`` and ``labels``, as transformers users write batches, is
    the model's keyword arguments and the labels `Task.build_losses` gets)."""
    if isinstance(inputs, (tuple, list)) and len(inputs) == 2:
        return inputs[0], inputs[1]
    return inputs, inputs


_KEYWORD_CALLS: dict[tuple[type, tuple[Any, ...]], bool] = {}
"""Whether a model class's ``forward`` takes a batch's keys as keyword arguments, by class and
keys: found once (`inspect.signature` costs tens of microseconds), not in every step."""


def takes_keywords(model: nn.Module, keys: tuple[Any, ...]) -> bool:
    """Whether `model` (wrapped or not) is called with a mapping's `keys` as keyword arguments:
    each key names a parameter of its ``forward``, or the ``forward`` takes ``**kwargs``."""
    found = _KEYWORD_CALLS.get((type(model), keys))
    if found is None:
        from cadence.engine.parallelize import unwrap_model

        try:
            parameters = inspect.signature(unwrap_model(model).forward).parameters
        except (TypeError, ValueError):
            parameters = {}  # type: ignore[assignment]
        found = all(isinstance(key, str) for key in keys) and (
            all(key in parameters for key in keys) or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()))
        _KEYWORD_CALLS[(type(model), keys)] = found
    return found


def call_model(model: nn.Module, features: Any) -> Any:
    """``model(**features)`` for a mapping whose keys are ``forward``'s keyword arguments (a
    transformers batch: ``input_ids``, ``attention_mask``, ``labels``; see `takes_keywords`),
    else ``model(features)``. The outputs -- a transformers ``ModelOutput``, a dict, a tensor --
    are returned as they are."""
    if type(features) is not torch.Tensor and isinstance(features, Mapping) and (
            takes_keywords(model, tuple(features))):  # a tensor: no ABC check in every step
        return model(**features)
    return model(features)


_CLASS_HAS_AUX_LOSSES: dict[type, bool] = {}
"""Whether a model class defines ``aux_losses`` (a property, say), by class: asked once. A
dict, not ``functools.cache``: Dynamo traces this inside compiled steps and warns at a cache
wrapper."""


def aux_losses_of(model: Any) -> Any:
    """``model.aux_losses`` when the model has them (e.g. set in ``forward``), else None; the
    user's model's inside a ``DistributedDataParallel`` or ``torch.compile`` wrapper.

    Same answer as ``getattr(model, "aux_losses", None)``, without its cost on an ``nn.Module``
    that has none: there a missing attribute raises (and formats) an ``AttributeError`` inside
    ``__getattr__``, about a microsecond in every step. Whether the model's class defines it is
    asked once per class (a failed class lookup formats an error too).
    """
    if isinstance(model, nn.Module):
        if "module" in model._modules or "_orig_mod" in model._modules:
            from cadence.engine.parallelize import unwrap_model

            model = unwrap_model(model)
        if "aux_losses" in vars(model):
            return vars(model)["aux_losses"]
        cls = type(model)
        on_class = _CLASS_HAS_AUX_LOSSES.get(cls)
        if on_class is None:
            on_class = _CLASS_HAS_AUX_LOSSES[cls] = hasattr(cls, "aux_losses")
        if not (on_class or "aux_losses" in model._parameters
                or "aux_losses" in model._buffers or "aux_losses" in model._modules):
            return None
    return getattr(model, "aux_losses", None)


def merge_by_structure(values: list[Any]) -> Any:
    """One value from several of the same structure (see `Task.merge_aggregated_logs`).

    >>> merge_by_structure([{"ids": [1, 2], "n": 2}, {"ids": [3], "n": 1}])
    {'ids': [1, 2, 3], 'n': 3}

    Raises:
        TypeError: for values of different or unknown kinds.
    """
    first = values[0]
    if len(values) == 1:
        return first
    if isinstance(first, Mapping):
        return {key: merge_by_structure([value[key] for value in values]) for key in first}
    if isinstance(first, (list, tuple)):
        return type(first)(item for value in values for item in value)
    if isinstance(first, torch.Tensor):
        return torch.cat([value.reshape(-1, *value.shape[1:]) for value in values])
    if isinstance(first, np.ndarray):
        return np.concatenate(values)
    if is_scalar(first):
        return sum(values)
    raise TypeError(f"Cannot merge the ranks' aggregated logs of kind {type(first).__name__}: "
                    "override Task.merge_aggregated_logs.")


def accepts_argument(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` can be called with the keyword argument `name`."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def task_loss(task: Task, labels: Any, outputs: Any, model: nn.Module,
              metrics: Mapping[str, Any] | None, update_metrics: bool = True) -> torch.Tensor:
    """The loss of the model's `outputs` as the task builds it (``build_losses``, with the
    model's ``aux_losses``), the metrics updated (``process_metrics``) unless not
    `update_metrics` (a task with no metrics and the default ``process_metrics``: nothing to
    do)."""
    loss = task.build_losses(labels, outputs, aux_losses=aux_losses_of(model))
    if update_metrics:
        task.process_metrics(metrics, labels, outputs)
    return loss


def default_train_loss(task: Task, inputs: Any, model: nn.Module,
                       metrics: Mapping[str, Any] | None,
                       update_metrics: bool = True) -> torch.Tensor:
    """The default `Task.train_step`'s forward and loss, the one copy of it: the batch split
    into features and labels (`split_inputs`), the model called (`call_model`), its loss and
    metrics (`task_loss`). The `Trainer` runs it for a task that keeps the default step."""
    features, labels = split_inputs(inputs)
    outputs = call_model(model, features)
    return task_loss(task, labels, outputs, model, metrics, update_metrics)


class Task(Module):
    """A single-process description of what to train.

    Args:
        params: the task's config (a `cadence.TaskConfig` or a subclass).
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
        from cadence.engine.exporter import load_weights

        load_weights(model, path)
        logger.info("Initialized the model from %s.", path)

    def build_model(self) -> nn.Module:
        """Returns the model (an ``nn.Module``; anything else is a `cadence.HookError`)."""
        raise NotImplementedError(
            f"{type(self).__name__}.build_model() is not implemented: return the model, or pass "
            "one to Trainer(model=...)."
        )

    def parallelize(self, model: nn.Module, runtime: Any, options: ParallelOptions
                    ) -> nn.Module:
        """Spreads `model` over the ranks and wraps it for memory and speed; called once by
        the `Trainer`, before training, on the model on its device.

        Args:
            model: the model (``build_model``'s).
            runtime: where this process sits (`cadence.engine.runtime.Runtime`): its named mesh
                -- ``runtime.mesh_of("tp")``, ``runtime.mesh_of("dp_replicate", "dp_shard")``
                -- and its data coordinate; ``runtime.parallelism`` of the config made it.
            options: what the config asks for: the strategy (``runtime.strategy``, resolved),
                FSDP2's mixed precision (``runtime.fsdp``), per-block activation checkpointing
                (``runtime.activation_checkpointing``) and compile (``trainer.compile_blocks``).

        Returns:
            The module to train: `model`, changed in place (tensor parallelism, FSDP2,
            wrappers registered in its parents), or a wrapper around it (DDP). Checkpoints and
            exports hold `model`.

        The default is `cadence.parallelize_model`: tensor parallelism by the model's plan
        (where the mesh has ``tp``), then each repeated block (the children of an
        ``nn.ModuleList`` of one class: a transformer's layers) a unit of activation
        checkpointing, compile and FSDP2, the root keeping the rest, tied parameters together.
        Override to choose the blocks (``parallelize_model(model, runtime, options,
        blocks=[...])``), to give a tensor-parallel plan (``tp_plan={"layers.*.fc1":
        ColwiseParallel(), ...}``) or to apply parallelisms of your own (torchtitan's
        ``parallelize_*`` functions, Lightning's ``configure_model``) by dimension name.
        """
        return parallelize_model(model, runtime, options)

    def tokens_per_example(self) -> int | None:
        """Tokens in one training example (a language model's sequence length), for the
        throughput the `Trainer` logs at every loop's end (tokens per second per device); None
        (the default) where examples are not tokens."""
        return None

    def flops_per_token(self, model: nn.Module) -> float | None:
        """Training FLOPs per token of `model` (forward and backward), for the TFLOPS and MFU
        the `Trainer` logs (`cadence.engine.throughput`): for a decoder of N parameters, L
        layers, H heads of width Q and T tokens of context, ``6 N + 12 L H Q T`` (PaLM's
        appendix B, as torchtitan and nanoGPT count it); None (the default) where not known."""
        return None

    def build_inputs(self, params: Any, input_context: InputContext | None = None) -> Any:
        """Returns the data for `params` (a `DataConfig`): a DataLoader or any iterable of
        batches, sized for one process (see `InputContext.get_per_replica_batch_size`). None,
        or validation data of no batch, is a `cadence.HookError` when the `Trainer` is built."""
        raise NotImplementedError(
            f"{type(self).__name__}.build_inputs() is not implemented: return a DataLoader (or "
            "any iterable of batches) for the given DataConfig."
        )

    def build_losses(self, labels: Any, model_outputs: Any, aux_losses: Any = None) -> Any:
        """The loss to minimize -- a scalar tensor, with a gradient in training (the first step
        of each of the default steps checks it) -- from `labels` (the batch's, see
        `split_inputs`), the model's outputs as the model returned them (a tensor, a dict, a
        transformers ``ModelOutput``) and the model's `aux_losses` (see `aux_losses_of`).

        The default: the loss the model computed itself -- ``model_outputs["loss"]`` of a
        mapping that holds one, as a transformers model given ``labels`` returns -- plus the sum
        of `aux_losses`; 0 without either.
        """
        total = None
        if isinstance(model_outputs, Mapping) and model_outputs.get("loss") is not None:
            total = model_outputs["loss"]
        if aux_losses is not None:
            aux = (aux_losses if isinstance(aux_losses, torch.Tensor) else
                   torch.stack([torch.as_tensor(loss) for loss in aux_losses]).sum())
            total = aux if total is None else total + aux
        return torch.zeros(()) if total is None else total

    def build_metrics(self, training: bool = True) -> Mapping[str, Any]:
        """Metrics by name, built once for training and once for evaluation: cadence's
        (``update_state(labels, model_outputs)``, ``result()``, ``reset()``, ``all_reduce()``),
        or torchmetrics' ``Metric`` and ``MetricCollection`` objects (a ``MetricCollection`` may
        also be returned instead of the mapping: its metrics by name). The `Trainer` moves
        torchmetrics' to its device, reads them with ``compute()`` once per loop or evaluation
        (which gathers every rank's states) and resets them where it resets its own; see
        `cadence.engine.external_metrics`. Anything else is a `cadence.HookError` when the
        `Trainer` is built."""
        return {}

    def process_metrics(self, metrics: Mapping[str, Any] | None, labels: Any,
                        model_outputs: Any, **kwargs: Any) -> None:
        """Updates every metric with ``update_state(labels, model_outputs)``, or a torchmetrics
        metric with ``update(model_outputs, labels)``; returns None (an override that returns
        something is refused at its first call: to log values, return them from `train_step`).

        Raises:
            TypeError: for a metric that is neither.
        """
        for name, metric in (metrics or {}).items():
            if is_torchmetric(metric):
                metric.update(model_outputs, labels)  # torchmetrics' order: predictions first
                continue
            update = getattr(metric, "update_state", None)
            if update is None:
                raise TypeError(
                    f"Metric {name!r} ({type(metric).__name__}) has no update_state(labels, "
                    "outputs) and is not a torchmetrics Metric; update it in train_step/"
                    "validation_step, or use a metric such as cadence.Accuracy or "
                    "torchmetrics.classification.MulticlassAccuracy."
                )
            update(labels, model_outputs)

    # ------------------------------------------------------------------ steps

    def train_step(self, inputs: Any, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                   metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One training step's forward pass: returns logs with the loss under `self.loss`.

        The loss keeps its gradient, so the `Trainer` does the update (see the module
        docstring). A task that keeps this default never has it called by the `Trainer`, which
        runs the same forward (`default_train_loss`) and takes the loss without the logs dict;
        it is here for an override that calls ``super().train_step(...)`` and adds to the
        logs. Override to
        update the weights yourself with `optimizer`; an override that returns a loss without a
        gradient and updates nothing is refused at its first step (a `HookValueError` from the
        `Trainer`).
        """
        return {self.loss: default_train_loss(self, inputs, model, metrics)}

    def validation_step(self, inputs: Any, model: nn.Module,
                        metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One evaluation step: returns logs with the loss; may add tensors for
        `aggregate_logs`."""
        features, labels = split_inputs(inputs)
        outputs = self.inference_step(features, model)
        return {self.loss: task_loss(self, labels, outputs, model, metrics)}

    def inference_step(self, inputs: Any, model: nn.Module) -> Any:
        """The model's outputs for `inputs` (the model is in eval mode): ``model(**inputs)``
        for a mapping of ``forward``'s keyword arguments, else ``model(inputs)``
        (`call_model`)."""
        return call_model(model, inputs)

    # ------------------------------------------------------------------ host-side aggregation

    def aggregate_logs(self, state: Any = None, step_logs: Any = None) -> Any:
        """Folds one evaluation step's logs into `state` on the host, for metrics that cannot
        be computed on the device. Returns the new state; the default keeps None."""
        return None

    def merge_aggregated_logs(self, aggregated_logs: list[Any]) -> Any:
        """Combines the aggregated states of the ranks of a distributed evaluation (each rank
        folded its shard with `aggregate_logs`) into the one `reduce_aggregated_logs` gets.

        The default merges by structure: mappings key by key, lists and tuples by
        concatenation, arrays and tensors along their first axis, numbers by addition.
        Override it for a state of another kind.
        """
        return merge_by_structure(aggregated_logs)

    def reduce_aggregated_logs(self, aggregated_logs: Any,
                               global_step: int | None = None) -> dict[str, Any]:
        """Turns the aggregated state into metrics at the end of an evaluation."""
        return {}
