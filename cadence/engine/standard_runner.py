"""`StandardTrainer` and `StandardEvaluator`: the runners as begin / step / end templates.

`StandardTrainer.train(num_steps)` runs::

    train_loop_begin()
    repeat num_steps times:                 # ends early if a stop is requested
        train_step(iterator)                # the iterator persists across calls
        global_step += 1
    return train_loop_end()

When a finite dataset (a DataLoader, a list) is exhausted, the trainer counts an epoch and starts
the next pass, or -- with ``StandardTrainerOptions(stop_at_end_of_data=True)`` -- ends training
cleanly. `StandardEvaluator.evaluate(num_steps)` runs::

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cadence.core.callbacks import CallbackList, RunState
from cadence.data.iterator import DataIterator
from cadence.engine.compile import check_compile_options, compile_step
from cadence.engine.module import Module
from cadence.engine.runner import AbstractEvaluator, AbstractTrainer, Output

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

    Raises:
        ValueError: for an unknown `compile_mode`, or `cuda_graphs` without CUDA.
    """

    compile_step: bool = False
    compile_mode: str | None = None
    cuda_graphs: bool = False
    stop_at_end_of_data: bool = False
    prefetch_to_device: torch.device | str | None = None

    def __post_init__(self) -> None:
        check_compile_options(self.compile_mode, self.cuda_graphs)


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
    if isinstance(num_steps, torch.Tensor):
        num_steps = int(num_steps)
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or (
        num_steps < 0 and not (allow_all and num_steps == -1)
    ):
        allowed = "a non-negative int" + (", or -1 for all the data" if allow_all else "")
        raise ValueError(f"`num_steps` (got {num_steps!r}) must be {allowed}.")
    return num_steps


class _Progress:
    """The trainer's counters, as one stateful object so checkpoints carry them."""

    def __init__(self) -> None:
        self.global_step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"global_step": self.global_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])


class StandardTrainer(AbstractTrainer, metaclass=abc.ABCMeta):
    """Implements `train(num_steps)` with `train_loop_begin`, `train_step`, `train_loop_end`.

    Args:
        train_dataset: what the iterator passed to `train_step` iterates: a DataLoader, a list
            of batches, or any iterable. Its position is checkpointed (see `cadence.data`).
        options: a `StandardTrainerOptions`.
        name: the module name.

    Attributes:
        global_step: completed training steps, saved in checkpoints.
    """

    _TRACKING_IGNORED = frozenset(
        {"_callbacks", "_run_state", "_own_state", "_compiled_train_step", "_train_options",
         "_epoch_begun"}
    )

    def __init__(
        self,
        train_dataset: Any,
        options: StandardTrainerOptions | None = None,
        name: str | None = None,
    ) -> None:
        Module.__init__(self, name=name)  # not super(): a class may also be a StandardEvaluator
        self._train_options = _check_options(options, StandardTrainerOptions)
        self._train_data = DataIterator(train_dataset,
                                        prefetch_to=self._train_options.prefetch_to_device)
        self._progress = _Progress()
        self._callbacks = CallbackList()
        self._own_state = RunState(trainer=self)
        self._run_state = self._own_state
        self._compiled_train_step: Callable[[Iterator[Any]], Any] | None = None
        self._epoch_begun = False

    def checkpoint_items(self) -> dict[str, Any]:
        """The parts a checkpoint holds: the public stateful attributes (see
        `Module.checkpoint_items`) plus the runner's own ``progress`` (the step counter) and
        ``train_data`` (the position in the training data).

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
        self._train_data = DataIterator(dataset,
                                        prefetch_to=self._train_options.prefetch_to_device)
        self._epoch_begun = False

    @property
    def global_step(self) -> int:
        """Completed training steps (0 before the first)."""
        return self._progress.global_step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self._progress.global_step = int(value)

    @property
    def epoch(self) -> int:
        """Completed passes over the training data."""
        return self._train_data.epoch

    @property
    def examples_per_step(self) -> int | None:
        """The batch size of the training data when it says (used for examples/sec)."""
        return self._train_data.batch_size

    def bind(self, callbacks: CallbackList, state: RunState) -> None:
        """Called by the Controller: the callbacks whose step and epoch hooks this loop fires,
        and the run state it reports into and takes stop requests from."""
        self._callbacks = callbacks
        self._run_state = state

    def train_loop_begin(self) -> None:
        """Runs at the start of every `train` call, before the first step (and before the
        iterator exists on the first call): reset metrics that cover one loop here."""

    @abc.abstractmethod
    def train_step(self, iterator: Iterator[Any]) -> None:
        """Runs one step: take what it needs from `iterator` (``next(iterator)``), update.

        Take the inputs before updating anything: when the data runs out, ``next`` raises
        ``StopIteration``, and the step is run again on the next pass. Avoid host-device syncs
        (``.item()``, ``float(tensor)``); accumulate metrics on the device instead.
        """

    def train_loop_end(self) -> Output | None:
        """Runs at the end of every `train` call; its return value is `train`'s."""
        return None

    def train(self, num_steps: int) -> Output | None:
        """Runs `num_steps` steps of training; see the module docstring for the order.

        Raises:
            ValueError: if `num_steps` is negative, or the data yields nothing in a pass.
        """
        num_steps = _check_num_steps(num_steps, allow_all=False)
        state = self._run_state
        if state is self._own_state:  # not driven by a Controller: each call is a fresh start
            state.stop_requested, state.stop_reason = False, None
        self.train_loop_begin()
        self.create_train_loop_fn()(self._train_data, num_steps)
        state.global_step = self._progress.global_step
        return self.train_loop_end()

    def create_train_loop_fn(self) -> Callable[[DataIterator, int], None]:
        """The inner loop that `train` runs: ``loop_fn(iterator, num_steps)`` calls the (compiled,
        with ``compile_step``) `train_step` `num_steps` times, counting steps and epochs and
        firing step hooks."""
        step_fn = self._train_step_fn()

        def loop_fn(iterator: DataIterator, num_steps: int) -> None:
            self._run_steps(step_fn, iterator, num_steps)

        return loop_fn

    def _run_steps(self, step_fn: Callable[[Iterator[Any]], Any], data: DataIterator,
                   num_steps: int) -> None:
        state = self._run_state
        if not self._epoch_begun and data.at_pass_start:
            self._fire_epoch("on_epoch_begin")
        self._epoch_begun = True
        progress = self._progress
        pass_length = data.pass_length
        hooks = self._callbacks if self._callbacks.has_step_hooks else None
        done = 0
        empty_pass = False
        while done < num_steps and not state.stop_requested:
            if hooks is not None:
                state.global_step = progress.global_step
                hooks.fire("on_step_begin", state)
            try:
                step_fn(data)
            except StopIteration:
                if empty_pass:
                    raise ValueError(
                        f"The training data ({type(data.source).__name__}) yields no batches when "
                        "iterated again. A generator or iterator can be iterated only once: pass "
                        "a DataLoader, a list, or another re-iterable, or set "
                        "StandardTrainerOptions(stop_at_end_of_data=True)."
                    ) from None
                empty_pass = data.at_pass_start
                self._end_pass()
                continue
            empty_pass = False
            progress.global_step += 1
            done += 1
            if hooks is not None:
                state.global_step = progress.global_step
                hooks.fire("on_step_end", state)
            if data.batches == pass_length:  # the last batch of a sized source: epoch ends now
                self._end_pass()

    def _end_pass(self) -> None:
        self._train_data.end_pass()
        self._fire_epoch("on_epoch_end")
        if self._train_options.stop_at_end_of_data:
            self._epoch_begun = False
            self._run_state.request_stop("end of training data")
        else:
            self._fire_epoch("on_epoch_begin")

    def _fire_epoch(self, hook: str) -> None:
        state = self._run_state
        state.epoch = self._train_data.epoch
        state.global_step = self._progress.global_step
        self._callbacks.fire(hook, state)

    def _train_step_fn(self) -> Callable[[Iterator[Any]], Any]:
        options = self._train_options
        if not (options.compile_step or options.cuda_graphs):
            return self.train_step
        if self._compiled_train_step is None:
            self._compiled_train_step = compile_step(self.train_step, options.compile_mode,
                                                     options.cuda_graphs)
        return self._compiled_train_step


