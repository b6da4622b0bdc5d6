"""Evaluation in the Controller: one evaluation, or every new checkpoint as it appears.

`ControllerEvaluation` is the half of `cadence.Controller` that evaluates (the other half
trains); it is not used on its own. One evaluation::

    on_eval_begin
    logs = evaluator.evaluate(steps)     # eval_begin, eval_step / eval_reduce..., eval_end
    logs to the host; eval actions
    eval summaries (with the step and the checkpoint the weights came from); log line
    state.metrics["eval/<name>"] = ...
    on_eval_end(logs)
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from cadence.core.callbacks import CallbackList, RunState
from cadence.core.checkpoint_dir import new_checkpoints
from cadence.core.errors import CheckpointError
from cadence.core.intervals import check_eval_steps
from cadence.core.logs import format_logs, plain_logs, to_host
from cadence.core.protocols import CheckpointManagerLike, Evaluable, SummaryManagerLike

logger = logging.getLogger("cadence")


class ControllerEvaluation:
    """`evaluate` and `evaluate_continuously` of the `cadence.Controller`."""

    # Set by Controller.__init__.
    evaluator: Evaluable | None
    checkpoint_manager: CheckpointManagerLike | None
    eval_summary_manager: SummaryManagerLike
    eval_actions: tuple[Callable[..., None], ...]
    callbacks: CallbackList
    state: RunState
    _global_step: Callable[[], int]
    _weights_checkpoint: str | None
    _last_eval_step: int
    _last_eval_logs: dict[str, Any] | None

    def _require(self, role: str) -> None:
        if getattr(self, role) is None:
            raise ValueError(f"This Controller has no {role}: pass Controller({role}=...).")

    def _session(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def _sync_state(self) -> None:
        raise NotImplementedError

    def restore_checkpoint(self, checkpoint_path: str | None = None) -> str | None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The Controller's own state: which step was last evaluated, and that evaluation's
        logs (`cadence.core.logs.plain_logs`), which a finished run returns when restarted."""
        return {"last_eval_step": self._last_eval_step, "last_eval_logs": self._last_eval_logs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._last_eval_step = int(state_dict.get("last_eval_step", -1))
        logs = state_dict.get("last_eval_logs")  # absent from older checkpoints
        self._last_eval_logs = logs if isinstance(logs, dict) else None

    def evaluate(self, steps: int = -1) -> dict[str, Any]:
        """Runs one evaluation of `steps` steps (-1: until the data is exhausted).

        The evaluation is recorded with the step and the checkpoint whose weights it used
        (None when the weights in memory were not checkpointed): in the log line, in the
        ``metrics.jsonl`` record, and in ``state.extra["last_eval"]``.

        Returns:
            The evaluator's logs on the host, plus ``steps_per_second`` when `steps` > 0.

        Raises:
            ValueError: without an evaluator, or if `steps` is neither positive nor -1.
        """
        self._require("evaluator")
        check_eval_steps(steps)
        with self._session():
            return self._evaluate(steps)

    def _evaluate(self, steps: int) -> dict[str, Any]:
        assert self.evaluator is not None
        step = self._global_step()
        self._sync_state()
        self.callbacks.fire("on_eval_begin", self.state)
        start = time.perf_counter()
        with self.eval_summary_manager.as_default():
            output = self.evaluator.evaluate(steps)
        output = output if output is not None else {}
        for action in self.eval_actions:
            action(output)
        logs = to_host(output)
        elapsed = time.perf_counter() - start
        if steps > 0 and elapsed > 0:  # the steps that ran: the data may run out first
            done = getattr(self.evaluator, "last_eval_steps", None)
            logs["steps_per_second"] = (steps if done is None else done) / elapsed
        record = {"step": step, "checkpoint": self._weights_checkpoint}
        logger.info(
            "eval | step: %d | checkpoint: %s | eval time: %.2fs | %s",
            step, self._weights_checkpoint or "none (weights in memory)", elapsed,
            format_logs(logs),
        )
        self.eval_summary_manager.write_summaries(
            logs, step=step, extra={"checkpoint": self._weights_checkpoint}
        )
        self.eval_summary_manager.flush()
        self._last_eval_step = step
        self._last_eval_logs = plain_logs(logs)  # checkpointed: what a finished run returns
        self.state.extra["last_eval"] = record
        self.state.put_metrics(logs, prefix="eval/")
        self.callbacks.fire("on_eval_end", self.state, logs)
        return logs

    def evaluate_continuously(
        self,
        steps: int = -1,
        timeout: float | None = None,
        timeout_fn: Callable[[], bool] | None = None,
        *,
        stop_at_step: int | None = None,
        poll_interval: float = 1.0,
    ) -> dict[str, Any] | None:
        """Evaluates every new checkpoint in the manager's directory, oldest first.

        Unlike Orbit, which looks only at the newest checkpoint, every complete checkpoint that
        appears is evaluated, and one deleted by retention before it was read is skipped.

        Args:
            steps: evaluation steps per checkpoint (-1: until the data is exhausted).
            timeout: seconds without a new checkpoint after which `timeout_fn` is asked whether
                to end; None waits forever.
            timeout_fn: called when `timeout` expires (Orbit's argument): True ends the
                evaluation loop, False waits another `timeout`. None: the loop ends at the
                first timeout.
            stop_at_step: return once a checkpoint at this step or later was evaluated.
            poll_interval: seconds between looks at the directory.

        Returns:
            The logs of the last evaluation, or None if none ran.

        Raises:
            ValueError: without an evaluator or a checkpoint manager.
            TypeError: if `timeout_fn` is not callable.
        """
        self._require("evaluator")
        check_eval_steps(steps)
        if self.checkpoint_manager is None:
            raise ValueError("evaluate_continuously() needs a checkpoint manager.")
        if timeout_fn is not None and not callable(timeout_fn):
            raise TypeError(f"`timeout_fn` (got {type(timeout_fn).__name__}) must be a function "
                            "with no arguments that returns True to stop, or None.")
        with self._session():
            return self._evaluate_new_checkpoints(steps, timeout, timeout_fn, stop_at_step,
                                                  poll_interval)

    def _evaluate_new_checkpoints(self, steps: int, timeout: float | None,
                                  timeout_fn: Callable[[], bool] | None,
                                  stop_at_step: int | None,
                                  poll_interval: float) -> dict[str, Any] | None:
        assert self.checkpoint_manager is not None
        manager = self.checkpoint_manager
        output = None
        for info in new_checkpoints(lambda: manager.checkpoints, timeout, poll_interval,
                                    timeout_fn):
            try:
                self.restore_checkpoint(str(info.path))
            except CheckpointError as error:
                logger.warning("Skipping checkpoint %s: %s", info.path, error)
                continue
            output = self._evaluate(steps)
            if stop_at_step is not None and info.step >= stop_at_step:
                break
        return output
