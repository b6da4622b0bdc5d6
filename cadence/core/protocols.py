"""The interfaces the Controller drives. Any object with these methods works; nothing here
imports torch."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from cadence.core.checkpoint_dir import CheckpointInfo
from cadence.core.progress import Progress

if TYPE_CHECKING:
    from cadence.core.clock import RunClock


@runtime_checkable
class Trainable(Protocol):
    """A trainer: runs `num_steps` steps and returns (possibly nested) logs or None."""

    def train(self, num_steps: int) -> Mapping[str, Any] | None: ...


@runtime_checkable
class Evaluable(Protocol):
    """An evaluator: runs `num_steps` steps (-1: until the data is exhausted), returns logs."""

    def evaluate(self, num_steps: int) -> Mapping[str, Any] | None: ...


@runtime_checkable
class CountsEvalSteps(Protocol):
    """An evaluator that says how many steps its last evaluation ran (`StandardEvaluator`: the
    data may end first), so that its steps per second are right."""

    last_eval_steps: int | None


@runtime_checkable
class Stateful(Protocol):
    """Anything that can be checkpointed: modules, optimizers, schedulers, callbacks."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


def is_stateful(obj: Any) -> bool:
    """Whether `obj` is an instance with callable ``state_dict`` and ``load_state_dict`` (a class
    has them as plain functions, so classes are not stateful)."""
    return (
        not isinstance(obj, type)
        and callable(getattr(obj, "state_dict", None))
        and callable(getattr(obj, "load_state_dict", None))
    )


class StopAgreementLike(Protocol):
    """How ranks agree on a stop (`cadence.engine.stop_agreement.StopAgreement` under torchrun):
    the messages a `cadence.core.clock.RunClock` sends across ranks. The clock decides what an
    agreement means (every rank then stops); this only carries the flags."""

    def poll(self, local: bool) -> bool:
        """Called after every step with this rank's stop flag; True when the ranks agreed to
        stop, at this same step on every rank (without waiting for another rank per step)."""

    def agree(self, local: bool) -> bool:
        """Whether any rank says `local`, at once (blocking: every rank calls it)."""

    def reset(self) -> None:
        """Forgets an agreement `poll` started (at a loop's end, before `agree`)."""


@runtime_checkable
class ClockedTrainer(Protocol):
    """A trainer that counts steps and epochs on a run clock it builds (`cadence.StandardTrainer`,
    and so every front-end's trainer). The Controller hands it its run state and callbacks
    (`bind`), and trains to a number of epochs, ends loops at epochs' ends and agrees on stops
    through the clock it gets back."""

    @property
    def progress(self) -> Progress:
        """The step and epoch counters the clock counts on (saved in checkpoints)."""

    @property
    def examples_per_step(self) -> int | None:
        """Examples in a step, when the data says (for examples/sec)."""

    def train_steps(self, num_steps: int) -> Any:
        """One inner loop of `num_steps` steps -- the runner protocol's ``train``, by a name of
        its own: a front-end may give ``train`` another meaning (tensorpack's)."""

    def inner_loop(self, num_steps: int) -> Any:
        """One inner loop as the Controller runs it: the runner protocol's ``train`` -- a
        subclass's own ``train`` where it overrides it (a wrapper around ``super().train``, a
        loop of its own) -- or, where a front-end gives ``train`` another meaning (tensorpack's),
        `train_steps`."""

    def loop_rates(self, steps_per_second: float) -> Mapping[str, float]:
        """Rates of the loop that just ended beside its steps per second -- tokens per second,
        TFLOPS, MFU (`cadence.engine.throughput`) -- for its logs; empty when the trainer does
        not know them."""

    def bind(self, state: Any, callbacks: Any) -> RunClock:
        """Counts from now on with a clock of the Controller's run state (a `RunState` of this
        trainer's `progress`) and callbacks (a `CallbackList`); returns that clock."""

    def max_steps_to_epoch_end(self) -> int | None:
        """At most how many steps until the running epoch ends (None: unknown)."""


class CheckpointManagerLike(Protocol):
    """What the Controller needs of a checkpoint manager (`cadence.CheckpointManager` has it)."""

    checkpoint_interval: int | None

    @property
    def checkpoints(self) -> Sequence[CheckpointInfo]: ...

    def track(self, name: str, obj: Stateful) -> None: ...

    def save(self, step: int) -> str: ...

    def restore(self, path: str) -> int: ...

    def restore_or_initialize(self) -> str | None: ...


@runtime_checkable
class SavesInBackground(Protocol):
    """A checkpoint manager whose saves finish in the background and that logs them itself
    once committed (`cadence.CheckpointManager`). The Controller waits for its saves before
    an entry point returns; a manager without these methods saves synchronously, and the
    Controller logs its saves."""

    logs_saves: bool

    def wait(self) -> None:
        """Returns once every save made so far is committed; raises a failed write's error."""

    def abandon(self) -> None:
        """Drops saves still running without committing them: a rank failing among several
        must not enter a commit's collectives alone."""


