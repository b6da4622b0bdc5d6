"""`RunClock`: the one place where a run's steps are counted and its epochs begin and end.

Every front-end keeps time with it: `cadence.StandardTrainer` (and so the tensorpack trainers
and the Task `Trainer`) in its step loop, `cadence.tfsnippet.TrainLoop` in ``iter_epochs`` and
``iter_steps``. It holds what the counting needs -- the run's `Progress`, the `RunState`
callbacks see, the `CallbackList` whose step and epoch hooks it fires, the steps of an epoch, and
the agreement on stops across ranks (passed in: nothing here imports torch) -- behind a few verbs::

    clock.begin_loop()                 # a loop of steps starts (False: nothing to run)
    clock.begin_step()                 # opens the epoch if none is open, fires on_step_begin;
                                       # False: a stop was requested, the step does not start
    ...the step...
    clock.end_step(pass_done, last)    # counts it, applies the epoch rules, fires on_step_end,
                                       # and begins the next step: False, the loop ends here
    clock.data_ran_out()               # the data ended before a step could take a batch
    clock.open_step(), close_step()    # TrainLoop's step, counted before its body runs
    clock.end_loop()                   # the ranks agree whether to stop; returns the decision
    clock.end_pending_epoch()          # an epoch that ended with the loop: its end hooks

**The epoch rules** (what the numbers mean is `cadence.core.progress`'s):

- an epoch opens at the first step after the last one closed (``on_epoch_begin``), or reopens
  after a stop ended it early -- with the same number, also in a resumed process;
- it is *finished* when its pass over the data ends (``steps_per_epoch=None``) or when it made
  ``steps_per_epoch`` steps; a stop ends it without finishing it;
- it *closes* (``on_epoch_end``) in mid-loop when it finishes there, or -- when it finishes with
  the loop's last step, or a stop ends it -- after the loop, once the loop's logs are on the
  host (`end_pending_epoch`), so that its end hooks see them;
- with ``stop_at_end_of_data``, the end of the data's pass requests a stop.

**Stops across ranks.** With an `agreement` (under torchrun), a stop requested on one rank is
taken at the same step by every rank: only the agreement's answer ends a loop (`end_step`),
and the decision at a loop's end (`end_loop`, `stopping`) is the agreement's, never a flag a
signal may have set on this rank alone after it. Without one (one process), a requested stop
ends the loop at the next step boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cadence.core.callbacks import CallbackList, RunState
from cadence.core.progress import Progress
from cadence.core.protocols import StopAgreementLike


class RunClock:
    """Counts a run's steps and epochs and fires their hooks (see the module docstring).

    Args:
        progress: the counters (saved in checkpoints by their owner).
        state: what callbacks see; the clock keeps its ``global_step`` and ``epoch`` current.
        callbacks: whose step and epoch hooks the clock fires.
        steps_per_epoch: None: an epoch is a pass over the data; N: N steps.
        stop_at_end_of_data: the end of a pass requests a stop (the end of training).
        agreement: agrees on stops across ranks; None in one process.
    """

    def __init__(self, progress: Progress | None = None, state: RunState | None = None,
                 callbacks: CallbackList | None = None, *, steps_per_epoch: int | None = None,
                 stop_at_end_of_data: bool = False,
                 agreement: StopAgreementLike | None = None) -> None:
        self.progress = progress if progress is not None else Progress()
        self.state = state if state is not None else RunState()
        self.callbacks = callbacks if callbacks is not None else CallbackList()
        self.steps_per_epoch = steps_per_epoch
        self.stop_at_end_of_data = stop_at_end_of_data
        self.agreement = agreement
        self.epoch_end_pending = False
        """An epoch ended with the last loop; its end hooks wait for `end_pending_epoch`."""
        self.step_open = False
        """A step opened by `open_step` runs (the body of TrainLoop's step loop)."""
        self._step_hooks: CallbackList | None = None
        self._stop_agreed = False

    # ------------------------------------------------------------------ questions

    @property
    def stop_now(self) -> bool:
        """Whether a loop ends at this step boundary: a stop was requested, in one process.
        Across ranks a request waits for the agreement (`end_step`, `end_loop`)."""
        return self.state.stop_requested and self.agreement is None

    @property
    def stopping(self) -> bool:
        """Whether the run stops before its next loop: in one process, whether a stop was
        requested; across ranks, what the last agreement decided."""
        return self._stop_agreed if self.agreement is not None else self.state.stop_requested

    def steps_to_epoch_end(self) -> int | None:
        """Steps until the running (or next) epoch ends, when epochs have `steps_per_epoch`
        steps; None when an epoch is a pass over the data."""
        per_epoch, progress = self.steps_per_epoch, self.progress
        if per_epoch is None:
            return None
        return per_epoch if progress.epoch_finished else max(per_epoch - progress.epoch_step, 0)

    def max_steps_to_epoch_end(self, batches_left: int | None) -> int | None:
        """At most how many steps until the running epoch ends: `steps_to_epoch_end`, or, for
        an epoch that is a pass, the `batches_left` in it (a step takes at least one)."""
        exact = self.steps_to_epoch_end()
        if exact is not None:
            return exact
        return None if batches_left is None else max(batches_left, 1)

    def steps_to_epochs(self, epochs: int) -> int | None:
        """Steps until `epochs` epochs are completed, when epochs have `steps_per_epoch` steps;
        None otherwise."""
        per_epoch, progress = self.steps_per_epoch, self.progress
        if per_epoch is None:
            return None
        left = epochs - progress.epochs_completed
        if left <= 0:
            return 0
        return left * per_epoch - (0 if progress.epoch_finished else progress.epoch_step)

    def agree(self, local: bool) -> bool:
        """Whether any rank says `local` (`local` itself in one process): a decision every rank
        takes at once, such as a stop or a preemption at a loop's end."""
        return self.agreement.agree(local) if self.agreement is not None else local

    # ------------------------------------------------------------------ epochs

    def sync(self) -> None:
        """Puts the counters where callbacks read them (`RunState`)."""
        self.state.global_step = self.progress.global_step
        self.state.epoch = self.progress.epoch

    def open_epoch(self, announce: Callable[[], Any] | None = None) -> None:
        """Opens the next epoch, or reopens one a stop ended early, and fires its
        ``on_epoch_begin``; `announce` runs first, with the new number in place (TrainLoop's
        tfsnippet events)."""
        self.progress.begin_epoch()
        self.sync()
        if announce is not None:
            announce()
        self.callbacks.fire("on_epoch_begin", self.state)

    def close_epoch(self, announce: Callable[[], Any] | None = None) -> None:
        """Fires the running epoch's ``on_epoch_end`` (after `announce`), then closes it."""
        self.epoch_end_pending = False
        self.sync()
        if announce is not None:
            announce()
        self.callbacks.fire("on_epoch_end", self.state)
        self.progress.end_epoch()

    def end_pending_epoch(self) -> None:
        """Closes an epoch that ended with the last loop -- its last step was the loop's, or a
        stop ended it. The Controller calls it once the loop's logs are on the host, so that
        epoch-end callbacks see them; a runner calls it itself when nothing drives it."""
        if self.epoch_end_pending:
            self.epoch_end_pending = False
            self.close_epoch()

    def _epoch_ended(self, at_loop_end: bool) -> None:
        if at_loop_end:
            self.epoch_end_pending = True
        else:
            self.close_epoch()

    # ------------------------------------------------------------------ steps

    def begin_loop(self) -> bool:
        """A loop of steps starts. Returns False when it has nothing to run: the epoch has no
        steps left (``steps_per_epoch`` reached by a resumed run) -- then only its hooks run,
        the end ones after the loop."""
        self._step_hooks = self.callbacks if self.callbacks.has_step_hooks else None
        if self.steps_to_epoch_end() != 0:
            return True
        if not self.progress.epoch_open:
            self.open_epoch()
        self.progress.finish_epoch()
        self.epoch_end_pending = True
        return False

    def begin_step(self) -> bool:
        """Before a step: opens the epoch if none is open and fires ``on_step_begin``. Returns
        False when the step must not start: a stop was requested (in one process), before the
        step or by these hooks."""
        if self.state.stop_requested and self.agreement is None:
            return False
        if not self.progress.epoch_open:
            self.open_epoch()
        hooks = self._step_hooks
        if hooks is not None:
            self.state.global_step = self.progress.global_step
            hooks.fire("on_step_begin", self.state)
            return not (self.state.stop_requested and self.agreement is None)
        return True

    def open_step(self) -> None:
        """Opens a step whose body runs now -- TrainLoop's, whose step is the body of its loop:
        fires ``on_step_begin``, then counts the step, so that a checkpoint made in the body
        holds it. `close_step` closes it. (Its batch is taken already: a stop these hooks ask
        for ends the loop after the step.)"""
        progress, hooks = self.progress, self._step_hooks
        if hooks is not None:
            self.state.global_step = progress.global_step
            hooks.fire("on_step_begin", self.state)
        progress.global_step += 1
        progress.epoch_step += 1
        self.step_open = True

    def close_step(self, announce: Callable[[], Any] | None = None) -> None:
        """Fires the open step's ``on_step_end`` (after `announce`) and closes it."""
        if announce is not None:
            announce()
        hooks = self._step_hooks
        if hooks is not None:
            self.state.global_step = self.progress.global_step
            hooks.fire("on_step_end", self.state)
        self.step_open = False

    def end_step(self, pass_done: bool, last: bool) -> bool:
        """After a step that ran: counts it (before its hooks, so that a checkpoint taken there
        is exact), finishes its epoch when the epoch rules say, fires ``on_step_end``, and
        closes the epoch (now, or after the loop when the step is its `last`). Then, unless
        the loop ends here -- the step was its `last`, the data's end ends training, the ranks
        agreed to stop -- it begins the next step (`begin_step`). Returns whether that step
        runs: one call per step of the hot loop.

        Args:
            pass_done: the step took the last batch of the data's pass.
            last: the step is the loop's last.
        """
        progress, state = self.progress, self.state
        progress.global_step += 1  # counted here: this is the hot loop
        progress.epoch_step += 1
        per_epoch = self.steps_per_epoch
        epoch_done = pass_done if per_epoch is None else progress.epoch_step >= per_epoch
        if epoch_done:
            progress.epoch_finished = True
        hooks = self._step_hooks
        if hooks is not None:
            state.global_step = progress.global_step
            hooks.fire("on_step_end", state)
        if epoch_done:
            if per_epoch is None:
                if self._pass_ended(at_loop_end=last):
                    return False
            else:
                self._epoch_ended(at_loop_end=last)
        agreement = self.agreement
        if agreement is not None and agreement.after_step(state):
            return False
        # begin_step, inlined: this is the hot loop
        if last or (state.stop_requested and agreement is None):
            return False
        if not progress.epoch_open:
            self.open_epoch()
        if hooks is not None:
            state.global_step = progress.global_step
            hooks.fire("on_step_begin", state)
            return not (state.stop_requested and agreement is None)
        return True

    def data_ran_out(self) -> bool:
        """The data ended before a step could take a batch. When an epoch is a pass, the epoch
        is finished here; returns whether the loop ends (the end of the data ends training, or
        -- in one process -- a stop was requested before)."""
        if self.steps_per_epoch is not None:
            return False  # the data repeats within an epoch of N steps
        return self._pass_ended(at_loop_end=False)

    def _pass_ended(self, at_loop_end: bool) -> bool:
        self.progress.finish_epoch()
        end_of_data = self.stop_at_end_of_data
        if end_of_data:
            self.state.request_stop("end of training data")
        self._epoch_ended(at_loop_end or end_of_data or self.stop_now)
        return end_of_data

    def end_loop(self) -> bool:
        """A loop of steps ended: returns whether the run stops -- across ranks, the ranks'
        decision, the same on every rank. A stop ends the running epoch, whose end hooks then
        wait for `end_pending_epoch`."""
        agreement = self.agreement
        stopped = (agreement.at_loop_end(self.state) if agreement is not None
                   else self.state.stop_requested)
        self._stop_agreed = stopped
        if stopped and self.progress.epoch_open:
            self.epoch_end_pending = True
        return stopped

    def clear_stop(self) -> None:
        """Forgets a stop request and decision: a new run (an entry point's call) starts."""
        self.state.stop_requested, self.state.stop_reason = False, None
        self._stop_agreed = False

    def agree_to_stop(self) -> bool:
        """Agrees at once, across ranks, on a stop requested on any of them (after a loop's
        callbacks, say); on every rank a stop is then requested, and the decision returned."""
        agreed = self.agree(self.state.stop_requested)
        if agreed and not self.state.stop_requested:
            self.state.request_stop("a stop was requested on another rank")
        self._stop_agreed = agreed
        return agreed
