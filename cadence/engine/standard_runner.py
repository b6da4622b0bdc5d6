"""`StandardTrainer` and `StandardEvaluator`: the runners as begin / step / end templates.

`StandardTrainer.train(num_steps)` runs::

    train_loop_begin()
    clock.begin_loop(num_steps)
    while clock.begin_step():               # [on_epoch_begin] at the first step of an epoch,
                                            # on_step_begin (hooks only if some callback
                                            # overrides them); False: a stop was requested
        train_step(iterator)                # the iterator persists across calls
        clock.end_step(last batch of the pass?)  # global_step += 1, on_step_end,
                                            # [on_epoch_end] of an epoch that ends in mid-loop
    clock.end_loop()                        # under torchrun: the ranks agree on a stop
    logs = train_loop_end()
    [on_epoch_end]                          # an epoch that ended with the loop (or by a stop):
                                            # the Controller runs it once logs are on the host
    return logs

An epoch is a pass over the training data -- when a finite dataset (a DataLoader, a list) is
exhausted, the trainer ends the epoch and starts the next pass, or, with
``StandardTrainerOptions(stop_at_end_of_data=True)``, ends training cleanly -- or, with
``steps_per_epoch=N``, N steps over data that repeats.

Both runners also take a mapping (possibly nested) of datasets, as Orbit takes a nest of them,
and hand the step the same mapping of iterators (see `cadence.data.nested`).

`StandardEvaluator.evaluate(num_steps)` runs::

    state = eval_begin()
    repeat num_steps times, or until the data is exhausted if num_steps == -1:
        outputs = eval_step(iterator)       # a fresh iterator per evaluation by default
        state = eval_reduce(state, outputs) # always called, also when state is None
    return eval_end(state)                  # eval_end() if state is None

A class may inherit both: one object then trains and evaluates (as TF Model Garden's Trainer).
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from cadence.core.callbacks import CallbackList, RunState
from cadence.core.clock import RunClock
from cadence.core.errors import StepDiscarded, StopTraining
from cadence.core.hook_checks import check_output
from cadence.core.intervals import check_int
from cadence.core.progress import Progress
from cadence.data.iterator import DataIterator
from cadence.data.nested import NestedIterators, is_nested, iterate_nested
from cadence.engine.compile import check_compile_options, compile_step, feed_from_outside
from cadence.engine.distributed import collective_errors
from cadence.engine.external_metrics import compute_in_logs, holds_torchmetric
from cadence.engine.module import Module
from cadence.engine.runner import AbstractEvaluator, AbstractTrainer, Output
from cadence.engine.runtime import is_distributed
from cadence.engine.stop_agreement import StopAgreement

logger = logging.getLogger("cadence")


@dataclass(frozen=True)
class StandardTrainerOptions:
    """How `StandardTrainer` runs its inner loop.

    Attributes:
        compile_step: wrap `train_step` in ``torch.compile``.
        compile_mode: the ``torch.compile`` mode (None: torch's default).
        cuda_graphs: also capture the compiled step in CUDA graphs (needs CUDA; implies
            `compile_step`).
        stop_at_end_of_data: end training (cleanly) when the training data is exhausted,
            instead of starting another pass over it.
        prefetch_to_device: move each batch's tensors to this device one batch ahead, so that
            the copy of the next batch overlaps the step on this one (on CUDA: from pinned
            memory on a side stream). `train_step` then gets batches already on the device.
        steps_per_epoch: None: an epoch is a pass over the training data; N: an epoch is N
            steps, whatever the data's length (the default of `StandardTrainer.steps_per_epoch`).
        stop_check_steps: under torchrun, the ranks agree on a stop requested on any of them
            (a signal, a callback) every this many steps, inside a loop (and always at its end):
            a stop is taken within twice this many steps, by every rank at the same step.

    Raises:
        ValueError: for an unknown `compile_mode`, or `cuda_graphs` without CUDA.
    """

    compile_step: bool = False
    compile_mode: str | None = None
    cuda_graphs: bool = False
    stop_at_end_of_data: bool = False
    prefetch_to_device: torch.device | str | None = None
    steps_per_epoch: int | None = None
    stop_check_steps: int = 10

    def __post_init__(self) -> None:
        check_compile_options(self.compile_mode, self.cuda_graphs)
        owner = "StandardTrainerOptions"
        check_int(owner, "steps_per_epoch", self.steps_per_epoch,
                  "Pass None to make an epoch a pass over the data.", minimum=0, none_ok=True)
        check_int(owner, "stop_check_steps", self.stop_check_steps,
                  "Pass e.g. stop_check_steps=10.")


@dataclass(frozen=True)
class StandardEvaluatorOptions:
    """How `StandardEvaluator` runs an evaluation.

    Attributes:
        compile_step: wrap `eval_step` in ``torch.compile``.
        compile_mode: the ``torch.compile`` mode (None: torch's default).
        cuda_graphs: also capture the compiled step in CUDA graphs (needs CUDA).
        recreate_iterator_for_each_eval: start every evaluation at the beginning of the data
            (default); False continues the same iterator from one evaluation to the next.
        no_grad: run the evaluation under ``torch.no_grad()``.

    Raises:
        ValueError: for an unknown `compile_mode`, or `cuda_graphs` without CUDA.
    """

    compile_step: bool = False
    compile_mode: str | None = None
    cuda_graphs: bool = False
    recreate_iterator_for_each_eval: bool = True
    no_grad: bool = True

    def __post_init__(self) -> None:
        check_compile_options(self.compile_mode, self.cuda_graphs)


def _check_options(options: Any, cls: type) -> Any:
    if options is None:
        return cls()
    if not isinstance(options, cls):
        raise TypeError(f"`options` (got {type(options).__name__}) must be a {cls.__name__}.")
    return options


def _check_num_steps(num_steps: Any, allow_all: bool) -> int:
    if type(num_steps) is int and num_steps >= 0:  # the usual case, checked once per loop
        return num_steps
    if isinstance(num_steps, torch.Tensor):
        num_steps = int(num_steps)
    if allow_all:
        return check_int("evaluate", "num_steps", num_steps,
                         "Pass a number of steps, or -1 for all the data.", minimum=-1)
    return check_int("train", "num_steps", num_steps, "Pass a number of steps, e.g. 100.",
                     minimum=0)


class StandardTrainer(AbstractTrainer, metaclass=abc.ABCMeta):
    """Implements `train(num_steps)` with `train_loop_begin`, `train_step`, `train_loop_end`.

    It counts steps and epochs on a `cadence.core.clock.RunClock` it builds -- with callbacks
    and a run state of its own, or, once a `Controller` drives it (`bind`), with the
    Controller's, whose step and epoch hooks it then fires (see `cadence.core.progress` for what
    the numbers mean in every front-end). An epoch is a pass over the training data, or
    `steps_per_epoch` steps.

    Args:
        train_dataset: what the iterator passed to `train_step` iterates: a DataLoader, a list
            of batches, or any iterable; None when the step reads its own input. Its position is
            checkpointed (see `cadence.data.iterator`). A mapping of datasets gives the step a
            mapping of iterators, each repeating on its own (see `cadence.data.nested`).
        options: a `StandardTrainerOptions`.
        name: the module name.

    Raises:
        ValueError: for ``stop_at_end_of_data`` with a mapping of datasets (which one's end?).
    """

    _TRACKING_IGNORED = frozenset(
        {"_clock", "_own_clock", "_compiled_train_step", "_train_options"}
    )

    def __init__(
        self,
        train_dataset: Any,
        options: StandardTrainerOptions | None = None,
        name: str | None = None,
    ) -> None:
        Module.__init__(self, name=name)  # not super(): a class may also be a StandardEvaluator
        self._train_options = _check_options(options, StandardTrainerOptions)
        self._train_data = self._data_iterator(train_dataset)
        self._progress = Progress()
        self._steps_per_epoch: int | None = self._train_options.steps_per_epoch
        # Its own clock until a Controller drives it (then one with the Controller's callbacks
        # and state): it builds both, and it alone sets them.
        self._own_clock = self._new_clock(RunState(progress=self._progress, trainer=self),
                                          CallbackList())
        self._clock = self._own_clock
        self._compiled_train_step: Callable[[Iterator[Any]], Any] | None = None

    def checkpoint_items(self) -> dict[str, Any]:
        """The parts a checkpoint holds: the public stateful attributes (see
        `Module.checkpoint_items`) plus the runner's own ``progress`` (the step and epoch
        counters) and ``train_data`` (the position in the training data).

        Raises:
            ValueError: if a public attribute is named like one of the runner's own parts.
        """
        items = Module.checkpoint_items(self)
        own = {"progress": self._progress, "train_data": self._train_data}
        taken = sorted(set(own) & set(items))
        if taken:
            raise ValueError(f"Attribute(s) {taken} of {type(self).__name__} collide with the "
                             "runner's own checkpoint parts; rename them.")
        return {**items, **own}

    @property
    def train_dataset(self) -> Any:
        """The training data. Setting it starts a fresh iterator and position over the new data."""
        return self._train_data.source

    @train_dataset.setter
    def train_dataset(self, dataset: Any) -> None:
        self._train_data = self._data_iterator(dataset)

    def _data_iterator(self, dataset: Any) -> DataIterator | NestedIterators:
        options = self._train_options
        if not is_nested(dataset):
            return DataIterator(dataset, prefetch_to=options.prefetch_to_device)
        if options.stop_at_end_of_data:
            raise ValueError("StandardTrainerOptions(stop_at_end_of_data=True) needs one "
                             "training dataset; with a mapping of datasets each repeats on its "
                             "own: train to a number of steps, or set steps_per_epoch.")
        return NestedIterators(dataset, prefetch_to=options.prefetch_to_device)

    @property
    def progress(self) -> Progress:
        """The step and epoch counters (saved in checkpoints)."""
        return self._progress

    @property
    def train_iterator(self) -> DataIterator | NestedIterators:
        """The iterator over `train_dataset`, with its position (saved in checkpoints as
        ``train_data``)."""
        return self._train_data

    @property
    def global_step(self) -> int:
        """Completed training steps (0 before the first)."""
        return self._progress.global_step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self._clock.set_global_step(value)

    @property
    def epoch(self) -> int:
        """The epoch running, from 1; between epochs, the last one (0 before the first): the
        number callbacks see as ``state.epoch`` (see `cadence.core.progress`)."""
        return self._progress.epoch

    @property
    def epochs_completed(self) -> int:
        """Epochs that ran to their end (passes over the training data, or `steps_per_epoch`
        steps)."""
        return self._progress.epochs_completed

    @property
    def steps_per_epoch(self) -> int | None:
        """None: an epoch is a pass over the training data; N: an epoch is N steps (the data
        repeats as needed), and a Controller ends loops at epoch ends."""
        return self._steps_per_epoch

    @steps_per_epoch.setter
    def steps_per_epoch(self, value: int | None) -> None:
        self._steps_per_epoch = value
        for clock in {self._own_clock, self._clock}:  # the clocks it built
            clock.steps_per_epoch = value

    @property
    def examples_per_step(self) -> int | None:
        """The batch size of the training data when it says (used for examples/sec)."""
        return self._train_data.batch_size

    @property
    def data_wait_s(self) -> float:
        """Seconds the step has waited for training batches so far (the iterator's clock)."""
        return self._train_data.wait_s

    def max_steps_to_epoch_end(self) -> int | None:
        """At most how many steps until the running epoch ends: the steps left of
        `steps_per_epoch`, or, for an epoch that is a pass over sized data, the batches left in
        it. A Controller training to a number of epochs ends its loops there."""
        return self._clock.max_steps_to_epoch_end(self._train_data.batches_left)

    @property
    def clock(self) -> RunClock:
        """The clock this trainer counts on: its own, or the one it built for a Controller."""
        return self._clock

    def bind(self, state: RunState, callbacks: CallbackList) -> RunClock:
        """Called by the Controller that drives this trainer: from now on it counts on a clock
        it builds around `state` -- the Controller's run state, which reports into this
        trainer's `progress` and takes stop requests -- firing the step and epoch hooks of
        `callbacks`. Returns that clock, through which the Controller asks about epochs and
        stops.

        Raises:
            ValueError: for a `state` that does not read this trainer's `progress`.
        """
        if state.progress is not self._progress:
            raise ValueError("bind() takes a run state of this trainer's progress: "
                             "RunState(progress=trainer.progress, ...).")
        self._clock = self._new_clock(state, callbacks)
        return self._clock

    def _new_clock(self, state: RunState, callbacks: CallbackList) -> RunClock:
        return RunClock(state=state, callbacks=callbacks, steps_per_epoch=self._steps_per_epoch,
                        stop_at_end_of_data=self._train_options.stop_at_end_of_data,
                        agreement=self._agreement())

    def _agreement(self) -> StopAgreement | None:
        """The stop agreement of a new clock: one under torchrun, none in one process."""
        return StopAgreement(self._train_options.stop_check_steps) if is_distributed() else None

    def loop_rates(self, steps_per_second: float) -> Mapping[str, float]:
        """Rates of the loop that just ended beside its steps per second, for the Controller's
        logs (the Task `Trainer`'s: tokens per second, TFLOPS, MFU); none by default."""
        return {}

    def train_loop_begin(self) -> None:
        """Runs at the start of every `train` call, before the first step (and before the
        iterator exists on the first call): reset metrics that cover one loop here."""

    @abc.abstractmethod
    def train_step(self, iterator: Iterator[Any]) -> None:
        """Runs one step: take what it needs from `iterator` (``next(iterator)``), update.

        Take the inputs before updating anything: when the data runs out, ``next`` raises
        ``StopIteration``, and the step is run again on the next pass. Avoid host-device syncs
        (``.item()``, ``float(tensor)``); accumulate metrics on the device instead. Raise
        `cadence.StopTraining` to end training cleanly (the step does not count).
        """

    def train_loop_end(self) -> Output | None:
        """Runs at the end of every `train` call; its return value is `train`'s: Orbit's
        ``Output`` -- None, a mapping of logs, a tensor, an array or a number (anything else is a
        `cadence.core.errors.HookTypeError`). A Controller writes a mapping as summaries. A
        torchmetrics metric in it is replaced by its ``compute()``: logs may hold the metrics
        themselves."""
        return None

    train_runs_the_loop: ClassVar[bool] = True
    """Whether ``train`` is the runner protocol's (Orbit's): a Controller then calls a
    subclass's own ``train``. A front-end that gives ``train`` another meaning (tensorpack's
    entry point) sets it False, and a Controller runs its loops with `train_steps`."""

    def train(self, num_steps: int) -> Output | None:
        """Runs `num_steps` steps of training; see the module docstring for the order.

        The runner protocol's method: override it to wrap the loop (call ``super().train``) or
        to replace it, and a Controller calls the override (`inner_loop`). The loop itself is
        `train_steps`.

        Raises:
            ValueError: if `num_steps` is negative, or the data yields nothing in a pass.
        """
        return self.train_steps(num_steps)

    def inner_loop(self, num_steps: int) -> Output | None:
        """One inner loop as a Controller runs it: a subclass's own ``train`` where it
        overrides it, else `train_steps` (see ``train_runs_the_loop``)."""
        if self.train_runs_the_loop and type(self).train is not StandardTrainer.train:
            return self.train(num_steps)
        return self.train_steps(num_steps)

    def train_steps(self, num_steps: int) -> Output | None:
        """One inner loop of `num_steps` steps: what `train` does (see the module docstring).

        Raises:
            ValueError: if `num_steps` is negative, or the data yields nothing in a pass.
            HookTypeError: if `train_loop_end` returned what is not an Orbit output (None, a
                mapping of logs, a tensor, an array, a number).
        """
        num_steps = _check_num_steps(num_steps, allow_all=False)
        clock = self._clock
        driven = clock is not self._own_clock  # a Controller: it ends pending epochs
        if not driven:  # each call is a fresh start
            clock.clear_stop()
        if clock.agreement is None and is_distributed():  # the process group came later
            clock.agreement = self._agreement()
        self.train_loop_begin()
        with collective_errors("training") if is_distributed() else contextlib.nullcontext():
            self.create_train_loop_fn()(self._train_data, num_steps)
        output = self.train_loop_end()
        # A torchmetrics metric in the logs is computed here, once per loop (its compute()
        # gathers every rank's states); the runner resets it, as its own, in train_loop_begin.
        if holds_torchmetric(output):
            output = compute_in_logs(output)
        check_output(self, "train_loop_end()", output)  # once per loop, not per step
        if not driven:  # else the Controller does, once the loop's logs are on the host
            clock.end_pending_epoch()
        return output

    def create_train_loop_fn(self) -> Callable[[Any, int], None]:
        """The inner loop that `train` runs: ``loop_fn(iterator, num_steps)`` calls the (compiled,
        with ``compile_step``) `train_step` `num_steps` times, counting steps and epochs and
        firing step and epoch hooks."""
        step_fn = self._train_step_fn()

        def loop_fn(iterator: Any, num_steps: int) -> None:
            self._run_steps(step_fn, iterator, num_steps)

        return loop_fn

    def _run_steps(self, step_fn: Callable[[Any], Any], data: DataIterator | NestedIterators,
                   num_steps: int) -> None:
        clock = self._clock
        runs = clock.begin_loop(num_steps)
        empty_pass = False
        try:
            while runs and clock.begin_step():
                try:
                    step_fn(data)
                except StopIteration:  # the data ran out before the step took a batch
                    if empty_pass:
                        raise ValueError(
                            f"The training data ({type(data.source).__name__}) yields no batches "
                            "when iterated again: it is empty (a batch size larger than the "
                            "dataset with drop_last=True makes no batch), or it is a generator "
                            "or iterator, which can be iterated only once. Pass data with at "
                            "least one batch: a DataLoader, a list, or another re-iterable, or "
                            "set StandardTrainerOptions(stop_at_end_of_data=True)."
                        ) from None
                    empty_pass = data.at_pass_start
                    data.end_pass()
                    runs = clock.data_ran_out()  # the end of the data may end training
                    continue
                except StepDiscarded:  # no replica group committed it: it does not count
                    clock.abort_step()
                    continue
                empty_pass = False
                runs = clock.end_step(data.end_pass_at_last_batch())
        except StopTraining as stop:
            clock.abort_step()
            clock.state.request_stop(str(stop) or "StopTraining")
        except BaseException:
            clock.abort_step()
            raise
        clock.end_loop()

    def _train_step_fn(self) -> Callable[[Iterator[Any]], Any]:
        options = self._train_options
        if not (options.compile_step or options.cuda_graphs):
            return self.train_step
        if self._compiled_train_step is None:
            self._compiled_train_step = feed_from_outside(compile_step(
                self.train_step, options.compile_mode, options.cuda_graphs))
        return self._compiled_train_step


class StandardEvaluator(AbstractEvaluator, metaclass=abc.ABCMeta):
    """Implements `evaluate(num_steps)` with `eval_begin`, `eval_step`, `eval_reduce`,
    `eval_end`.

    Args:
        eval_dataset: what the iterator passed to `eval_step` iterates. A mapping of datasets
            gives the step a mapping of iterators (see `cadence.data.nested`); an evaluation
            until the data is exhausted ends when a step's ``next`` finds one exhausted.
        options: a `StandardEvaluatorOptions`.
        name: the module name.
    """

    _TRACKING_IGNORED = frozenset(
        {"_eval_dataset", "_eval_iterator", "_eval_options", "_compiled_eval_step"}
    )

    def __init__(
        self,
        eval_dataset: Any,
        options: StandardEvaluatorOptions | None = None,
        name: str | None = None,
    ) -> None:
        Module.__init__(self, name=name)  # not super(): a class may also be a StandardTrainer
        self._eval_options = _check_options(options, StandardEvaluatorOptions)
        self._eval_dataset = eval_dataset
        self._eval_iterator: Any = None  # an iterator, or a mapping of them
        self._compiled_eval_step: Callable[[Iterator[Any]], Any] | None = None

    @property
    def eval_dataset(self) -> Any:
        """The evaluation data. Setting it drops the current iterator."""
        return self._eval_dataset

    @eval_dataset.setter
    def eval_dataset(self, dataset: Any) -> None:
        self._eval_dataset = dataset
        self._eval_iterator = None

    def eval_begin(self) -> Any:
        """Runs before each evaluation, before the iterator exists: reset metrics, and switch
        models to eval mode. What it returns is the first `state` given to `eval_reduce`."""
        return None

    @abc.abstractmethod
    def eval_step(self, iterator: Iterator[Any]) -> Any:
        """Runs one evaluation step; its return value goes to `eval_reduce`."""

    def eval_reduce(self, state: Any = None, step_outputs: Any = None) -> Any:
        """Folds one step's outputs into the state; runs after every step, also when the state
        is None. Its return value is the next state; the last one goes to `eval_end`."""
        return state

    def eval_end(self, *args: Any) -> Output | None:
        """Runs after the last step with the final state (no argument if it is None); its
        return value is `evaluate`'s: Orbit's ``Output`` -- None, a mapping of logs, a tensor,
        an array or a number (anything else is a `cadence.core.errors.HookTypeError`) -- with a
        torchmetrics metric in it replaced by its ``compute()``."""
        return None

    def evaluate(self, num_steps: int) -> Output | None:
        """Runs `num_steps` evaluation steps, or until the data is exhausted if -1.

        Raises:
            ValueError: if `num_steps` is neither non-negative nor -1.
            HookTypeError: if `eval_end` returned what is not an Orbit output (None, a mapping
                of logs, a tensor, an array, a number).
        """
        num_steps = _check_num_steps(num_steps, allow_all=True)
        state = self.eval_begin()
        if self._eval_iterator is None or self._eval_options.recreate_iterator_for_each_eval:
            self._eval_iterator = iterate_nested(self._eval_dataset)
        loop_fn = self.create_eval_loop_fn()
        with torch.no_grad() if self._eval_options.no_grad else contextlib.nullcontext():
            state = loop_fn(self._eval_iterator, num_steps, state=state,
                            reduce_fn=self.eval_reduce)
        output = self.eval_end(state) if state is not None else self.eval_end()
        # A torchmetrics metric in the logs is computed here, once per evaluation.
        if holds_torchmetric(output):
            output = compute_in_logs(output)
        check_output(self, "eval_end()", output)
        return output

    def create_eval_loop_fn(self) -> Callable[..., Any]:
        """The loop that `evaluate` runs: ``loop_fn(iterator, num_steps, state=None,
        reduce_fn=None)`` calls the (compiled, with ``compile_step``) `eval_step` `num_steps`
        times (-1: until the iterator is exhausted), folding each step's outputs into the state
        with ``reduce_fn``, and returns the state.

        The loop calls ``reduce_fn`` whether or not `eval_begin` returned a state, so host-side
        aggregation that starts from None still sees every step. (Orbit's ``has_state``
        argument chose between two graphs; one Python loop serves both, so there is none.)
        """
        step_fn = self._eval_step_fn()

        def loop_fn(iterator: Iterator[Any], num_steps: int, state: Any = None,
                    reduce_fn: Callable[[Any, Any], Any] | None = None) -> Any:
            done = 0
            while num_steps == -1 or done < num_steps:
                try:
                    outputs = step_fn(iterator)
                except StopIteration:
                    if num_steps != -1:
                        logger.info("Evaluation data ran out after %d of %d steps.", done,
                                    num_steps)
                    break
                if reduce_fn is not None:
                    state = reduce_fn(state, outputs)
                done += 1
            if done == 0 and num_steps != 0:  # said, not refused: an iterator kept from the
                # last evaluation (recreate_iterator_for_each_eval=False) may be at its end
                logger.warning("The evaluation ran no step: the evaluation data (%s) yielded no "
                               "batch, so its logs cover nothing.",
                               type(self._eval_dataset).__name__)
            self.last_eval_steps = done
            return state

        return loop_fn

    def _eval_step_fn(self) -> Callable[[Iterator[Any]], Any]:
        options = self._eval_options
        if not (options.compile_step or options.cuda_graphs):
            return self.eval_step
        if self._compiled_eval_step is None:
            self._compiled_eval_step = feed_from_outside(compile_step(
                self.eval_step, options.compile_mode, options.cuda_graphs))
        return self._compiled_eval_step
