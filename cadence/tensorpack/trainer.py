"""The tensorpack trainers (seed 003): `run_step` in epochs, on the engine's one outer loop.

A tensorpack `Trainer` is a `cadence.StandardTrainer` whose epochs have ``steps_per_epoch``
steps, driven by a `cadence.Controller`: each epoch is one inner loop, and everything besides
the step -- checkpoints, validation, schedules, monitors, progress -- is a `cadence.Callback`,
the same class every front-end uses. Resume, preemption and checkpoints are the Controller's.
The order of one training::

    on_train_begin                       (tensorpack: _before_train)
    for each epoch from starting_epoch to max_epoch:      # one loop of the Controller
        on_loop_begin
        on_epoch_begin                   (_before_epoch)
        steps_per_epoch times:
            on_step_begin                (_before_run; only if a callback overrides it)
            run_step()                   the override point: one logical step
            on_step_end                  (_after_run + _trigger_step)
        epoch_logs() reach the host      (the epoch's one sync; into state.metrics)
        on_epoch_end                     (_after_epoch + _trigger_epoch: savers, inference...)
        on_loop_end(epoch's scalars)     monitors: JSON, TensorBoard, printer, progress bar
    on_train_end                         (_after_train; runs on every exit)

`StopTraining` raised by `run_step` or any callback hook -- or ``state.request_stop`` -- ends
training cleanly *after* that epoch's end callbacks run (tensorpack skipped them, so its final
checkpoint and validation were lost). The global step counts logical steps: a GAN step that
updates the discriminator twice and the generator once is one step (tensorpack counted session
runs).

Checkpoints go to the directory of the run's `cadence.callbacks.ModelSaver`
(``checkpoint_dir``, default ``<logdir>/checkpoints``), and a run resumes from the newest one
there -- model, optimizer, epoch, step, data position, random state and every callback's state.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cadence.callbacks.logdir import resolve_directory
from cadence.callbacks.savers import ModelSaver
from cadence.core.arguments import check_items, check_path
from cadence.core.callbacks import Callback, CallbackList, RunState
from cadence.core.checkpoint_dir import DEFAULT_MAX_TO_KEEP
from cadence.core.controller import Controller
from cadence.core.intervals import check_int
from cadence.core.logs import humanize_duration
from cadence.core.rank import is_chief
from cadence.core.run_dir import RunDirectory
from cadence.core.summary import import_writer
from cadence.engine.checkpoint import CheckpointManager
from cadence.engine.distributed import average_gradients, broadcast_module
from cadence.engine.metrics import Mean
from cadence.engine.runner import Output
from cadence.engine.runtime import is_distributed
from cadence.engine.standard_runner import StandardTrainer
from cadence.records.run_record import RunRecord
from cadence.tensorpack.defaults import default_callbacks, default_monitors

logger = logging.getLogger("cadence")

def _model_savers(callbacks: Iterable[Callback]) -> list[ModelSaver]:
    """The `ModelSaver` callbacks among `callbacks`, also inside scheduling wrappers."""
    found = []
    for callback in callbacks:
        while not isinstance(callback, ModelSaver) and isinstance(
                getattr(callback, "callback", None), Callback):
            callback = callback.callback  # type: ignore[attr-defined]
        if isinstance(callback, ModelSaver):
            found.append(callback)
    return found


class Trainer(StandardTrainer):
    """tensorpack's base trainer: `run_step` repeated over epochs, with callbacks.

    Subclass it and override `run_step` (and `epoch_logs` to report per-epoch scalars). Its
    public stateful attributes (models, optimizers, metrics) are checkpointed, as for every
    `cadence.Module` (see `Module.checkpoint_items`).

    Args:
        logdir: the run's directory (`cadence.core.run_dir.RunDirectory`): where callbacks
            write by default (checkpoints, summaries, ``stats.jsonl``) and where training
            resumes from.
        name: the module name.

    Raises:
        TypeError: for a `logdir` that is not a path.
    """

    _TRACKING_IGNORED = frozenset({"logdir", "_setup_done", "_trained", "_controller",
                                   "_epoch_start", "_resumed_from", "_record"})
    train_runs_the_loop = False  # `train` is tensorpack's entry point: loops are train_steps

    def __init__(self, logdir: str | Path | None = None, name: str | None = None) -> None:
        StandardTrainer.__init__(self, None, name=name)
        self.logdir = check_path(type(self).__name__, "logdir", logdir,
                                 "the run's directory, e.g. logdir='runs/mnist'", none_ok=True)
        self.max_epoch = 0
        self._setup_done = False
        self._trained = False
        self._controller: Controller | None = None
        self._record: RunRecord | None = None
        """The run's record in `logdir`, while `train` runs."""
        self._epoch_start = 0.0
        if self.logdir is not None and is_chief():
            import_writer()  # the default monitors write summaries there; not in epoch 1

    # ------------------------------------------------------------------ counters and state

    @property
    def is_chief(self) -> bool:
        """Whether this process is rank 0 (it alone writes summaries and exports)."""
        return is_chief()

    @property
    def epoch_num(self) -> int:
        """The epoch running (the last one finished, before and after the loop)."""
        return self.progress.epoch

    @property
    def local_step(self) -> int:
        """The index of the current step inside its epoch (from 0)."""
        return self.progress.epoch_step

    @property
    def callbacks(self) -> CallbackList:
        """The registered callbacks (the Controller's, once training starts)."""
        return self._clock.callbacks

    @property
    def state(self) -> RunState:
        """The run state callbacks see (the Controller's, once one drives this trainer)."""
        return self._clock.state

    @property
    def controller(self) -> Controller | None:
        """The Controller driving this trainer, once `resume_or_initialize` built it."""
        return self._controller

    # ------------------------------------------------------------------ callbacks

    def register_callback(self, callback: Callback | Iterable[Callback]) -> bool:
        """Adds callbacks (before `setup_callbacks`). Returns True.

        A callback that implements only `trigger` is triggered at each epoch's end, as
        tensorpack's ``Callback._trigger_epoch`` does by default (`CallbackList`'s rule, the
        same under every front-end: `cadence.core.callbacks.triggers_only`).

        Raises:
            RuntimeError: after the callbacks were set up.
            ValueError: if a callback reads a metric that a later one produces.
        """
        if self._setup_done:
            raise RuntimeError("register_callback() must come before setup_callbacks().")
        for cb in [callback] if isinstance(callback, Callback) else list(callback):
            self._clock.callbacks.append(cb)
        return True

    def setup_callbacks(self, callbacks: Iterable[Callback],
                        monitors: Iterable[Callback] = ()) -> None:
        """Registers `callbacks`, then `monitors` (last, so that they see what every other
        callback recorded). Call once.

        Raises:
            RuntimeError: when called again.
            TypeError: for `callbacks` or `monitors` that are not lists of `Callback` objects.
        """
        if self._setup_done:
            raise RuntimeError("setup_callbacks() can be called only once.")
        owner = type(self).__name__
        for name, given in (("callbacks", callbacks), ("monitors", monitors)):
            self.register_callback(check_items(
                owner, name, given, "a list of cadence.Callback objects",
                f"e.g. {name}=[cadence.callbacks.ModelSaver()]",
                lambda one: isinstance(one, Callback)))
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

    def train_step(self, iterator: Any) -> None:
        """The engine's step: `run_step`."""
        self.run_step()

    def train_loop_begin(self) -> None:
        """A loop is an epoch: logs its start."""
        self._epoch_start = time.perf_counter()
        progress = self.progress
        logger.info("Start Epoch %d ...", progress.epoch + 1 if progress.epoch_finished
                    else progress.epoch)

    def train_loop_end(self) -> Output | None:
        """The epoch's logs: `epoch_logs` -- none for an epoch a pause cut short, whose
        scalars go on accumulating in the run that finishes it (they are checkpointed)."""
        if self.state.epoch_paused:
            logger.info("Epoch %d paused at global_step %d: it ends in the run that continues "
                        "it.", self.progress.epoch, self.global_step)
            return None
        logger.info("Epoch %d (global_step %d) finished, time: %s.", self.progress.epoch,
                    self.global_step, humanize_duration(time.perf_counter() - self._epoch_start))
        return self.epoch_logs()

    # ------------------------------------------------------------------ resume and init

    def checkpoint_dir(self) -> Path | None:
        """Where checkpoints are saved and resumed from: the run's `ModelSaver` directory, else
        ``<logdir>/checkpoints``; None without either.

        Raises:
            ValueError: if ModelSavers name different directories, or a ModelSaver has no
                directory and there is no logdir.
        """
        savers = _model_savers(self._clock.callbacks)
        directories = {resolve_directory(self.state, saver.checkpoint_dir, "ModelSaver",
                                         "checkpoints") for saver in savers}
        if len(directories) > 1:
            raise ValueError(f"ModelSavers write to {sorted(map(str, directories))}: a run "
                             "saves and resumes in one checkpoint directory; give them one.")
        if directories:
            return directories.pop()
        return RunDirectory(self.logdir).checkpoints if self.logdir is not None else None

    def resume_or_initialize(self, session_init: str | Path | None = None) -> str | None:
        """Builds the Controller that will drive this trainer, which restores the newest
        checkpoint in `checkpoint_dir` (everything, callbacks included); without one, loads the
        weights at `session_init` into ``self.model``.

        Returns:
            The restored checkpoint's path, or None.

        Raises:
            RuntimeError: if called twice.
        """
        if self._controller is not None:
            raise RuntimeError("resume_or_initialize() runs once per trainer.")
        directory = self.checkpoint_dir()
        manager = None
        if directory is not None:
            savers = _model_savers(self._clock.callbacks)
            keep = savers[0].max_to_keep if savers else DEFAULT_MAX_TO_KEEP
            manager = CheckpointManager(self, directory, max_to_keep=keep,
                                        init_fn=lambda: self._initialize(session_init),
                                        on_commit=self._record.timeline.commit
                                        if self._record is not None else None)
        # One line per epoch, as tensorpack: the monitors' (`ScalarPrinter`), not also the
        # Controller's loop line.
        self._controller = Controller(
            trainer=self, steps_per_loop=lambda step: max(self.steps_per_epoch or 1, 1),
            checkpoint_manager=manager, callbacks=self._clock.callbacks, log_loops=False,
            run_dir=RunDirectory(self.logdir) if self.logdir is not None else None,
            record=self._record)
        if manager is None:
            self._initialize(session_init)
            return None
        latest = manager.latest_checkpoint if self.global_step or self.progress.epoch else None
        if latest is not None:
            logger.info("Resumed from %s: epoch %d, global step %d.", latest, self.epoch_num,
                        self.global_step)
            if session_init:
                logger.info("Not loading session_init=%s: resuming instead.", session_init)
        return latest

    def _initialize(self, session_init: str | Path | None) -> None:
        if not session_init:
            return
        from cadence.engine.exporter import load_weights

        model = getattr(self, "model", None)
        if not isinstance(model, nn.Module):
            raise ValueError("session_init loads weights into `self.model`, which this "
                             "trainer does not have.")
        load_weights(model, session_init)
        logger.info("Initialized the model from %s.", session_init)

    # ------------------------------------------------------------------ training

    # tensorpack's train: not the runner protocol's, which the Controller reaches by its own
    # name (`train_steps`) -- the override of another signature is the point.
    def train(  # type: ignore[override]
        self, callbacks: Iterable[Callback] = (), monitors: Iterable[Callback] = (),
        session_init: str | Path | None = None, steps_per_epoch: int | None = None,
        starting_epoch: int = 1, max_epoch: int = 9999999,
    ) -> Output | None:
        """tensorpack's ``train``: `setup_callbacks`, `resume_or_initialize`, then `main_loop`.

        Orbit's runner protocol has a ``train(num_steps)`` too: the Controller that drives
        this trainer runs its loops with `StandardTrainer.train_steps`, the protocol's method
        by its own name, so this ``train`` is only tensorpack's.

        Raises:
            ValueError: before anything runs, if `steps_per_epoch` (required), `max_epoch` or
                `starting_epoch` is not a positive int, or `starting_epoch` is after
                `max_epoch`: such a schedule would train nothing.
            TypeError: before anything runs, for `callbacks` or `monitors` that are not lists
                of `Callback` objects, or a `session_init` that is not a path.
        """
        steps_per_epoch, max_epoch, starting_epoch = self._check_schedule(
            steps_per_epoch, max_epoch, starting_epoch)
        check_path(f"{type(self).__name__}.train", "session_init", session_init,
                   "a .safetensors file, an export directory or a checkpoint, e.g. "
                   "session_init='runs/pretrained/best'", none_ok=True)
        self.setup_callbacks(callbacks, monitors)
        with self._recording():
            self.resume_or_initialize(session_init)
            self.main_loop(steps_per_epoch, starting_epoch, max_epoch)
        return None

    @contextlib.contextmanager
    def _recording(self) -> Iterator[None]:
        """The run's record in `logdir` while training (its lock, and its timeline from the
        attempt's start to how it ends: ``cadence goodput LOGDIR``); nothing without one."""
        if self.logdir is None:
            yield
            return
        with RunRecord(self.logdir) as record:
            self._record = record
            try:
                yield
            finally:
                self._record = None

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

    def _check_schedule(self, steps_per_epoch: Any, max_epoch: Any,
                        starting_epoch: Any) -> tuple[int, int, int]:
        """Refuses a schedule that would train nothing or be misread: an epoch of no steps, no
        epoch to train, a count that is not an int (``max_epoch=2.5``, ``True``).

        Returns:
            ``(steps_per_epoch, max_epoch, starting_epoch)`` as plain ints.

        Raises:
            ValueError: with the argument, its value and the fix, on one line.
        """
        owner = f"{type(self).__name__}.train"
        steps = check_int(owner, "steps_per_epoch", steps_per_epoch,
                          "Pass the number of steps in one epoch, e.g. steps_per_epoch=100.")
        last = check_int(owner, "max_epoch", max_epoch,
                         "Pass the number of epochs to train, e.g. max_epoch=10.")
        first = check_int(owner, "starting_epoch", starting_epoch,
                          "Pass the first epoch of a fresh run, e.g. starting_epoch=1.")
        if first > last:
            raise ValueError(f"{owner}: `starting_epoch` (got {first}) is after `max_epoch` "
                             f"(got {last}), so no epoch would run. Pass a max_epoch of at "
                             f"least {first}.")
        return steps, last, first

    def main_loop(self, steps_per_epoch: int, starting_epoch: int = 1,
                  max_epoch: int = 9999999, handle_signals: bool = True) -> None:
        """Trains epochs `starting_epoch` .. `max_epoch` of `steps_per_epoch` steps with the
        Controller; see the module docstring for the order of callbacks.

        A restored position wins over `starting_epoch`: a run resumed from a checkpoint taken
        at an epoch's end starts with the next epoch, one taken mid-epoch continues that epoch.
        SIGTERM or Ctrl-C stops after the current step; the epoch's end callbacks run, a
        checkpoint is saved in `checkpoint_dir`, and `Preempted` is raised.

        Raises:
            ValueError: if `steps_per_epoch`, `max_epoch` or `starting_epoch` is not a positive
                int, or `starting_epoch` is after `max_epoch`.
            RuntimeError: if called twice.
            Preempted: after SIGTERM or SIGINT.
        """
        steps_per_epoch, max_epoch, starting_epoch = self._check_schedule(
            steps_per_epoch, max_epoch, starting_epoch)
        if self._trained:
            raise RuntimeError("main_loop() can run once per trainer; create a new trainer.")
        self._trained = True
        if self._controller is None:
            self.resume_or_initialize()
        controller = self._controller
        assert controller is not None
        progress = self.progress
        if progress.global_step == 0 and progress.epoch == 0:  # a fresh run
            self.clock.start_at_epoch(starting_epoch)
        self.steps_per_epoch, self.max_epoch = steps_per_epoch, max_epoch
        controller.handle_signals = handle_signals  # (the Controller records a resume)
        if self.global_step:
            logger.info("Start training with global_step=%d.", self.global_step)
        controller.train(epochs=max_epoch, checkpoint_at_completion=False)
        if self.state.stop_requested:
            logger.info("Training was stopped: %s.", self.state.stop_reason)
        else:
            logger.info("Training has finished!")


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
    cost of each epoch is reported as ``cost``. Under torchrun it is data-parallel (tensorpack's
    ``SyncMultiGPUTrainer``): the model starts as rank 0's on every rank and gradients are
    averaged over the ranks before each update; give each rank its own share of the input.
    """

    _TRACKING_IGNORED = frozenset({"_cost_fn", "_last_cost"})

    def __init__(self, logdir: str | Path | None = None, name: str | None = None) -> None:
        super().__init__(logdir, name)
        self._cost_fn: Callable[..., torch.Tensor] | None = None
        self._last_cost: torch.Tensor | None = None
        """The last step's cost, kept until the next one's: its graph keeps the parameters'
        gradient accumulators for the next forward (see `cadence.Trainer.train_step`)."""
        self._data_parallel = False
        self.cost = Mean()

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
        self.train_dataset = inputs
        self._data_parallel = is_distributed()  # asked once, not per step
        if model is not None:  # under torchrun: data-parallel, replicas start equal
            broadcast_module(model)

    def next_inputs(self) -> tuple[Any, ...]:
        """The next batch, as a tuple; a new pass starts when the input runs out.

        Raises:
            ValueError: if a pass of the input yields no batch.
        """
        data = self._train_data
        try:
            batch = data.next_in_pass()
        except StopIteration:  # the input repeats
            batch = data.next_in_pass()
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
        if self._data_parallel:  # every rank's gradient counts: replicas stay equal
            average_gradients(p for group in self.optimizer.param_groups for p in group["params"])
        self.optimizer.step()
        self.cost.update(cost)  # Mean keeps a detached value
        self._last_cost = cost

    def epoch_logs(self) -> dict[str, Any]:
        logs = {"cost": self.cost.result()} if self.cost.updated else {}
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
