"""The tensorpack front-end (seed 003): epoch-scheduled trainers driven by callbacks.

The base `Trainer` runs a double loop, ``max_epoch`` epochs of ``steps_per_epoch`` calls of
`run_step`; an *epoch* is the callback period, not a pass over the data (the input repeats).
Everything besides the step -- checkpoints, validation, schedules, monitors, progress -- is a
`cadence.Callback`, the same class every front-end uses. The order of one training::

    on_train_begin                       (tensorpack: _before_train)
    for epoch in starting_epoch .. max_epoch:
        on_epoch_begin                   (_before_epoch)
        for local_step in range(steps_per_epoch):
            on_step_begin                (_before_run; only if a callback overrides it)
            run_step()                   the override point: one logical step
            on_step_end                  (_after_run + _trigger_step)
        on_epoch_end                     (_after_epoch + _trigger_epoch: savers, inference...)
        on_loop_end(epoch's scalars)     monitors: JSON, TensorBoard, printer, progress bar
    on_train_end                         (_after_train; runs on every exit)

`StopTraining` raised by `run_step` or a callback -- or ``state.request_stop`` -- ends training
cleanly *after* that epoch's end callbacks run (tensorpack skipped them, so its final checkpoint
and validation were lost). The global step counts logical steps: a GAN step that updates the
discriminator twice and the generator once is one step (tensorpack counted session runs).

`SingleCostTrainer` / `SimpleTrainer` train a `ModelDesc` (or any cost function) from an input
source; `TrainConfig` and `launch_train_with_config` are the declarative entry point, and resume
from the newest checkpoint in ``logdir`` -- model, optimizer, epoch, step, data position, random
state and every callback's state.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cadence.callbacks.progress import ProgressBar
from cadence.core.callbacks import Callback, CallbackList, RunState
from cadence.core.errors import Preempted
from cadence.core.logs import humanize_duration, to_host
from cadence.core.rank import process_rank
from cadence.core.signals import stop_on_signals
from cadence.core.summary import import_writer
from cadence.data.iterator import DataIterator
from cadence.engine.metrics import Mean
from cadence.engine.module import Module

logger = logging.getLogger("cadence")


class StopTraining(Exception):
    """Raise from `Trainer.run_step` or a callback to end training cleanly (after the current
    epoch's end callbacks)."""


class _Counters:
    """The trainer's position, saved in checkpoints."""

    def __init__(self) -> None:
        self.global_step = 0
        self.epoch_num = 0
        self.epoch_steps_done = 0

    def state_dict(self) -> dict[str, Any]:
        return {"global_step": self.global_step, "epoch_num": self.epoch_num,
                "epoch_steps_done": self.epoch_steps_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])
        self.epoch_num = int(state["epoch_num"])
        self.epoch_steps_done = int(state["epoch_steps_done"])


def default_callbacks() -> list[Callback]:
    """tensorpack's ``DEFAULT_CALLBACKS``, in cadence: the progress bar (on a terminal)."""
    return [ProgressBar()]


def default_monitors() -> list[Callback]:
    """tensorpack's ``DEFAULT_MONITORS``: TensorBoard, JSON lines and a printed line."""
    from cadence.callbacks import JSONWriter, ScalarPrinter, TensorBoardWriter

    return [TensorBoardWriter(), JSONWriter(), ScalarPrinter()]


