"""`Evaluations`: runs an evaluator and records each evaluation -- the Controller's evaluation.

One evaluation (`Evaluations.run`)::

    on_eval_begin
    logs = evaluator.evaluate(steps)     # eval_begin, eval_step / eval_reduce..., eval_end
    logs to the host; eval actions
    eval summaries (with the step and the checkpoint the weights came from); log line
    state.metrics["eval/<name>"] = ...
    on_eval_end(logs)

It remembers the last evaluation -- its step and its logs -- in its state, which the Controller
checkpoints: a run restarted after it finished knows that its final evaluation happened, and
returns its logs. `evaluate_new_checkpoints` evaluates every checkpoint as it appears.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cadence.core.callbacks import CallbackList, RunState
from cadence.core.checkpoint_dir import CheckpointInfo, new_checkpoints
from cadence.core.errors import CheckpointError
from cadence.core.logs import format_logs, plain_logs, summary_logs
from cadence.core.protocols import CountsEvalSteps, Evaluable, SummaryManagerLike
from cadence.core.summary import to_host

logger = logging.getLogger("cadence")


class Evaluations:
    """Runs evaluations and records each one (see the module docstring). What evaluates, where
    it is written and the actions are given with each run: the Controller's attributes, which
    its users may set.

    Args:
        callbacks: whose ``on_eval_begin`` and ``on_eval_end`` run around each evaluation.
        state: the run state the callbacks see; evaluations put ``eval/<name>`` metrics and
            ``extra["last_eval"]`` (the step and the checkpoint) there.

    Attributes:
        last_step: the global step of the last evaluation (-1: none).
        last_logs: its logs, as a checkpoint holds them (`cadence.core.logs.plain_logs`).
    """

    def __init__(self, callbacks: CallbackList, state: RunState) -> None:
        self.callbacks = callbacks
        self.state = state
        self.last_step = -1
        self.last_logs: dict[str, Any] | None = None
        self._said: set[str] = set()  # evaluators said once not to return a mapping

    def run(self, evaluator: Evaluable, steps: int, step: int, checkpoint: str | None,
            summaries: SummaryManagerLike,
            actions: Iterable[Callable[..., None]] = ()) -> dict[str, Any]:
        """Runs `evaluator` for `steps` steps (-1: until the data is exhausted) on the weights
        of global step `step`, which came from `checkpoint` (None: not checkpointed), and
        records it in `summaries`; `actions` (Orbit's) get the raw output.

        Returns:
            The evaluator's logs on the host, plus ``steps_per_second`` when `steps` > 0.
        """
        self.callbacks.fire("on_eval_begin", self.state)
        start = time.perf_counter()
        with summaries.as_default():
            output = evaluator.evaluate(steps)
        output = output if output is not None else {}
        for action in actions:
            action(output)
        logs = summary_logs(to_host(output), f"{type(evaluator).__name__}.evaluate()",
                            self._said)
        elapsed = time.perf_counter() - start
        if steps > 0 and elapsed > 0:  # the steps that ran: the data may run out first
            done = evaluator.last_eval_steps if isinstance(evaluator, CountsEvalSteps) else None
            logs["steps_per_second"] = (steps if done is None else done) / elapsed
        logger.info("eval | step: %d | checkpoint: %s | eval time: %.2fs | %s", step,
                    checkpoint or "none (weights in memory)", elapsed, format_logs(logs))
        summaries.write_summaries(logs, step=step, extra={"checkpoint": checkpoint})
        summaries.flush()
        self.last_step = step
        self.last_logs = plain_logs(logs)  # checkpointed: what a finished run returns
        self.state.extra["last_eval"] = {"step": step, "checkpoint": checkpoint}
        self.state.put_metrics(logs, prefix="eval/")
        self.callbacks.fire("on_eval_end", self.state, logs)
        return logs

    def state_dict(self) -> dict[str, Any]:
        """Which step was evaluated last, and that evaluation's logs."""
        return {"last_eval_step": self.last_step, "last_eval_logs": self.last_logs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_step = int(state_dict.get("last_eval_step", -1))
        logs = state_dict.get("last_eval_logs")  # absent from older checkpoints
        self.last_logs = logs if isinstance(logs, dict) else None


def evaluate_new_checkpoints(listing: Callable[[], Sequence[CheckpointInfo]],
                             evaluate: Callable[[str], dict[str, Any]],
                             timeout: float | None, timeout_fn: Callable[[], bool] | None,
                             stop_at_step: int | None,
                             poll_interval: float) -> dict[str, Any] | None:
    """Calls `evaluate` with every complete checkpoint that `listing` shows, oldest first, as
    they appear (`cadence.core.checkpoint_dir.new_checkpoints`), skipping one that fails to
    restore (`CheckpointError`), until `timeout` and `timeout_fn` end it or a checkpoint at
    `stop_at_step` or later was evaluated. Returns the last evaluation's logs (None: none)."""
    output = None
    for info in new_checkpoints(listing, timeout, poll_interval, timeout_fn):
        try:
            output = evaluate(str(info.path))
        except CheckpointError as error:
            logger.warning("Skipping checkpoint %s: %s", info.path, error)
            continue
        if stop_at_step is not None and info.step >= stop_at_step:
            break
    return output
