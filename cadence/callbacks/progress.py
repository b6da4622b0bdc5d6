"""`ProgressBar`: a tqdm progress bar over training steps, updated once per loop.

On a terminal it shows the step, the target, the ETA, steps/sec and the latest scalar logs; when
stderr is not a terminal (CI, a log file) tqdm's bar would only add noise, so it stays silent
and the Controller's log lines carry the same information. Only rank 0 shows it.
"""

from __future__ import annotations

import sys
from typing import Any

from cadence.core.callbacks import Callback, RunState
from cadence.core.logs import flatten, format_value, is_scalar
from cadence.core.rank import process_rank


class ProgressBar(Callback):
    """Shows training progress; costs nothing per step (it hooks loops, not steps).

    Args:
        enabled: force the bar on or off; by default it is on when stderr is a terminal.
        max_logs: how many scalar logs to show beside the bar.
    """

    def __init__(self, enabled: bool | None = None, max_logs: int = 4) -> None:
        self.enabled = enabled
        self.max_logs = max_logs
        self._bar: Any = None
        self._shown = 0

    def _active(self) -> bool:
        if process_rank() != 0:
            return False
        return self.enabled if self.enabled is not None else sys.stderr.isatty()

    def on_train_begin(self, state: RunState) -> None:
        if not self._active():
            return
        from tqdm.auto import tqdm

        self._shown = state.global_step
        self._bar = tqdm(total=state.target_step, initial=state.global_step, unit="step",
                         dynamic_ncols=True, leave=True)

    def on_loop_end(self, state: RunState, logs: dict[str, Any]) -> None:
        if self._bar is None:
            return
        self._bar.update(state.global_step - self._shown)
        self._shown = state.global_step
        scalars = {k: format_value(v) for k, v in flatten(logs).items()
                   if is_scalar(v) and not k.endswith("_per_second")}
        self._bar.set_postfix(dict(list(scalars.items())[: self.max_logs]), refresh=False)

    def on_train_end(self, state: RunState) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