class Trainer(Module):
    """tensorpack's base trainer: `run_step` repeated over epochs, with callbacks.

    Subclass it and override `run_step` (and `epoch_logs` to report per-epoch scalars).
    Stateful attributes (models, optimizers, input iterators) are checkpointed automatically,
    as for every `cadence.Module`.

    Args:
        logdir: where callbacks write by default (checkpoints, summaries, ``stats.jsonl``) and
            where training resumes from.
    """

    _TRACKING_IGNORED = frozenset({"callbacks", "state", "logdir", "_setup_done", "_trained"})

    def __init__(self, logdir: str | Path | None = None, name: str | None = None) -> None:
        super().__init__(name=name)
        self.logdir = Path(logdir) if logdir is not None else None
        self.callbacks = CallbackList()
        self.state = RunState(trainer=self)
        self._counters = _Counters()
        self._setup_done = False
        self._trained = False
        self.steps_per_epoch = 0
        self.max_epoch = 0
        if self.logdir is not None and self.is_chief:
            import_writer()  # the default monitors write summaries there; not in epoch 1

    def checkpoint_items(self) -> dict[str, Any]:
        """The public stateful attributes (models, optimizers, ...) and the counters; the
        callbacks are saved beside them, by the checkpoint manager."""
        items = {k: v for k, v in super().checkpoint_items().items() if k != "callbacks"}
        return {**items, "counters": self._counters}

    # ------------------------------------------------------------------ counters

    @property
    def is_chief(self) -> bool:
        """Whether this process is rank 0 (it alone writes summaries and exports)."""
        return process_rank() == 0

    @property
    def global_step(self) -> int:
        """Logical steps done (one per `run_step`)."""
        return self._counters.global_step

    @property
    def epoch_num(self) -> int:
        """The epoch running (the last one finished, before and after the loop)."""
        return self._counters.epoch_num

    @property
    def local_step(self) -> int:
        """The index of the current step inside its epoch (from 0)."""
        return self._counters.epoch_steps_done

    # ------------------------------------------------------------------ callbacks

    def register_callback(self, callback: Callback | Iterable[Callback]) -> bool:
        """Adds callbacks (before `setup_callbacks`). Returns True.

        Raises:
            RuntimeError: after the callbacks were set up.
            ValueError: if a callback reads a metric that a later one produces.
        """
        if self._setup_done:
            raise RuntimeError("register_callback() must come before setup_callbacks().")
        for cb in [callback] if isinstance(callback, Callback) else list(callback):
            self.callbacks.append(cb)
        return True

    def setup_callbacks(self, callbacks: Iterable[Callback],
                        monitors: Iterable[Callback] = ()) -> None:
        """Registers `callbacks`, then `monitors` (last, so that they see what every other
        callback recorded). Call once."""
        if self._setup_done:
            raise RuntimeError("setup_callbacks() can be called only once.")
        self.register_callback(list(callbacks))
        self.register_callback(list(monitors))
        self._setup_done = True

    # ------------------------------------------------------------------ the step

    def run_step(self) -> None:
        """One logical training step; override it."""
        raise NotImplementedError(
            f"{type(self).__name__}.run_step() is not implemented: override it, or use "
            "SimpleTrainer with a cost function."
        )

    def epoch_logs(self) -> dict[str, Any]:
        """Scalars the trainer itself reports for the epoch that just ended (e.g. the mean
        cost), as tensors or numbers; reset them here."""
        return {}

    # ------------------------------------------------------------------ resume and init

    def checkpoint_dir(self) -> Path | None:
        """Where `cadence.callbacks.ModelSaver` writes by default: ``<logdir>/checkpoints``."""
        return self.logdir / "checkpoints" if self.logdir is not None else None

    def resume_or_initialize(self, session_init: str | Path | None = None) -> str | None:
        """Restores the newest checkpoint in `checkpoint_dir` (everything, callbacks included);
        without one, loads the weights at `session_init` into ``self.model``.

        Returns:
            The restored checkpoint's path, or None.
        """
        directory = self.checkpoint_dir()
        if directory is not None:
            from cadence.callbacks.savers import checkpoint_manager_for

            manager = checkpoint_manager_for(self.state, directory)
            latest = manager.latest_checkpoint
            if latest is not None:
                manager.restore(latest)
                logger.info("Resumed from %s: epoch %d, global step %d.", latest,
                            self.epoch_num, self.global_step)
                if session_init:
                    logger.info("Not loading session_init=%s: resuming instead.", session_init)
                return latest
        if session_init:
            from cadence.engine.exporter import load_weights

            model = getattr(self, "model", None)
            if not isinstance(model, nn.Module):
                raise ValueError("session_init loads weights into `self.model`, which this "
                                 "trainer does not have.")
            load_weights(model, session_init)
            logger.info("Initialized the model from %s.", session_init)
        return None

    # ------------------------------------------------------------------ the loop

    def train(self, callbacks: Iterable[Callback] = (), monitors: Iterable[Callback] = (),
              session_init: str | Path | None = None, steps_per_epoch: int | None = None,
              starting_epoch: int = 1, max_epoch: int = 9999999) -> None:
        """`setup_callbacks`, `resume_or_initialize` (which may move `starting_epoch` on),
        then `main_loop`."""
        if steps_per_epoch is None:
            raise ValueError("`steps_per_epoch` is required.")
        self.setup_callbacks(callbacks, monitors)
        self.resume_or_initialize(session_init)
        self.main_loop(steps_per_epoch, starting_epoch, max_epoch)

    def train_with_defaults(self, *, callbacks: Iterable[Callback] | None = None,
                            monitors: Iterable[Callback] | None = None,
                            session_init: str | Path | None = None,
                            steps_per_epoch: int | None = None, starting_epoch: int = 1,
                            max_epoch: int = 9999999,
                            extra_callbacks: Iterable[Callback] | None = None) -> None:
        """`train` with tensorpack's defaults: `default_callbacks` appended to `callbacks` and
        `default_monitors` (those need a `logdir`; without one only the printer is used)."""
        extra = list(extra_callbacks) if extra_callbacks is not None else default_callbacks()
        if monitors is None:
            from cadence.callbacks import ScalarPrinter

            monitors = default_monitors() if self.logdir is not None else [ScalarPrinter()]
        self.train([*(callbacks or []), *extra], monitors, session_init, steps_per_epoch,
                   starting_epoch, max_epoch)

    def main_loop(self, steps_per_epoch: int, starting_epoch: int = 1,
                  max_epoch: int = 9999999, handle_signals: bool = True) -> None:
        """Runs the epochs; see the module docstring for the order of callbacks.

        A restored position wins over `starting_epoch`: a run resumed from a checkpoint taken
        at an epoch's end starts with the next epoch, one taken mid-epoch continues that epoch.
        SIGTERM or Ctrl-C stops after the current step; the epoch's end callbacks run, a
        checkpoint is saved in `checkpoint_dir` (with a `logdir`), and `Preempted` is raised.

        Raises:
            ValueError: for negative `steps_per_epoch` or `max_epoch`.
            RuntimeError: if called twice.
            Preempted: after SIGTERM or SIGINT.
        """
        for name, value in (("steps_per_epoch", steps_per_epoch), ("max_epoch", max_epoch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` (got {value!r}) must be a non-negative int.")
        if self._trained:
            raise RuntimeError("main_loop() can run once per trainer; create a new trainer.")
        self._trained = True
        counters, state = self._counters, self.state
        first_epoch, first_step = starting_epoch, 0
        if counters.epoch_num > 0:  # restored
            if counters.epoch_steps_done >= steps_per_epoch:
                first_epoch = counters.epoch_num + 1
            else:
                first_epoch, first_step = counters.epoch_num, counters.epoch_steps_done
        self.steps_per_epoch, self.max_epoch = steps_per_epoch, max_epoch
        remaining = max(max_epoch - first_epoch + 1, 0) * steps_per_epoch - first_step
        state.target_step = counters.global_step + max(remaining, 0)
        state.extra["last_epoch"] = max_epoch
        state.epoch = first_epoch - 1
        state.global_step = counters.global_step
        if counters.global_step:
            logger.info("Start training with global_step=%d.", counters.global_step)
        self.callbacks.fire("on_train_begin", state)
        step_hooks = self.callbacks if self.callbacks.has_step_hooks else None
        signals = contextlib.ExitStack()
        received = signals.enter_context(stop_on_signals(state, handle_signals))
        try:
            for epoch in range(first_epoch, max_epoch + 1):
                if state.stop_requested:
                    break
                counters.epoch_num = state.epoch = epoch
                if epoch != first_epoch or first_step == 0:
                    counters.epoch_steps_done = 0
                logger.info("Start Epoch %d ...", epoch)
                self.callbacks.fire("on_epoch_begin", state)
                start = time.perf_counter()
                while counters.epoch_steps_done < steps_per_epoch and not state.stop_requested:
                    if step_hooks is not None:
                        state.global_step = counters.global_step
                        step_hooks.fire("on_step_begin", state)
                    try:
                        self.run_step()
                    except StopTraining as stop:
                        state.request_stop(str(stop) or "StopTraining")
                        break
                    counters.global_step += 1
                    counters.epoch_steps_done += 1
                    if step_hooks is not None:
                        state.global_step = counters.global_step
                        step_hooks.fire("on_step_end", state)
                state.global_step = counters.global_step
                logger.info("Epoch %d (global_step %d) finished, time: %s.", epoch,
                            counters.global_step, humanize_duration(time.perf_counter() - start))
                logs = to_host(self.epoch_logs())  # once per epoch: the host reads the means
                state.put_metrics(logs)
                try:
                    self.callbacks.fire("on_epoch_end", state)
                except StopTraining as stop:
                    state.request_stop(str(stop) or "StopTraining")
                self.callbacks.fire("on_loop_end", state, logs)
            if state.stop_requested:
                logger.info("Training was stopped: %s.", state.stop_reason)
            else:
                logger.info("Training has finished!")
            saved = None
            directory = self.checkpoint_dir()
            if received and directory is not None:
                from cadence.callbacks.savers import checkpoint_manager_for

                saved = checkpoint_manager_for(state, directory).save(
                    counters.global_step)  # returns the existing one if a saver just wrote it
        except KeyboardInterrupt:
            logger.info("Detected Ctrl-C: training stops.")
            raise
        finally:
            signals.close()
            for callback in self.callbacks.hooked("on_train_end"):
                try:
                    callback.on_train_end(state)
                except Exception:  # one failing teardown must not skip the others
                    logger.exception("%s.on_train_end failed.", type(callback).__name__)
        if received:
            raise Preempted(received[0], saved)


class ModelDesc(nn.Module):
    """A model that knows its cost and its optimizer (tensorpack's ``ModelDesc``).

    Override `build_graph` (the inputs of one batch -> a scalar cost) and `optimizer`.
    """

    def build_graph(self, *inputs: Any) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__}.build_graph(*inputs) must return the "
                                  "scalar cost.")

    def optimizer(self) -> torch.optim.Optimizer:
        raise NotImplementedError(f"{type(self).__name__}.optimizer() must return an optimizer "
                                  "over self.parameters().")


class SingleCostTrainer(Trainer):
    """Minimizes one scalar cost: set it up with `setup_graph`, then train.

    Each step takes the next batch from the input (starting a new pass when one ends: the input
    repeats), computes ``cost = get_cost_fn(*batch)``, and updates with the optimizer. The mean
    cost of each epoch is reported as ``cost``.
    """

    _TRACKING_IGNORED = frozenset({"_cost_fn"})

    def __init__(self, logdir: str | Path | None = None, name: str | None = None) -> None:
        super().__init__(logdir, name)
        self._cost_fn: Callable[..., torch.Tensor] | None = None
        self.cost = Mean()

    def checkpoint_items(self) -> dict[str, Any]:
        items = super().checkpoint_items()
        data = getattr(self, "_data", None)
        return {**items, "data": data} if data is not None else items

    @property
    def examples_per_step(self) -> int | None:
        data = getattr(self, "_data", None)
        return data.batch_size if data is not None else None

    def setup_graph(self, inputs: Any, get_cost_fn: Callable[..., torch.Tensor],
                    get_opt_fn: Callable[..., torch.optim.Optimizer],
                    model: nn.Module | None = None) -> None:
        """Sets the input source, the cost and the optimizer (once).

        Args:
            inputs: a `DataFlow`, a DataLoader, a list of batches, ... (its position is
                checkpointed).
            get_cost_fn: ``(*batch) -> scalar cost``.
            get_opt_fn: returns the optimizer; called once, with the model's parameters if it
                takes an argument.
            model: the model (checkpointed, exported, evaluated by callbacks); default
                `get_cost_fn`'s owner when it is a bound method of an ``nn.Module``.

        Raises:
            RuntimeError: if called twice.
        """
        if self._cost_fn is not None:
            raise RuntimeError("setup_graph() can be called only once.")
        if model is None:
            owner = getattr(get_cost_fn, "__self__", None)
            model = owner if isinstance(owner, nn.Module) else None
        self.model = model
        self._cost_fn = get_cost_fn
        takes_params = bool(inspect.signature(get_opt_fn).parameters)
        if takes_params and model is None:
            raise ValueError("get_opt_fn takes parameters but there is no model: pass model=.")
        self.optimizer = get_opt_fn(model.parameters()) if takes_params and model is not None \
            else get_opt_fn()
        self._data = DataIterator(inputs)

    def next_inputs(self) -> tuple[Any, ...]:
        """The next batch, as a tuple; a new pass starts when the input runs out.

        Raises:
            ValueError: if a pass of the input yields no batch.
        """
        try:
            batch = self._data.next_in_pass()
        except StopIteration:  # the input repeats
            batch = self._data.next_in_pass()
        if self._data.batches == self._data.pass_length:  # a sized input: end the pass now
            self._data.end_pass()
        return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)

    def run_step(self) -> None:
        if self._cost_fn is None:
            raise RuntimeError("Call setup_graph() (or launch_train_with_config) first.")
        cost = self._cost_fn(*self.next_inputs())
        if not isinstance(cost, torch.Tensor) or cost.dim() != 0:
            raise ValueError(f"The cost function must return a scalar tensor; got "
                             f"{getattr(cost, 'shape', type(cost).__name__)}.")
        self.optimizer.zero_grad(set_to_none=True)
        cost.backward()
        self.optimizer.step()
        self.cost.update(cost.detach())

    def epoch_logs(self) -> dict[str, Any]:
        logs = {"cost": self.cost.result()} if self.cost._state else {}
        self.cost.reset()
        return logs


def cost_from_model(model: nn.Module,
                    loss_fn: Callable[[Any, Any], torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A cost function for `SingleCostTrainer.setup_graph` from a model and a loss:
    ``(inputs, labels) -> loss_fn(model(inputs), labels)``."""

    def cost(inputs: Any, labels: Any) -> torch.Tensor:
        return loss_fn(model(inputs), labels)

    return cost


class SimpleTrainer(SingleCostTrainer):
    """The single-process `SingleCostTrainer` (tensorpack's ``SimpleTrainer``)."""


@dataclass
class TrainConfig:
    """What `launch_train_with_config` trains, and how (tensorpack's ``TrainConfig``).

    Attributes:
        model: a `ModelDesc`.
        dataflow: the input (a `DataFlow`, DataLoader, list of batches...); `data` is an alias.
        callbacks: callbacks, in order.
        extra_callbacks: appended to `callbacks`; None means `default_callbacks()`.
        monitors: None means `default_monitors()` (with a `logdir`).
        steps_per_epoch: steps per epoch; None: one pass over the input (its length).
        starting_epoch: the first epoch of a fresh run.
        max_epoch: the last epoch.
        session_init: weights to start from (a ``.safetensors`` file, an export directory or
            a checkpoint) when `logdir` has no checkpoint to resume.
        logdir: where checkpoints, summaries and ``stats.jsonl`` go; training resumes from it.
    """

    model: ModelDesc | None = None
    dataflow: Any = None
    data: Any = None
    callbacks: Sequence[Callback] = field(default_factory=list)
    extra_callbacks: Sequence[Callback] | None = None
    monitors: Sequence[Callback] | None = None
    steps_per_epoch: int | None = None
    starting_epoch: int = 1
    max_epoch: int = 99999
    session_init: str | Path | None = None
    logdir: str | Path | None = None

    def __post_init__(self) -> None:
        if (self.dataflow is None) == (self.data is None):
            raise ValueError("TrainConfig needs exactly one of `dataflow` and `data`.")
        if self.model is not None and not isinstance(self.model, ModelDesc):
            raise TypeError(f"`model` (got {type(self.model).__name__}) must be a "
                            "cadence.tensorpack.ModelDesc.")
        for name in ("callbacks", "extra_callbacks", "monitors"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (list, tuple)):
                raise TypeError(f"`{name}` must be a list of callbacks.")
        if self.steps_per_epoch is None:
            try:
                self.steps_per_epoch = len(self.input)
            except TypeError:
                raise ValueError("The input has no length: set steps_per_epoch.") from None

    @property
    def input(self) -> Any:
        """The input source."""
        return self.dataflow if self.dataflow is not None else self.data


def launch_train_with_config(config: TrainConfig, trainer: SingleCostTrainer) -> None:
    """Sets up `trainer` with the config's model and input and trains it with the defaults;
    resumes from the newest checkpoint in the config's `logdir`.

    Raises:
        TypeError: if `trainer` is not a `SingleCostTrainer` or the config has no model.
    """
    if not isinstance(trainer, SingleCostTrainer):
        raise TypeError(f"`trainer` (got {type(trainer).__name__}) must be a SingleCostTrainer "
                        "such as SimpleTrainer().")
    if config.model is None:
        raise TypeError("TrainConfig.model is required: a ModelDesc.")
    if config.logdir is not None:
        trainer.logdir = Path(config.logdir)
    trainer.setup_graph(config.input, config.model.build_graph, config.model.optimizer,
                        model=config.model)
    trainer.train_with_defaults(
        callbacks=list(config.callbacks), monitors=config.monitors,
        session_init=config.session_init, steps_per_epoch=config.steps_per_epoch,
        starting_epoch=config.starting_epoch, max_epoch=config.max_epoch,
        extra_callbacks=config.extra_callbacks,
    )