class StandardEvaluator(AbstractEvaluator, metaclass=abc.ABCMeta):
    """Implements `evaluate(num_steps)` with `eval_begin`, `eval_step`, `eval_reduce`,
    `eval_end`.

    Args:
        eval_dataset: what the iterator passed to `eval_step` iterates.
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
        self._eval_iterator: Iterator[Any] | None = None
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
        return value is `evaluate`'s."""
        return None

    def evaluate(self, num_steps: int) -> Output | None:
        """Runs `num_steps` evaluation steps, or until the data is exhausted if -1.

        Raises:
            ValueError: if `num_steps` is neither non-negative nor -1.
        """
        num_steps = _check_num_steps(num_steps, allow_all=True)
        state = self.eval_begin()
        if self._eval_iterator is None or self._eval_options.recreate_iterator_for_each_eval:
            self._eval_iterator = iter(self._eval_dataset)
        loop_fn = self.create_eval_loop_fn(has_state=state is not None)
        with torch.no_grad() if self._eval_options.no_grad else contextlib.nullcontext():
            state = loop_fn(self._eval_iterator, num_steps, state=state,
                            reduce_fn=self.eval_reduce)
        return self.eval_end(state) if state is not None else self.eval_end()

    def create_eval_loop_fn(self, has_state: bool) -> Callable[..., Any]:
        """The loop that `evaluate` runs: ``loop_fn(iterator, num_steps, state=None,
        reduce_fn=None)`` calls the (compiled, with ``compile_step``) `eval_step` `num_steps`
        times (-1: until the iterator is exhausted), folding each step's outputs into the state
        with ``reduce_fn``, and returns the state.

        `has_state` says whether `eval_begin` returned a state. The loop calls ``reduce_fn``
        either way, so host-side aggregation that starts from None still sees every step.
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
            return state

        return loop_fn

    def _eval_step_fn(self) -> Callable[[Iterator[Any]], Any]:
        options = self._eval_options
        if not (options.compile_step or options.cuda_graphs):
            return self.eval_step
        if self._compiled_eval_step is None:
            self._compiled_eval_step = compile_step(self.eval_step, options.compile_mode,
                                                    options.cuda_graphs)
        return self._compiled_eval_step
