"""`ProgressBar`: a tqdm progress bar over training steps.

On a terminal it shows the step, the target, the ETA, steps/sec and the latest scalar logs, and
in a Jupyter notebook the same as tqdm's notebook bar (``tqdm.auto``: a widget where ipywidgets
is installed, text otherwise); when stderr is neither (CI, a log file) tqdm's bar would only add
noise, so it stays silent and the Controller's log lines carry the same information. Only rank 0
shows it.

What the bar shows always belongs together: at the end of each loop it is redrawn with that
loop's step and that loop's logs. In between -- a loop can take many seconds, the first one
especially -- a background thread moves the count (read from the trainer's step counter, a
Python int: no device sync) every `refresh_interval` seconds, and the logs are marked with the
step they come from.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from cadence.core.callbacks import Callback, RunState
from cadence.core.intervals import check_int, is_int
from cadence.core.logs import flatten, format_value, is_scalar
from cadence.core.notebook import in_notebook
from cadence.core.rank import process_rank
from cadence.core.trainer_view import TrainerView


class ProgressBar(Callback):
    """Shows training progress; costs nothing per step (it hooks loops, not steps).

    Args:
        enabled: force the bar on or off; by default it is on when stderr is a terminal or
            the process is a notebook's kernel.
        max_logs: how many scalar logs to show beside the bar.
        refresh_interval: seconds between redraws during a loop (the count moves); None
            redraws only at loop ends.

    Raises:
        ValueError: if `max_logs` is negative or `refresh_interval` is not positive.
    """

    def __init__(self, enabled: bool | None = None, max_logs: int = 4,
                 refresh_interval: float | None = 0.5) -> None:
        max_logs = check_int("ProgressBar", "max_logs", max_logs,
                             "Pass the number of logs to show, e.g. max_logs=4 (0: none).",
                             minimum=0)
        if refresh_interval is not None and not refresh_interval > 0:
            raise ValueError(f"`refresh_interval` (got {refresh_interval!r}) must be positive, "
                             "or None to redraw only at loop ends.")
        self.enabled = enabled
        self.max_logs = max_logs
        self.refresh_interval = refresh_interval
        self._bar: Any = None
        self._logs_text = ""
        self._logs_step: int | None = None
        self._trainer: TrainerView | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def _active(self) -> bool:
        if process_rank() != 0:
            return False
        if self.enabled is not None:
            return self.enabled
        return sys.stderr.isatty() or in_notebook()

    def on_train_begin(self, state: RunState) -> None:
        if not self._active():
            return
        from tqdm.auto import tqdm

        self._logs_text, self._logs_step = "", None
        self._trainer = state.trainer
        self._bar = tqdm(total=state.target_step, initial=state.global_step, unit="step",
                         dynamic_ncols=True, leave=True)
        if self.refresh_interval is not None:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick_until_stopped,
                                            name="cadence-progress", daemon=True)
            self._ticker.start()

    def _live_step(self) -> int | None:
        step = self._trainer.global_step if self._trainer is not None else None
        return step if is_int(step) else None

    def _tick_until_stopped(self) -> None:
        assert self.refresh_interval is not None
        while not self._stop.wait(self.refresh_interval):
            self.tick()

    def tick(self) -> None:
        """Moves the count to the trainer's step and redraws (the background thread calls it
        during loops)."""
        bar, step = self._bar, self._live_step()
        if bar is None or step is None or step == bar.n:
            return
        bar.n = step
        stale = self._logs_step is not None and step != self._logs_step
        postfix = f"{self._logs_text} (at step {self._logs_step})" if stale else self._logs_text
        bar.set_postfix_str(postfix, refresh=False)
        bar.refresh()

    def on_loop_end(self, state: RunState, logs: dict[str, Any]) -> None:
        bar = self._bar
        if bar is None:
            return
        scalars = [(k, format_value(v)) for k, v in flatten(logs).items()
                   if is_scalar(v) and not k.endswith("_per_second")]
        self._logs_text = ", ".join(f"{k}={v}" for k, v in scalars[: self.max_logs])
        self._logs_step = state.global_step
        # The logs first, then the count, then one redraw: both belong to this loop. (tqdm's
        # update() redraws only when its minimum interval has passed, so the postfix could
        # otherwise lag a loop behind, or never appear.)
        bar.set_postfix_str(self._logs_text, refresh=False)
        bar.update(state.global_step - bar.n)
        bar.refresh()

    def on_train_end(self, state: RunState) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._trainer = None
