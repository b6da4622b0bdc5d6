"""`RunClock`: the one writer of a run's `Progress` -- its steps, its epochs and when they end.

Every front-end keeps time with it, through one step protocol: `cadence.StandardTrainer` (and so
the tensorpack trainers and the Task `Trainer`) in its step loop, `cadence.tfsnippet.TrainLoop` in
``iter_epochs`` and ``iter_steps``. It holds what the counting needs -- the run's `Progress`, the
`RunState` callbacks see (which reads through to that `Progress`), the `CallbackList` whose step
and epoch hooks it fires, the length of an epoch, the step and epoch limits, and the agreement
on stops across ranks (passed in: nothing here imports torch) -- behind a few verbs::

    clock.begin_loop(num_steps)        # a loop of at most num_steps steps (None: until the
                                       # data's pass ends, a limit or a stop); False: none runs
    while clock.begin_step():          # False: a stop, a limit or the loop's end says no step
        ...the step...                 # (the data ran out first: clock.data_ran_out())
        if not clock.end_step(last_batch_of_pass):
            break                      # counted; the loop ends here
    clock.end_loop()                   # the ranks agree whether to stop; returns the decision

A begun step ends in one of three ways: `end_step` (it ran), `data_ran_out` (the data's pass
ended before the step could take a batch: unsized data only says so then) or `abort_step` (it
raised; it does not count) -- or, for `TrainLoop`, whose step is the body of its user's loop,
`leave_step` (the body broke out of the loop: it ran, and counts). Epochs open at a
step (`begin_step`) and end by the epoch rules below -- or, for `TrainLoop`, whose user writes
the epoch loop, open at `begin_epoch` and close at `end_epoch`. The Controller closes an epoch
that ended with a loop once the loop's logs are on the host (`end_pending_epoch`).

**The epoch rules** (what the numbers mean is `cadence.core.progress`'s):

- an epoch opens at the first step after the last one closed (``on_epoch_begin``), or reopens
  after a pause cut it short -- with the same number, also in a resumed process (whose
  callbacks see its ``on_epoch_begin`` again);
- it is *finished* when its pass over the data ends (``steps_per_epoch=None``) or when it made
  ``steps_per_epoch`` steps -- an epoch its user writes (`begin_epoch`) when its body ends;
- a stop in the middle of an epoch either ends training -- the epoch ends at the stop (its end
  hooks run) and counts as finished, so a run continued later begins the next one -- or, when
  it is a pause (``RunState.request_stop(..., pause=True)``: a signal, a time limit; `pausing`,
  agreed across ranks), leaves the epoch unfinished and closes it *without* its end hooks: the
  run that continues it ends it, so its end hooks run once, as in an uninterrupted run;
- it *closes* (``on_epoch_end``) in mid-loop when it finishes there, or -- when it finishes with
  the loop's last step, or a stop ends it -- after the loop, once the loop's logs are on the
  host (`end_pending_epoch`), so that its end hooks see them;
- with ``stop_at_end_of_data``, the end of the data's pass requests a stop;
- an epoch its user writes ends its step loop when the data's pass ends.

**Limits.** ``max_step`` (no step begins once ``global_step`` reached it) and ``max_epoch`` (no
epoch begins after it) are the clock's; a loop's ``num_steps`` is its budget.

**Stops across ranks.** With an `agreement` (under torchrun), a stop requested on one rank is
taken at the same step by every rank: only the agreement's answer ends a loop (`end_step`), and
the decision at a loop's end (`end_loop`, `stopping`) is the agreement's, never a flag a signal
may have set on this rank alone after it. The clock joins an agreed stop: every rank's
`RunState` then has a stop request. Without an agreement (one process), a requested stop ends the
loop at the next step boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cadence.core.callbacks import CallbackList, RunState
from cadence.core.progress import Progress
from cadence.core.protocols import StopAgreementLike

ANOTHER_RANK = "a stop was requested on another rank"
"""The stop reason of a rank that joins a stop another rank asked for."""


class RunClock:
    """Counts a run's steps and epochs and fires their hooks (see the module docstring).

    Args:
        state: what callbacks see; its ``progress`` holds the counters the clock writes (saved
            in checkpoints by their owner).
        callbacks: whose step and epoch hooks the clock fires.
        steps_per_epoch: None: an epoch is a pass over the data; N: N steps.
        stop_at_end_of_data: the end of a pass requests a stop (the end of training).
        max_step: no step begins once ``global_step`` reached it (None: no limit).
        max_epoch: no epoch begins after it (None: no limit).
        agreement: agrees on stops across ranks; None in one process.
    """

    def __init__(self, state: RunState | None = None, callbacks: CallbackList | None = None,
                 *, steps_per_epoch: int | None = None, stop_at_end_of_data: bool = False,
                 max_step: int | None = None, max_epoch: int | None = None,
                 agreement: StopAgreementLike | None = None) -> None:
        self.state = state if state is not None else RunState()
        self.progress: Progress = self.state.progress
        """The counters it writes: the `state`'s."""
        self.callbacks = callbacks if callbacks is not None else CallbackList()
        self.steps_per_epoch = steps_per_epoch
        self.stop_at_end_of_data = stop_at_end_of_data
        self.max_step = max_step
        self.max_epoch = max_epoch
        self.agreement = agreement
        self.epoch_end_pending = False
        """An epoch ended with the last loop; its end hooks wait for `end_pending_epoch`."""
        self._step_hooks: CallbackList | None = None
        self._stop_agreed = False
        self._pause_agreed = False
        self._steps_left: int | None = None  # the running loop's budget (None: unbounded)
        self._user_epoch = False  # the open epoch was begun by `begin_epoch` (TrainLoop's)
        self._data_pass_ended = False  # the open epoch's pass over the data ended
        self.jumped = 0
        """Steps the global step jumped by, taking another replica group's counters (`adopt`):
        steps this process did not run."""

    # ------------------------------------------------------------------ questions

    @property
    def step_open(self) -> bool:
        """Whether a step's body is running (between `begin_step` and its end)."""
        return self.progress.step_running

    @property
    def stopping(self) -> bool:
        """Whether the run stops before its next loop: in one process, whether a stop was
        requested; across ranks, what the last agreement decided."""
        return self._stop_agreed if self.agreement is not None else self.state.stop_requested

    @property
    def pausing(self) -> bool:
        """Whether the run stops to go on later (a pause: see the epoch rules): in one process,
        whether the stop requested is one; across ranks, what the last agreement decided (a
        pause on any rank is every rank's)."""
        return self._pause_agreed if self.agreement is not None else (
            self.state.stop_requested and self.state.stop_pauses)

    @property
    def limit_reached(self) -> bool:
        """Whether `max_step` or `max_epoch` says that training is over."""
        progress = self.progress
        if self.max_step is not None and progress.global_step >= self.max_step:
            return True
        return (self.max_epoch is not None and progress.epoch_finished
                and progress.epoch >= self.max_epoch)

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

    # ------------------------------------------------------------------ counters from elsewhere

    def set_global_step(self, step: int) -> None:
        """Sets the completed steps to `step`: a count that comes from elsewhere -- a trainer
        that counts its own steps (not on a clock), the step of weights loaded to evaluate."""
        self.progress.global_step = int(step)

    def counters(self) -> dict[str, Any]:
        """The completed steps and the epoch's counters, as another replica group takes them
        when it heals from this one (a step in flight not counted: it takes part in it)."""
        progress = self.progress
        return {"global_step": progress.global_step, "epoch": progress.epoch,
                "epoch_step": progress.epoch_step, "epoch_finished": progress.epoch_finished}

    def adopt(self, counters: dict[str, Any]) -> None:
        """Takes another replica group's `counters` (a heal, in the middle of a step): the
        global step jumps; `jumped` adds by how much. This process's own bookkeeping -- an
        open epoch, a step in flight -- stays as it is. The running loop still ends at the
        step it was aimed at (a checkpoint's multiple, the end of training), or after the step
        in flight when the jump passed it: its budget shrinks by the jump."""
        progress = self.progress
        before, running, open_ = progress.global_step, progress.step_running, progress.epoch_open
        progress.load_state_dict(counters)
        progress.step_running, progress.epoch_open = running, open_
        jump = progress.global_step - before
        self.jumped += jump
        if self._steps_left is not None and jump:
            self._steps_left = max(self._steps_left - jump, 1 if running else 0)

    def start_at_epoch(self, epoch: int) -> None:
        """A fresh run's first epoch is `epoch` (tensorpack's ``starting_epoch``): the epochs
        before it count as done."""
        self.progress.epoch = max(int(epoch) - 1, 0)

    # ------------------------------------------------------------------ epochs

    def _open_epoch(self, announce: Callable[[], Any] | None = None) -> None:
        """Opens the next epoch, or reopens one a stop ended early, and fires its
        ``on_epoch_begin``; `announce` runs first, with the new number in place."""
        progress = self.progress
        if progress.epoch_finished:
            progress.epoch += 1
            progress.epoch_step = 0
            progress.epoch_finished = False
        progress.epoch_open = True
        self._data_pass_ended = False
        if announce is not None:
            announce()
        self.callbacks.fire("on_epoch_begin", self.state)

    def _close_epoch(self, announce: Callable[[], Any] | None = None) -> None:
        """Fires the running epoch's ``on_epoch_end`` (after `announce`), then closes it."""
        self.epoch_end_pending = False
        if announce is not None:
            announce()
        self.callbacks.fire("on_epoch_end", self.state)
        self.progress.epoch_open = False
        self._user_epoch = False

    def begin_epoch(self, announce: Callable[[], Any] | None = None) -> bool:
        """Opens an epoch its user writes (`TrainLoop`'s ``iter_epochs``): the next one, or
        the one a stop ended early. Returns False, opening nothing, when the run stops or a
        limit was reached; else fires ``on_epoch_begin`` (after `announce`, with the epoch's
        number in place).

        Raises:
            RuntimeError: if an epoch is open.
        """
        if self.progress.epoch_open:
            raise RuntimeError("An epoch is open already: end it (end_epoch) first.")
        if self.stopping or (self.progress.epoch_finished and self.limit_reached):
            return False
        self._open_epoch(announce)
        self._user_epoch = True
        return True

    def end_epoch(self, announce: Callable[[], Any] | None = None) -> None:
        """Closes an epoch its user wrote when its body ended: it finished, and its
        ``on_epoch_end`` fires after `announce` -- unless a pause cut it short before its data's
        pass ended: then it closes without its end hooks, and a resumed run reopens it."""
        if self.stopping and self.pausing and not self._data_pass_ended:
            self.leave_epoch()
            return
        self.progress.epoch_finished = True
        self._close_epoch(announce)

    @property
    def epoch_cut_short(self) -> bool:
        """Whether a pause cut the open epoch short: it is not finished, and its end waits for
        the run that continues it (`end_epoch` closes it without its end hooks)."""
        return (self.progress.epoch_open and not self.progress.epoch_finished
                and not self._data_pass_ended and self.stopping and self.pausing)

    def leave_epoch(self) -> None:
        """The epoch's body was left by a break or an exception: it closes without its end
        hooks, unfinished."""
        self.progress.epoch_open = False
        self._user_epoch = False

    def end_pending_epoch(self) -> None:
        """Closes an epoch that ended with the last loop -- its last step was the loop's, or a
        stop ended it. The Controller calls it once the loop's logs are on the host, so that
        epoch-end callbacks see them; a runner calls it itself when nothing drives it."""
        if self.epoch_end_pending:
            self._close_epoch()

    def _epoch_ended(self, at_loop_end: bool) -> None:
        if at_loop_end:
            self.epoch_end_pending = True
        else:
            self._close_epoch()

    def _pass_ended(self, at_loop_end: bool) -> bool:
        """The data's pass ended: an epoch that is a pass finishes (and closes, now or after the
        loop); with `stop_at_end_of_data` a stop is requested. Returns whether the loop ends."""
        self._data_pass_ended = True
        if self._user_epoch:
            return True  # its step loop ends; its user ends the epoch
        if self.steps_per_epoch is not None:
            return False  # the data repeats within an epoch of N steps
        self.progress.epoch_finished = True
        end_of_data = self.stop_at_end_of_data
        if end_of_data:
            self.state.request_stop("end of training data")
        local_stop = self.state.stop_requested and self.agreement is None
        self._epoch_ended(at_loop_end or end_of_data or local_stop)
        return end_of_data

    # ------------------------------------------------------------------ steps

    def begin_loop(self, num_steps: int | None = None) -> bool:
        """A loop of at most `num_steps` steps starts (None: until the data's pass ends, a
        limit or a stop). Returns False when it has nothing to run: no steps asked, or the
        epoch has none left (``steps_per_epoch`` reached by a resumed run) -- then only the
        epoch's hooks run, the end ones after the loop."""
        self._step_hooks = self.callbacks if self.callbacks.has_step_hooks else None
        self._steps_left = num_steps
        self.state.epoch_paused = False
        if self._user_epoch or self.steps_to_epoch_end() != 0:
            return num_steps != 0
        if not self.progress.epoch_open:
            self._open_epoch()
        self.progress.epoch_finished = True
        self.epoch_end_pending = True
        self._steps_left = 0
        return False

    def begin_step(self) -> bool:
        """Before a step: returns False when it must not start -- the loop made its steps, a
        stop was requested (in one process; across ranks, agreed), `max_step` was reached, or
        the step's hooks asked to stop. Else opens the epoch if none is open, fires
        ``on_step_begin``, and the step's body runs."""
        state, progress = self.state, self.progress
        if self._steps_left == 0 or self._stop_agreed or (
                state.stop_requested and self.agreement is None):
            return False
        if self.max_step is not None and progress.global_step >= self.max_step:
            return False
        if not progress.epoch_open:
            self._open_epoch()
        hooks = self._step_hooks
        if hooks is not None:
            hooks.fire("on_step_begin", state)
            if state.stop_requested and self.agreement is None:
                return False
        progress.step_running = True
        return True

    def end_step(self, last_batch_of_pass: bool) -> bool:
        """After a step that ran: counts it (before its hooks, so that a checkpoint taken there
        is exact), finishes its epoch when the epoch rules say, fires ``on_step_end``, closes
        the epoch (now, or after the loop when the step is its last), and lets the ranks agree
        on a stop. Returns whether the loop goes on to another step (`begin_step` may still
        say no).

        Args:
            last_batch_of_pass: the step took the last batch of the data's pass.
        """
        progress, state = self.progress, self.state
        progress.global_step += 1
        progress.epoch_step += 1
        progress.step_running = False
        left = self._steps_left
        if left is not None:
            left -= 1
            self._steps_left = left
        last = left == 0
        per_epoch = self.steps_per_epoch
        by_steps = per_epoch is not None and progress.epoch_step >= per_epoch
        if not self._user_epoch and (by_steps or (per_epoch is None and last_batch_of_pass)):
            progress.epoch_finished = True  # before the step's hooks: they see it finished
        hooks = self._step_hooks
        if hooks is not None:
            hooks.fire("on_step_end", state)
        if by_steps and not self._user_epoch:
            self._epoch_ended(at_loop_end=last)
        if last_batch_of_pass and self._pass_ended(at_loop_end=last):
            return False
        agreement = self.agreement
        if agreement is not None:
            if agreement.poll(state.stop_requested):
                self._join_stop()
                return False
            return not last
        return not (last or state.stop_requested)

    def data_ran_out(self) -> bool:
        """A begun step found the data's pass ended before it could take a batch (unsized data
        says so only then): the step does not count. Returns whether the loop goes on -- to
        the next pass, with `begin_step` again -- or ends (the end of the data ends training,
        or ends the step loop of an epoch its user writes)."""
        self.progress.step_running = False
        return not self._pass_ended(at_loop_end=False)

    def abort_step(self) -> None:
        """A begun step did not run to its end (it raised, or asked to stop training with
        ``StopTraining``): it does not count."""
        self.progress.step_running = False

    def leave_step(self) -> None:
        """The step's body was left by a break or an exception (`TrainLoop`'s step is the body
        of the user's loop): its batch was taken and it ran, so it counts, without its end
        hooks."""
        progress = self.progress
        if progress.step_running:
            progress.step_running = False
            progress.global_step += 1
            progress.epoch_step += 1

    def end_loop(self) -> bool:
        """A loop of steps ended: returns whether the run stops -- across ranks, the ranks'
        decision, the same on every rank, and whether the stop is a pause (`pausing`). A stop
        that ends training ends the running epoch, whose end hooks then wait for
        `end_pending_epoch`; a pause closes an unfinished one without them (an epoch its user
        writes ends with its body: `end_epoch`)."""
        self._steps_left = None
        agreement = self.agreement
        if agreement is None:
            stopped = self.state.stop_requested
        else:
            agreement.reset()
            stopped = self._decide(agreement.agree(self.state.stop_requested))
            # a second agreement, only when stopping: a pause on any rank is every rank's
            self._pause_agreed = stopped and agreement.agree(self.state.stop_pauses)
            self.state.stop_pauses = self.state.stop_pauses or self._pause_agreed
        self._stop_agreed = stopped
        progress = self.progress
        if stopped and progress.epoch_open and not self._user_epoch:
            if self.pausing and not progress.epoch_finished:
                self.epoch_end_pending = False
                self.state.epoch_paused = True
                self.leave_epoch()  # its end waits for the run that continues it
            else:
                progress.epoch_finished = True
                self.epoch_end_pending = True
        return stopped

    # ------------------------------------------------------------------ stops

    def agree(self, local: bool) -> bool:
        """Whether any rank says `local` (`local` itself in one process): a decision every rank
        takes at once, such as a preemption at a loop's end."""
        return self.agreement.agree(local) if self.agreement is not None else local

    def _join_stop(self) -> None:
        """The ranks agreed to stop: this one stops too, if the request came from another."""
        self._stop_agreed = True
        if not self.state.stop_requested:
            self.state.request_stop(ANOTHER_RANK)

    def _decide(self, agreed: bool) -> bool:
        if agreed:
            self._join_stop()
        return agreed

    def agree_to_stop(self) -> bool:
        """Agrees at once, across ranks, on a stop requested on any of them (after a loop's or
        an epoch's callbacks, say); on every rank a stop is then requested, and the decision
        returned."""
        agreed = self._decide(self.agree(self.state.stop_requested))
        self._stop_agreed = agreed
        if agreed and self.agreement is not None:  # a pause on any rank is every rank's
            self._pause_agreed = self.agreement.agree(self.state.stop_pauses)
        return agreed

    def clear_stop(self) -> None:
        """Forgets a stop request and decision: a new run (an entry point's call) starts."""
        self.state.stop_requested, self.state.stop_reason = False, None
        self.state.stop_pauses = self.state.epoch_paused = False
        self._stop_agreed = self._pause_agreed = False
