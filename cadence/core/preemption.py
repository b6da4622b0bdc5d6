"""`Preemption`: SIGTERM and Ctrl-C become a clean stop, a checkpoint, and `Preempted`.

Every front-end trains inside `Preemption.watch`: the first SIGTERM or SIGINT requests a stop
through the run state (the loops end after the current step), and when training has wound down,
`Preemption.finish` saves a checkpoint and raises `cadence.Preempted`, whose exit code (143 for
SIGTERM, 130 for SIGINT) tells a scheduler to requeue. A second Ctrl-C stops at once, without
saving; a second delivery of the stop signal itself does nothing (a scheduler and ``torchrun``
both send it). Handlers are installed only in the main thread, and the previous ones are put
back.

In a Slurm job (`cadence.core.slurm`) the signal Slurm sends before the time limit
(``--signal=USR1@120``; `SlurmOptions.signal`) stops the run too; once the checkpoint is saved,
rank 0 requeues the job when Slurm lets it (`cadence.core.slurm.requeue`), and a process that
stopped on a signal leaves later deliveries of SIGTERM and that signal unanswered -- the requeue
itself, or the job-wide signal at the end of a preemption's grace time, would otherwise kill it
in the middle of closing its files. SIGKILL, after Slurm's ``KillWait``, still ends it.

In a notebook (an IPython kernel), Ctrl-C -- the kernel's interrupt -- ends the cell with a
`KeyboardInterrupt` once the checkpoint is saved: a `SystemExit` there would be IPython's "To
exit: use 'exit'" warning, and there is no scheduler to requeue. (The loop lines show there
without any logging setup: every front-end calls `cadence.core.notebook.show_log_lines` as it
starts.)
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from cadence.core.callbacks import RunState
from cadence.core.errors import Preempted
from cadence.core.notebook import in_notebook
from cadence.core.rank import process_rank
from cadence.core.slurm import SlurmJob, SlurmOptions, requeue

logger = logging.getLogger("cadence")

SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop every run; a Slurm job adds its stop signal (`Preemption.signals`)."""


class Preemption:
    """Turns SIGTERM and SIGINT into a stop request, then into a save and `Preempted`.

    Args:
        enabled: install the handlers (only ever from the main thread).
        on_signal: called with the signal's name (``"SIGTERM"``) when one requests the stop, or
            when another rank's becomes this rank's (the run's timeline records it).
        slurm: what a Slurm job does on its stop signal (default `SlurmOptions()`: SIGUSR1 stops
            too, and the job requeues itself after the save).
    """

    def __init__(self, enabled: bool = True,
                 on_signal: Callable[[str], None] | None = None,
                 slurm: SlurmOptions | None = None) -> None:
        self.enabled = enabled
        self.on_signal = on_signal
        self.slurm = slurm if slurm is not None else SlurmOptions()
        self.received: int | None = None
        """The signal that requested the stop, if one did."""
        self._agreed: bool | None = None
        """The ranks' last decision (`agree`): what `finish` acts on when there was one."""
        self._job: SlurmJob | None = None
        """The Slurm job this process runs in, as `watch` found it."""

    def signals(self) -> tuple[signal.Signals, ...]:
        """The signals `watch` turns into a stop: `SIGNALS`, and in a Slurm job its stop
        signal (`SlurmOptions.signal`)."""
        extra = self.slurm.stop_signal if SlurmJob.from_environ() is not None else None
        return SIGNALS if extra is None or extra in SIGNALS else (*SIGNALS, extra)

    @contextlib.contextmanager
    def watch(self, state: RunState) -> Iterator[Preemption]:
        """While inside, a signal requests a stop through `state`."""
        self.received = None
        self._job = SlurmJob.from_environ()
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handler(signum: int, frame: Any) -> None:
            if self.received is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now, without saving
            if self.received is not None:
                _already_stopping(signum, frame)
                return
            self.received = signum
            name = signal.Signals(signum).name
            logger.warning("Received %s: stopping after this step and saving a checkpoint.", name)
            state.request_stop(name, pause=True)  # the run goes on when started again
            if self.on_signal is not None:
                self.on_signal(name)

        previous = {sig: signal.signal(sig, handler) for sig in self.signals()}
        try:
            yield self
        finally:
            stopped = self._job is not None and self.received not in (None, signal.SIGINT)
            for sig, old in previous.items():
                # A Slurm job that stopped on a signal is on its way out: see the module
                # docstring.
                keep_quiet = stopped and sig != signal.SIGINT
                signal.signal(sig, _already_stopping if keep_quiet else old)

    def agree(self, any_rank: Callable[[bool], bool]) -> bool:
        """Makes a signal received by any rank of a distributed job this rank's too
        (`any_rank` tells whether a flag is true on any rank): then every rank saves and raises
        `Preempted`. Every rank must call it. Returns the decision, the same on every rank;
        `finish` acts on it, so that a signal arriving on one rank after the agreement cannot
        make that rank alone save and exit (the next run, or the next agreement, takes it)."""
        agreed = any_rank(self.received is not None)
        if agreed and self.received is None:
            self.received = signal.SIGTERM
            logger.warning("Another rank received a signal: stopping and saving a checkpoint.")
            if self.on_signal is not None:
                self.on_signal("SIGTERM")
        self._agreed = agreed
        return agreed

    def finish(self, save: Callable[[], str | None]) -> None:
        """After a signal: calls `save` and raises `Preempted` with the checkpoint it returns.

        Raises:
            Preempted: when a signal requested the stop (as the ranks agreed, if they did).
            KeyboardInterrupt: instead, for Ctrl-C in a notebook (see the module docstring);
                its message names the checkpoint.
        """
        agreed, self._agreed = self._agreed, None
        preempted = agreed if agreed is not None else self.received is not None
        if not preempted:
            return
        signum = self.received or signal.SIGTERM
        checkpoint = save()
        if signum == signal.SIGINT and in_notebook():
            where = f"saved {checkpoint}" if checkpoint else "no checkpoint manager to save to"
            raise KeyboardInterrupt(f"Training interrupted ({where}); run the cell again to "
                                    "continue.")
        raise Preempted(signum, checkpoint, requeued=self._requeue(signum, checkpoint))

    def _requeue(self, signum: int, checkpoint: str | None) -> bool:
        """Whether rank 0 requeued the Slurm job, once the checkpoint of a stop on a signal
        other than Ctrl-C is saved (a run without one would start again from nothing)."""
        job = self._job
        if (job is None or not self.slurm.requeue or signum == signal.SIGINT
                or checkpoint is None or process_rank() != 0):
            return False
        return requeue(job)


def _already_stopping(signum: int, frame: Any) -> None:
    """A stop signal delivered again, to a process that is stopping already: nothing to do."""
    logger.debug("Received %s again: already stopping.", signal.Signals(signum).name)
