"""Scheduling wrappers: when a callback's `trigger` runs (tensorpack's ``callbacks/trigger.py``).

Periodic built-in callbacks do their work in ``trigger`` and run it once per epoch by default.
Wrap one to change that, as a value::

    PeriodicTrigger(ModelSaver(), every_k_steps=500)          # more often than per epoch
    PeriodicTrigger(InferenceRunner(...), every_k_seconds=600, before_train=True, at_end=True)
    PeriodicCallback(ScalarPrinter(), every_k_epochs=5)       # less often: gate every hook
    EnableCallbackIf(ProgressBar(), lambda state: state.epoch > 1)

Schedules are aligned to absolute counters (``global_step % k``, ``epoch % k``), so a resumed
run triggers at the same steps as an uninterrupted one. A wrapper handles only the hooks its
schedule needs plus those the wrapped callback overrides: wrapping a callback in an epoch
schedule adds nothing per step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from cadence.core.callbacks import (  # triggers_only is importable from here too
    Callback,
    RunState,
    overridden_hooks,
    triggers_only,
)
from cadence.core.intervals import check_int
from cadence.core.logs import is_scalar


def _check_periods(owner: str, every_k_steps: Any, every_k_epochs: Any) -> tuple[Any, Any]:
    """Both periods, checked: None or a positive int (``every_k_epochs=1.5`` would fire at
    epochs 3, 6, ..., and ``-1`` at every one)."""
    fix = "Pass a whole number of {}, e.g. {}=2, or None."
    return (check_int(owner, "every_k_steps", every_k_steps,
                      fix.format("steps", "every_k_steps"), none_ok=True),
            check_int(owner, "every_k_epochs", every_k_epochs,
                      fix.format("epochs", "every_k_epochs"), none_ok=True))


class _Wrapper(Callback):
    """Forwards every hook the wrapped callback handles, and its state and declarations; a
    callback that only implements `trigger` gets it at the epoch's end (see `triggers_only`)."""

    def __init__(self, callback: Callback) -> None:
        if not isinstance(callback, Callback):
            raise TypeError(f"Expected a cadence.Callback to wrap, got {type(callback).__name__}.")
        self.callback = callback
        self._wrapped_hooks: frozenset[str] = frozenset()
        self._epoch_trigger = triggers_only(callback)
        self.requires = callback.requires
        self.provides = callback.provides

    def _forward(self, hook: str, state: RunState, *args: Any) -> None:
        if hook in self._wrapped_hooks:
            if hook == "on_epoch_end" and self._epoch_trigger:
                self.callback.trigger(state)
            else:
                getattr(self.callback, hook)(state, *args)

    def on_train_begin(self, state: RunState) -> None:
        self._forward("on_train_begin", state)

    def on_train_end(self, state: RunState) -> None:
        self._forward("on_train_end", state)

    def on_epoch_begin(self, state: RunState) -> None:
        self._forward("on_epoch_begin", state)

    def on_epoch_end(self, state: RunState) -> None:
        self._forward("on_epoch_end", state)

    def on_loop_begin(self, state: RunState) -> None:
        self._forward("on_loop_begin", state)

    def on_loop_end(self, state: RunState, logs: dict[str, Any]) -> None:
        self._forward("on_loop_end", state, logs)

    def on_step_begin(self, state: RunState) -> None:
        self._forward("on_step_begin", state)

    def on_step_end(self, state: RunState) -> None:
        self._forward("on_step_end", state)

    def on_eval_begin(self, state: RunState) -> None:
        self._forward("on_eval_begin", state)

    def on_eval_end(self, state: RunState, logs: dict[str, Any]) -> None:
        self._forward("on_eval_end", state, logs)

    def on_checkpoint_saved(self, state: RunState, path: str) -> None:
        self._forward("on_checkpoint_saved", state, path)

    def trigger(self, state: RunState) -> None:
        self.callback.trigger(state)

    def state_dict(self) -> dict[str, Any]:
        return self.callback.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.callback.load_state_dict(state_dict)