class TimelineLike(Protocol):
    """The events the engine records in a run's timeline as it drives the run (the run record's
    `cadence.records.timeline.Timeline`; that module's docstring is the format)."""

    def restore_begin(self) -> None: ...

    def restore_end(self, step: int, checkpoint: str | None) -> None: ...

    def loop_end(self, step: int, steps: int, seconds: float, data_wait_s: float = 0.0,
                 checkpoint_wait_s: float = 0.0) -> None: ...

    def eval_begin(self, step: int) -> None: ...

    def eval_end(self, step: int) -> None: ...

    def save(self, step: int, stall_s: float) -> None: ...

    def signal(self, name: str) -> None: ...


class RunRecordLike(Protocol):
    """What the Controller needs of the record a training process keeps of its run
    (`cadence.records.run_record.RunRecord`): the timeline it records each loop, evaluation,
    restore, save and signal in, and what it adds to a loop's logs (the goodput so far). The
    record lives in its own layer (`cadence.records`) and is handed to the engine, as the
    summary manager is."""

    @property
    def timeline(self) -> TimelineLike: ...

    @property
    def run_dir(self) -> Path:
        """The run's directory."""

    def loop_logs(self) -> Mapping[str, Any]: ...


class RunDriver(Protocol):
    """What drives a run -- the `cadence.Controller`, a `cadence.tfsnippet.TrainLoop` -- as a
    callback reaches it through `RunState.controller`."""

    @property
    def checkpoint_manager(self) -> CheckpointManagerLike | None:
        """The run's checkpoint manager, if it has one."""

    def save_checkpoint(self) -> str:
        """Saves a checkpoint now and returns its path.

        Raises:
            ValueError: if the run has no checkpoint manager.
        """


@runtime_checkable
class MetricWriter(Protocol):
    """A destination of logs: TensorBoard, JSON lines, CSV, MLflow, W&B, ...

    A `SummaryManager` builds one per backend for its directory and calls `write` once per
    group of nested logs: ``values`` are one level's leaves, already on the host (numbers, lists,
    strings); ``group`` is the path of keys above them (``()`` at the top, ``("eval",)`` for
    ``{"eval": {...}}``); ``extra`` describes the record (e.g. the checkpoint an evaluation ran
    on) and is given with the top-level group only. A writer shows what it can (TensorBoard:
    scalars) and ignores the rest.

    A writer that records a whole run in one place (MLflow, W&B) rather than files in each
    directory says so with a class attribute ``run_scoped = True``: a `SummaryManager` then builds
    it by name with ``run_dir=`` (the run's root), and it names values by the path of its
    directory below the run's root (``train/loss``). A writer that can record the run's
    hyper-parameters also has `HParamsWriter`'s ``write_hparams``.
    """

    def write(self, step: int, values: Mapping[str, Any], group: tuple[str, ...] = (),
              extra: Mapping[str, Any] | None = None) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class HParamsWriter(Protocol):
    """A `MetricWriter` that records hyper-parameters: MLflow's params, W&B's config.

    ``params`` is flat: dotted names (``trainer.optimizer_config.optimizer.learning_rate``) to
    numbers, strings, booleans, None or lists, as the run's config holds them.
    """

    def write_hparams(self, params: Mapping[str, Any]) -> None: ...


@runtime_checkable
class OutcomeWriter(Protocol):
    """A `MetricWriter` that records how the run ended: MLflow's run status (``FINISHED``,
    ``FAILED``, ``KILLED``), W&B's exit code, TensorBoard's hparams session status.

    `SummaryManager.close` calls ``set_outcome`` just before ``close``, with the exception the
    run ends with (None when it completed; `cadence.Preempted` when it was stopped).
    """

    def set_outcome(self, error: BaseException | None) -> None: ...


@runtime_checkable
class StepReplacingWriter(Protocol):
    """A `MetricWriter` whose records of a step can be replaced: JSON lines, CSV, TensorBoard.

    A `SummaryManager` built with ``replace_steps=True`` (an evaluation directory) calls
    ``forget_step`` just before each ``write`` of `write_summaries`, with the same ``step`` and
    ``group``: the writer drops the records of that step and group that were in its files
    before it opened them (an earlier evaluation of the same checkpoint), and keeps the records
    it wrote itself, so that the step then has the new evaluation's records alone.
    """

    def forget_step(self, step: int, group: tuple[str, ...] = ()) -> None: ...


class SummaryManagerLike(Protocol):
    """What the Controller needs of a summary manager (`cadence.SummaryManager` has it)."""

    def write_summaries(self, logs: Mapping[str, Any], step: int | None = None, *,
                        extra: dict[str, Any] | None = None) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def as_default(self, record_if: Any = None) -> contextlib.AbstractContextManager[None]: ...
