"""One callback class for every front-end, and the list that dispatches to it.

Hook order during ``Controller.train_and_evaluate`` (the other entry points are subsets)::

    on_train_begin
      repeat:
        on_loop_begin
          [on_epoch_begin]              when a pass over the data starts
          on_step_begin, on_step_end    around every step (only if some callback overrides them)
          [on_epoch_end]                when a pass over the data ends
        on_loop_end(logs)
        [on_eval_begin, on_eval_end(logs)]  at evaluation steps
        [on_checkpoint_saved(path)]         at checkpoint steps (after an evaluation there)
    on_train_end

A callback overrides only the hooks it needs. The dispatcher looks up, once, which callbacks
override which hook, so a hook nobody overrides costs nothing -- in particular the step hooks:
when no callback overrides them, runners use a loop with no per-step callback code at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from cadence.core.errors import StopTraining
from cadence.core.logs import flatten, is_scalar
from cadence.core.progress import Progress
from cadence.core.protocols import RunDriver
from cadence.core.trainer_view import TrainerView, view_of

logger = logging.getLogger(__name__)

HOOKS = (
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_loop_begin",
    "on_loop_end",
    "on_step_begin",
    "on_step_end",
    "on_eval_begin",
    "on_eval_end",
    "on_checkpoint_saved",
)


class RunState:
    """What a callback can see of a run, and its one way to act on it: `request_stop`.

    Attributes:
        progress: the run's step and epoch counters (`cadence.core.progress.Progress`), which
            only the run clock writes; `global_step` and `epoch` read through to them.
        target_step: the global step the current ``train`` call trains to, if known.
        target_epoch: the epoch the current ``train`` call trains to, when it trains to a
            number of epochs (its last epoch).
        trainer: the trainer being driven, if any, as a `TrainerView`: what callbacks read of
            it, declared (`cadence.core.trainer_view`). A trainer that is not one is shown
            through a `PlainTrainerView`, which passes its other attributes through.
        evaluator: the evaluator being driven, if any.
        controller: what drives the run -- the Controller, or a `TrainLoop` -- if anything:
            callbacks save (``save_checkpoint()``) and restore (``restore_checkpoint()``)
            through it.
        run_dir: the run's directory (a `cadence.core.run_dir.RunDirectory`) when the front-end
            has one: where built-in callbacks write by default.
        stop_requested: set by `request_stop`; runners end the loop at the next step boundary.
        stop_reason: why the stop was requested.
        stop_pauses: the stop is a pause (`request_stop`'s ``pause``): the run goes on later.
        epoch_paused: the loop that just ended was cut short by a pause in the middle of an
            epoch, which the run that continues it finishes (the clock sets it, the same on
            every rank): per-epoch records -- tensorpack's monitors -- wait for that run.
        error: in ``on_train_end``, the exception the run ends with -- None when it completed,
            `cadence.Preempted` when a signal stopped it: what a writer closed there reports
            as the run's outcome (MLflow's status, W&B's exit code).
        metrics: the latest value of every scalar the run produced so far (loop logs, evaluation
            logs as ``eval/<name>``, callbacks' results), on the host: what savers, early
            stopping and schedules read.
        extra: values callbacks share that have no attribute of their own.

    Args:
        global_step: with `epoch`, the counters of a fresh `Progress` when none is given (a
            state made by hand, in a test of a callback).
        epoch: see `global_step`.
    """

    def __init__(self, *, progress: Progress | None = None, target_step: int | None = None,
                 target_epoch: int | None = None, trainer: Any = None, evaluator: Any = None,
                 controller: RunDriver | None = None, run_dir: Any = None,
                 global_step: int = 0, epoch: int = 0) -> None:
        self.progress = progress if progress is not None else Progress(
            global_step=global_step, epoch=epoch)
        self.target_step = target_step
        self.target_epoch = target_epoch
        self.trainer: TrainerView | None = view_of(trainer)
        self.evaluator = evaluator
        self.controller = controller
        self.run_dir = run_dir
        self.stop_requested = False
        self.stop_reason: str | None = None
        self.stop_pauses = False
        self.epoch_paused = False
        self.error: BaseException | None = None
        self.extra: dict[str, Any] = {}
        self.metrics: dict[str, float] = {}

    def __repr__(self) -> str:
        return (f"RunState(global_step={self.global_step}, epoch={self.epoch}, "
                f"stop_requested={self.stop_requested})")

    @property
    def global_step(self) -> int:
        """Completed training steps (0 before the first step); inside the body of a step that
        is running (`TrainLoop`'s), that step counts as completed: it is the step a checkpoint
        taken now holds."""
        return self.progress.steps_taken

    @property
    def epoch(self) -> int:
        """The number of the epoch running, from 1 (from its ``on_epoch_begin`` to its
        ``on_epoch_end``); between epochs, the last one's (0 before the first). The same in
        every front-end: see `cadence.core.progress`."""
        return self.progress.epoch

    def put_metrics(self, logs: Mapping[str, Any], prefix: str = "") -> None:
        """Records the scalars of (host, possibly nested) `logs` in `metrics`."""
        for name, value in flatten(logs).items():
            if is_scalar(value):
                self.metrics[prefix + name] = float(value)

    def request_stop(self, reason: str, *, pause: bool = False) -> None:
        """Asks the runner to stop training cleanly: a step that is running finishes, no other
        step starts (asked in ``on_step_begin`` or ``on_epoch_begin``, the step about to start
        does not run), and a checkpoint is saved.

        Args:
            reason: why, in a few words (logged, and kept in `stop_reason`).
            pause: the run stops to go on later -- a signal, a time limit: an epoch it cuts
                short is left for the run that continues it, which ends it, so that its end
                hooks run once, as in an uninterrupted run. Without it the stop ends training:
                the running epoch ends at the stop (its end hooks run) and counts as done.
        """
        self.stop_requested = True
        self.stop_reason = reason
        self.stop_pauses = self.stop_pauses or pause


class Callback:
    """Base class of every callback. Override the hooks you need; each default does nothing.

    Callbacks with state that must survive a restart (best value so far, patience counters)
    return it from `state_dict` as plain values and tensors, and take it back in `load_state_dict`;
    the checkpoint manager saves it with the model.

    Periodic work goes in `trigger` (tensorpack's ``_trigger``); a scheduling wrapper such as
    `cadence.callbacks.PeriodicTrigger` decides when it runs. Unwrapped, a callback whose class
    overrides `trigger` but not `on_epoch_end` (`triggers_only`) is triggered at each epoch's
    end, as tensorpack's ``Callback._trigger_epoch`` does by default: in every `CallbackList`,
    so under a Controller, a `TrainLoop` and the tensorpack trainers alike.

    Callbacks that read a metric another callback produces declare it: `requires` names what
    they read, `provides` what they write into ``state.metrics``; a `CallbackList` refuses a
    consumer placed before its producer.

    Attributes:
        requires: metric names this callback reads from ``state.metrics``.
        provides: metric names this callback writes into ``state.metrics``.
        active_hooks: when set (by wrappers), the hooks to dispatch to this instance instead of
            the ones its class overrides.
    """

    requires: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    active_hooks: frozenset[str] | None = None

    def trigger(self, state: RunState) -> None:
        """Does the callback's periodic work: at each epoch's end when the class overrides no
        `on_epoch_end` (`triggers_only`), else where a scheduling wrapper or `on_epoch_end`
        calls it."""

    def on_train_begin(self, state: RunState) -> None:
        """Runs when `Controller.train` (or `train_and_evaluate`) starts."""

    def on_train_end(self, state: RunState) -> None:
        """Runs when training ends: target reached, stop requested, or data exhausted."""

    def on_epoch_begin(self, state: RunState) -> None:
        """Runs when an epoch opens, before its first step: ``state.epoch`` is its number,
        from 1. An epoch is a pass over the training data, or ``steps_per_epoch`` steps; one
        that a stop ended early opens again with the same number (also in a resumed process).
        The epoch rules are `cadence.core.clock`'s, the counters' meaning
        `cadence.core.progress`'s."""

    def on_epoch_end(self, state: RunState) -> None:
        """Runs when an epoch closes: ``state.epoch`` is its number still, the one its begin
        saw. It closes when it finished -- its pass ended, or it made ``steps_per_epoch`` steps
        -- in the middle of a loop, or after the loop whose last step finished it, once that
        loop's logs are on the host (``state.metrics``); and when a stop ends it early as the
        epoch rules say (``state.progress.epoch_finished`` tells which)."""

    def on_loop_begin(self, state: RunState) -> None:
        """Runs before each inner loop of ``trainer.train(num_steps)``."""

    def on_loop_end(self, state: RunState, logs: dict[str, Any]) -> None:
        """Runs after each inner loop with its logs, already on the host."""

    def on_step_begin(self, state: RunState) -> None:
        """Runs before every step. Overriding it adds Python work to every step."""

    def on_step_end(self, state: RunState) -> None:
        """Runs after every step. Overriding it adds Python work to every step."""

    def on_eval_begin(self, state: RunState) -> None:
        """Runs before an evaluation."""

    def on_eval_end(self, state: RunState, logs: dict[str, Any]) -> None:
        """Runs after an evaluation with its logs on the host (``"checkpoint"`` and ``"step"``
        in ``state.extra["last_eval"]`` say which weights were evaluated)."""

    def on_checkpoint_saved(self, state: RunState, path: str) -> None:
        """Runs after a checkpoint was committed at `path`."""

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints; plain values and tensors only."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what `state_dict` returned."""


def triggers_only(callback: Callback) -> bool:
    """Whether `callback` does its periodic work in `trigger` alone: its class overrides
    `trigger` and not `on_epoch_end`, and no wrapper set its `active_hooks`. Such a callback's
    ``on_epoch_end`` is its `trigger` (tensorpack's ``Callback._trigger_epoch`` calls
    ``trigger()`` by default); a scheduling wrapper around it decides instead."""
    cls = type(callback)
    return (callback.active_hooks is None and cls.trigger is not Callback.trigger
            and cls.on_epoch_end is Callback.on_epoch_end)


def _overrides(callback: Callback, hook: str) -> bool:
    if callback.active_hooks is not None:
        return hook in callback.active_hooks
    return getattr(type(callback), hook) is not getattr(Callback, hook) or (
        hook == "on_epoch_end" and triggers_only(callback))


def overridden_hooks(callback: Callback) -> frozenset[str]:
    """The hooks a callback handles (what `CallbackList` dispatches to it); ``on_epoch_end``
    for one that `triggers_only`."""
    return frozenset(hook for hook in HOOKS if _overrides(callback, hook))


def _handler(callback: Callback, hook: str) -> Callable[..., None]:
    """What `hook` calls on `callback`: its `trigger` for the epoch end of one that
    `triggers_only`, else its method of that name."""
    if hook == "on_epoch_end" and triggers_only(callback):
        return callback.trigger
    return getattr(callback, hook)


class CallbackList:
    """Dispatches hooks to the callbacks that override them, in the order given (and
    ``on_epoch_end`` to the `trigger` of a callback that `triggers_only`)."""

    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self._callbacks: list[Callback] = []
        self._by_hook: dict[str, list[Callback]] = {hook: [] for hook in HOOKS}
        self._handlers: dict[str, list[Callable[..., None]]] = {hook: [] for hook in HOOKS}
        for callback in callbacks:
            self.append(callback)

    def append(self, callback: Callback) -> None:
        """Adds a callback at the end.

        Raises:
            TypeError: if `callback` is not a `Callback`.
        """
        if not isinstance(callback, Callback):
            raise TypeError(
                f"callbacks must be cadence.Callback instances (got {type(callback).__name__}). "
                "Subclass cadence.Callback and override the hooks you need."
            )
        for name in callback.provides:
            for earlier in self._callbacks:
                if name in earlier.requires:
                    raise ValueError(
                        f"{type(earlier).__name__} reads {name!r}, which "
                        f"{type(callback).__name__} produces, but comes before it: put "
                        f"{type(callback).__name__} earlier in the callback list."
                    )
        self._callbacks.append(callback)
        for hook in HOOKS:
            if _overrides(callback, hook):
                self._by_hook[hook].append(callback)
                self._handlers[hook].append(_handler(callback, hook))

    def __iter__(self) -> Iterator[Callback]:
        return iter(self._callbacks)

    def __len__(self) -> int:
        return len(self._callbacks)

    @property
    def has_step_hooks(self) -> bool:
        """Whether any callback overrides `on_step_begin` or `on_step_end`."""
        return bool(self._by_hook["on_step_begin"] or self._by_hook["on_step_end"])

    def hooked(self, hook: str) -> Sequence[Callback]:
        """The callbacks that override `hook`, in order."""
        return self._by_hook[hook]

    def fire(self, hook: str, state: RunState, *args: Any) -> None:
        """Calls `hook` on each callback that overrides it. A callback that raises
        `cadence.StopTraining` requests a stop (the run then ends cleanly) and the others still
        run."""
        for handler in self._handlers[hook]:
            try:
                handler(state, *args)
            except StopTraining as stop:
                owner = type(getattr(handler, "__self__", handler)).__name__
                state.request_stop(str(stop) or f"StopTraining from {owner}")

    def fire_teardown(self, hook: str, state: RunState, *args: Any) -> None:
        """Like `fire`, but every callback runs even if an earlier one fails; a failure is
        logged with its traceback (teardown must not skip the other callbacks' teardown)."""
        for callback, handler in zip(self._by_hook[hook], self._handlers[hook]):
            try:
                handler(state, *args)
            except Exception:
                logger.exception("%s.%s failed.", type(callback).__name__, hook)

    def _keys(self) -> list[str]:
        seen: dict[str, int] = {}
        keys = []
        for callback in self._callbacks:
            name = type(callback).__name__
            seen[name] = seen.get(name, -1) + 1
            keys.append(f"{name}:{seen[name]}")
        return keys

    def state_dict(self) -> dict[str, Any]:
        """Each callback's state, keyed by class name and index among callbacks of that class."""
        return {key: cb.state_dict() for key, cb in zip(self._keys(), self._callbacks)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Gives each callback its saved state; logs callbacks that have none saved, and saved
        states that no callback takes (the callback list changed between runs)."""
        keys = self._keys()
        for key, callback in zip(keys, self._callbacks):
            if key in state_dict:
                callback.load_state_dict(state_dict[key])
            elif callback.state_dict():
                logger.warning("No saved state for callback %s: it starts fresh.", key)
        for key in state_dict.keys() - set(keys):
            if state_dict[key]:
                logger.warning("Saved state of callback %s is ignored: no such callback now.", key)