class PeriodicTrigger(_Wrapper):
    """Runs ``callback.trigger`` on a schedule instead of once per epoch.

    Args:
        callback: the callback whose `trigger` to run; its own epoch-end trigger is replaced,
            every other hook is forwarded.
        every_k_steps: when ``global_step % k == 0``.
        every_k_epochs: when ``epoch % k == 0`` (at the epoch's end).
        every_k_seconds: when at least this much time passed since the last trigger (checked
            after each step).
        before_train: also once before training starts.
        at_end: also once when training ends.
        before_step: step-based triggers run before the step instead of after it.

    Raises:
        ValueError: when no schedule is given, when `every_k_steps` or `every_k_epochs` is not
            a positive int, or `every_k_seconds` not a positive finite number.
    """

    def __init__(self, callback: Callback, every_k_steps: int | None = None,
                 every_k_epochs: int | None = None, every_k_seconds: float | None = None,
                 before_train: bool = False, at_end: bool = False,
                 before_step: bool = False) -> None:
        super().__init__(callback)
        every_k_steps, every_k_epochs = _check_periods("PeriodicTrigger", every_k_steps,
                                                       every_k_epochs)
        if every_k_seconds is not None and not (
                is_scalar(every_k_seconds) and 0 < every_k_seconds < math.inf):
            raise ValueError(f"PeriodicTrigger: `every_k_seconds` (got {every_k_seconds!r}) "
                             "must be a positive number of seconds or None. Pass e.g. "
                             "every_k_seconds=600.")
        if not (every_k_steps or every_k_epochs or every_k_seconds or before_train or at_end):
            raise ValueError("PeriodicTrigger needs a schedule: every_k_steps, every_k_epochs, "
                             "every_k_seconds, before_train or at_end.")
        self.every_k_steps = every_k_steps
        self.every_k_epochs = every_k_epochs
        self.every_k_seconds = every_k_seconds
        self.before_train = before_train
        self.at_end = at_end
        self.before_step = before_step
        self._last_time = 0.0
        self._last_step = -1
        self._wrapped_hooks = overridden_hooks(callback) - {"on_epoch_end"}
        needed = set(self._wrapped_hooks)
        if before_train or every_k_seconds:
            needed.add("on_train_begin")
        if at_end:
            needed.add("on_train_end")
        if every_k_epochs:
            needed.add("on_epoch_end")
        if every_k_steps or every_k_seconds:
            needed.add("on_step_begin" if before_step else "on_step_end")
        self.active_hooks = frozenset(needed)

    def _fire(self, state: RunState) -> None:
        self._last_time = time.monotonic()
        self._last_step = state.global_step
        self.callback.trigger(state)

    def on_train_begin(self, state: RunState) -> None:
        self._forward("on_train_begin", state)
        self._last_time = time.monotonic()
        if self.before_train:
            self._fire(state)

    def on_train_end(self, state: RunState) -> None:
        if self.at_end and self._last_step != state.global_step:
            self._fire(state)
        self._forward("on_train_end", state)

    def on_epoch_end(self, state: RunState) -> None:
        if self.every_k_epochs and state.epoch % self.every_k_epochs == 0:
            self._fire(state)

    def _check_step(self, state: RunState, step: int) -> None:
        if ((self.every_k_steps and step % self.every_k_steps == 0)
                or (self.every_k_seconds
                    and time.monotonic() - self._last_time >= self.every_k_seconds)):
            self._fire(state)

    def on_step_begin(self, state: RunState) -> None:
        self._forward("on_step_begin", state)
        if self.before_step:
            self._check_step(state, state.global_step)

    def on_step_end(self, state: RunState) -> None:
        self._forward("on_step_end", state)
        if not self.before_step:
            self._check_step(state, state.global_step)


class EnableCallbackIf(_Wrapper):
    """Forwards the epoch, step, loop and evaluation hooks of `callback` only while
    ``predicate(state)`` is true; training begin/end and checkpoint hooks always pass.

    The predicate decides once per step (and once per epoch, loop and evaluation): when
    `callback` handles a begin hook, the predicate is evaluated there and the matching end hook
    follows that decision, as tensorpack's ``before_run``/``after_run`` do -- so a callback never
    gets the begin of one step and the end of another. A callback with only the end hook is
    gated where that hook runs; one that implements only `trigger` is triggered at the epochs'
    ends that pass (tensorpack's ``trigger_epoch``).
    """

    _PAIRS = {"on_epoch_begin": "on_epoch_end", "on_step_begin": "on_step_end",
              "on_loop_begin": "on_loop_end", "on_eval_begin": "on_eval_end"}
    _GATED = frozenset(_PAIRS) | frozenset(_PAIRS.values())

    def __init__(self, callback: Callback, predicate: Callable[[RunState], bool]) -> None:
        super().__init__(callback)
        self.predicate = predicate
        self._wrapped_hooks = overridden_hooks(callback)  # with on_epoch_end if triggers_only
        self.active_hooks = self._wrapped_hooks
        self._decided = {begin: end for begin, end in self._PAIRS.items()
                         if begin in self._wrapped_hooks and end in self._wrapped_hooks}
        """The end hooks that follow their begin hook's decision."""
        self._enabled: dict[str, bool] = {}

    def _forward(self, hook: str, state: RunState, *args: Any) -> None:
        if hook in self._GATED:
            if hook in self._decided.values():
                enabled = self._enabled.pop(hook, False)  # the decision of its begin hook
            else:
                enabled = bool(self.predicate(state))
                end = self._decided.get(hook)
                if end is not None:
                    self._enabled[end] = enabled
            if not enabled:
                return
        super()._forward(hook, state, *args)


class PeriodicCallback(EnableCallbackIf):
    """Lets `callback` see its epoch, step and loop hooks only every k steps or every k epochs
    (and then also at the last epoch of training): a way to make a callback run *less* often.

    Each step hook asks on its own, as tensorpack's ``PeriodicCallback`` does: with
    ``every_k_steps=k``, ``on_step_begin`` runs before the steps that start at a multiple of k
    (``global_step % k == 0`` before the step, tensorpack's ``before_run``) and ``on_step_end``
    after steps k, 2k, ... (``global_step % k == 0`` after it, tensorpack's
    ``trigger_step``).

    Raises:
        ValueError: when neither period is given, or one is not a positive int.
    """

    def __init__(self, callback: Callback, every_k_steps: int | None = None,
                 every_k_epochs: int | None = None) -> None:
        every_k_steps, every_k_epochs = _check_periods("PeriodicCallback", every_k_steps,
                                                       every_k_epochs)
        if not (every_k_steps or every_k_epochs):
            raise ValueError("PeriodicCallback needs every_k_steps or every_k_epochs.")

        def due(state: RunState) -> bool:
            return bool((every_k_steps and state.global_step % every_k_steps == 0)
                        or (every_k_epochs and (state.epoch % every_k_epochs == 0
                                                or state.target_epoch == state.epoch)))

        super().__init__(callback, due)
        self._decided.pop("on_step_begin", None)  # on_step_end decides after its own step

