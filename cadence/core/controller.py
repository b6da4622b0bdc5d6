"""The Controller: Orbit's outer loop, with exact intervals -- the one outer loop of cadence.

Every front-end trains through it: the Task `Trainer` (``run_experiment``), Orbit-style
runners, and the tensorpack trainers (an epoch there is a loop of ``steps_per_epoch`` steps).
The Controller decides how many steps the trainer runs next, and between those inner loops it
saves checkpoints, writes summaries, logs, evaluates and calls callbacks and actions. It never
counts steps itself: it reads the trainer's global step before and after each loop, and with a
trainer that counts on a `cadence.core.clock.RunClock` (a `cadence.StandardTrainer`: the
`ClockedTrainer` of `cadence.core.protocols`), it hands the trainer its run state (which reads
the trainer's `Progress`) and callbacks with ``bind``, and gets back the clock the trainer built
around them: then it trains to a number of epochs, ends loops at epochs' ends and agrees on
stops through it.

The order of ``train`` (``train_and_evaluate`` adds evaluations between loops)::

    on_train_begin
    while the target step (or epoch) is not reached and no stop was requested:
        n = min(steps_per_loop, steps to the next checkpoint boundary,
                steps to the end of the epoch when epochs have a fixed number of steps)
        on_loop_begin
        logs = trainer.train(n)          # the runner fires on_epoch_begin at an epoch's first
                                         # step, on_step_begin/on_step_end around each step, and
                                         # on_epoch_end when an epoch ends in mid-loop
        logs to the host                 # the loop's one host-device synchronization
        [on_epoch_end]                   # an epoch that ended at the loop's last step (or was
                                         # ended by a stop request): its end hooks see the loop's
                                         # logs in state.metrics
        summaries (every loop, as Orbit); on_loop_end(logs)
        [checkpoint; on_checkpoint_saved]
    [checkpoint at completion]
    on_train_end
    [Preempted]                          # after SIGTERM / SIGINT, once the checkpoint is saved

Where it differs from Orbit on purpose -- exact intervals, explicit saves that always save,
evaluations that record the checkpoint they ran on, honest restarts, preemption, training to a
number of epochs -- is listed in the README ("How cadence differs from Orbit").
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from cadence.core.arguments import check_bool, check_callable, check_path, check_run_hooks
from cadence.core.callbacks import Callback, CallbackList, RunState
from cadence.core.clock import RunClock
from cadence.core.evaluation import Evaluations, evaluate_new_checkpoints
from cadence.core.hook_checks import describe
from cadence.core.intervals import (
    Interval,
    check_count,
    check_eval_steps,
    check_interval,
    check_steps_per_loop,
    steps_until_boundary,
)
from cadence.core.logs import format_logs, summary_logs
from cadence.core.notebook import show_log_lines
from cadence.core.preemption import Preemption
from cadence.core.progress import Progress
from cadence.core.protocols import (
    CheckpointManagerLike,
    ClockedTrainer,
    Evaluable,
    RunRecordLike,
    SummaryManagerLike,
    Trainable,
)
from cadence.core.rank import data_size
from cadence.core.run_checkpoints import RunCheckpoints
from cadence.core.run_dir import RunDirectory
from cadence.core.slurm import SlurmOptions
from cadence.core.summary import DEFAULT_WRITERS, RunSummaries, WriterSpec, to_host

logger = logging.getLogger("cadence")
loop_logger = logging.getLogger("cadence.loop")
"""Carries the per-loop training lines, so that a front-end showing a progress bar can quiet
them without quieting evaluations and checkpoints."""

Action = Callable[[Mapping[str, Any]], None]
"""An Orbit action: called with a loop's (or an evaluation's) raw output."""


def _check_runners(trainer: Any, evaluator: Any,
                   steps_per_loop: int | Callable[[int], int] | None,
                   ) -> int | Callable[[int], int] | None:
    """Refuses a Controller that has nothing to drive, or runners it cannot drive; returns the
    checked `steps_per_loop` (None without a trainer).

    Raises:
        ValueError: without a trainer and an evaluator, or without `steps_per_loop` for a
            trainer.
        TypeError: for a trainer without ``train``, an evaluator without ``evaluate``.
    """
    if trainer is None and evaluator is None:
        raise ValueError("Controller needs a `trainer`, an `evaluator`, or both.")
    if trainer is not None and not isinstance(trainer, Trainable):
        raise TypeError(
            f"`trainer` (got {type(trainer).__name__}) must have a train(num_steps) method; "
            "subclass cadence.StandardTrainer or cadence.AbstractTrainer."
        )
    if evaluator is not None and not isinstance(evaluator, Evaluable):
        raise TypeError(
            f"`evaluator` (got {type(evaluator).__name__}) must have an evaluate(num_steps) "
            "method; subclass cadence.StandardEvaluator or cadence.AbstractEvaluator."
        )
    if trainer is None:
        return None
    if steps_per_loop is None:
        raise ValueError(
            "`steps_per_loop` is required when a trainer is given, e.g. steps_per_loop=100.")
    return check_steps_per_loop(steps_per_loop)


def _check_kinds(*, summary_dir: Any, eval_summary_dir: Any, global_step: Any,
                 checkpoint_manager: Any, summary_manager: Any, eval_summary_manager: Any,
                 callbacks: Any, train_actions: Any, eval_actions: Any, handle_signals: Any,
                 log_loops: Any) -> tuple[Any, list[Action], list[Action]]:
    """Refuses the Controller's other arguments of the wrong kind, before anything is made,
    naming each and what it must be (Python would fail later, naming none); returns the
    callbacks (a list, or the `CallbackList` given) and the actions as lists.

    Raises:
        TypeError: for an argument of the wrong kind.
    """
    owner = "Controller"
    check_path(owner, "summary_dir", summary_dir, "e.g. summary_dir='runs/mine/train'",
               none_ok=True)
    check_path(owner, "eval_summary_dir", eval_summary_dir,
               "e.g. eval_summary_dir='runs/mine/eval'", none_ok=True)
    check_callable(owner, "global_step", global_step,
                   "e.g. global_step=lambda: trainer.global_step", none_ok=True)
    for name, value, kind, methods in (
            ("checkpoint_manager", checkpoint_manager, "cadence.CheckpointManager",
             ("save", "restore_or_initialize")),
            ("summary_manager", summary_manager, "cadence.SummaryManager",
             ("write_summaries", "flush")),
            ("eval_summary_manager", eval_summary_manager, "cadence.SummaryManager",
             ("write_summaries", "flush"))):
        if value is not None and not all(callable(getattr(value, m, None)) for m in methods):
            raise TypeError(f"{owner}: `{name}` (got {describe(value)}) must be a {kind} (or "
                            f"have its methods {', '.join(methods)}) or None.")
    given = callbacks
    checked, train, evaluation = check_run_hooks(
        owner, [] if isinstance(given, CallbackList) else given, train_actions, eval_actions)
    check_bool(owner, "handle_signals", handle_signals, "e.g. handle_signals=False")
    check_bool(owner, "log_loops", log_loops, "e.g. log_loops=False")
    return given if isinstance(given, CallbackList) else checked, train, evaluation


class Controller:
    """Drives a trainer and/or an evaluator: the outer loop of training.

    Args:
        trainer: an object with ``train(num_steps) -> logs | None`` (e.g. a `StandardTrainer`).
        evaluator: an object with ``evaluate(num_steps) -> logs | None``; may be the trainer.
        global_step: returns the number of completed training steps. Defaults to reading the
            trainer's (else the evaluator's) ``global_step`` attribute.
        steps_per_loop: steps per inner loop (a positive int, or a function of the global step
            that returns one). Required with a trainer. Bookkeeping happens between loops.
        checkpoint_manager: saves and restores state. Constructing the Controller restores the
            newest complete checkpoint, or runs the manager's ``init_fn`` when there is none.
        summary_dir: where train logs are written as summaries (by `writers`); None writes
            none.
        summary_interval: record the `cadence.summary.scalar` calls made inside steps only on
            the steps that are multiples of it (None: on every step). A loop's outputs are
            written after every loop, as Orbit writes them.
        eval_summary_dir: where evaluation logs go; defaults to `summary_dir`.
        summary_manager: where train logs go instead of `summary_dir` (Orbit's argument): a
            `cadence.SummaryManager` with other writers, or anything with its methods. The
            Controller flushes it but does not close it.
        eval_summary_manager: the same for evaluation logs; defaults to the train one when
            `eval_summary_dir` is not given.
        writers: the metric writers of the summaries written to `summary_dir` and
            `eval_summary_dir`: names (``tensorboard``, ``jsonl``, ``csv``, ``mlflow``,
            ``wandb``) or functions of a directory. MLflow and W&B keep one run for both
            directories, in their parent when they are siblings (see ``docs/writers.md``).
        callbacks: `Callback` objects, called in this order (or a `CallbackList`, used as is).
        train_actions: Orbit actions, called with each loop's raw output.
        eval_actions: Orbit actions, called with each evaluation's raw output.
        handle_signals: turn SIGTERM and SIGINT during training into a clean stop, a checkpoint
            and `Preempted` (only from the main thread); in a Slurm job its stop signal too,
            and the job is requeued after the checkpoint (`slurm`).
        log_loops: log a line after each training loop (``cadence.loop``); a front-end whose
            monitors print the loop's scalars themselves (tensorpack's `ScalarPrinter`) passes
            False.
        run_dir: the run's directory (a path or a `cadence.core.run_dir.RunDirectory`; by
            default the `record`'s), where built-in callbacks write by default
            (``RunState.run_dir``), and where a run that continues from the checkpoint restored
            here says so (``resumes.jsonl``: ``cadence plot`` marks it).
        record: the run's record (a `cadence.records.run_record.RunRecord`, or anything with the
            methods of `cadence.core.protocols.RunRecordLike`) of a process that trains in a
            run directory: the Controller records each loop's end (its time, and how long
            it waited for input), evaluation, restore, save and signal in its timeline, and
            adds the run's ``goodput`` so far to each loop's logs; ``cadence goodput RUN``
            reads it. A bare Controller's user makes it around the attempt::

                with cadence.RunRecord("runs/mine") as record:
                    controller = cadence.Controller(..., record=record)
                    controller.train(1000)
        slurm: what a Slurm job does on its stop signal (`cadence.core.slurm.SlurmOptions`;
            default: SIGUSR1 stops like SIGTERM, and the job requeues itself after the save).

    Raises:
        ValueError: if neither a trainer nor an evaluator is given, an interval or
            `steps_per_loop` is not a positive int, or a writer's name is unknown.
        TypeError: if the trainer has no ``train`` method, the evaluator no ``evaluate``
            method, the global step cannot be found, or another argument is of the wrong kind
            (a `summary_dir` that is not a path, callbacks that are not `Callback` objects,
            a `checkpoint_manager` without a manager's methods, ...): the message names it.
        ImportError: if a writer's library is not installed.
    """

    def __init__(
        self,
        *,
        trainer: Trainable | ClockedTrainer | None = None,
        evaluator: Evaluable | None = None,
        global_step: Callable[[], int] | None = None,
        steps_per_loop: int | Callable[[int], int] | None = None,
        checkpoint_manager: CheckpointManagerLike | None = None,
        summary_dir: str | None = None,
        summary_interval: int | None = None,
        eval_summary_dir: str | None = None,
        summary_manager: SummaryManagerLike | None = None,
        eval_summary_manager: SummaryManagerLike | None = None,
        writers: Sequence[WriterSpec] = DEFAULT_WRITERS,
        callbacks: Iterable[Callback] = (),
        train_actions: Iterable[Action] = (),
        eval_actions: Iterable[Action] = (),
        handle_signals: bool = True,
        log_loops: bool = True,
        run_dir: Any = None,
        record: RunRecordLike | None = None,
        slurm: SlurmOptions | None = None,
    ) -> None:
        self._steps_per_loop = _check_runners(trainer, evaluator, steps_per_loop)
        callbacks, train_actions, eval_actions = _check_kinds(
            summary_dir=summary_dir, eval_summary_dir=eval_summary_dir, global_step=global_step,
            checkpoint_manager=checkpoint_manager, summary_manager=summary_manager,
            eval_summary_manager=eval_summary_manager, callbacks=callbacks,
            train_actions=train_actions, eval_actions=eval_actions,
            handle_signals=handle_signals, log_loops=log_loops)
        self.trainer = trainer
        self.evaluator = evaluator
        self._global_step = global_step or self._find_global_step()
        self.summary_interval = check_interval("summary_interval", summary_interval)
        self.checkpoint_manager = checkpoint_manager
        self.callbacks = callbacks if isinstance(callbacks, CallbackList) else CallbackList(
            callbacks)
        self.train_actions = tuple(train_actions)
        self.eval_actions = tuple(eval_actions)
        self.handle_signals = handle_signals
        self.log_loops = log_loops
        """Log a line after each training loop (``cadence.loop``); a front-end whose monitors
        print the loop's scalars themselves (tensorpack's `ScalarPrinter`) turns it off."""
        self.record = record
        self.slurm = slurm
        if run_dir is None and record is not None:
            run_dir = record.run_dir
        if isinstance(run_dir, (str, os.PathLike)):
            run_dir = RunDirectory(run_dir)
        show_log_lines()  # to the terminal, unless the user configured logging
        # Managers built here are closed at the end of every entry point (train,
        # train_and_evaluate, evaluate, evaluate_continuously); injected ones are flushed.
        self._summaries = RunSummaries(summary_dir, eval_summary_dir, summary_manager,
                                       eval_summary_manager, self._global_step, writers)
        self.summary_manager = self._summaries.train
        self.eval_summary_manager = self._summaries.eval
        self._clocked = trainer if isinstance(trainer, ClockedTrainer) else None
        self.state, self._clock = self._state_and_clock(run_dir)
        self._evaluations = Evaluations(self.callbacks, self.state)
        self._said: set[str] = set()  # the outputs said once not to be summaries
        self._checkpoints = RunCheckpoints(checkpoint_manager, self._global_step,
                                           self.callbacks, self.state, record)
        self._preemption = self._new_preemption(handle_signals)
        self._resumed_from: str | None = None
        if checkpoint_manager is not None:
            checkpoint_manager.track("controller", self)
            checkpoint_manager.track("callbacks", self.callbacks)
            self._resumed_from = self.restore_checkpoint()
        self._sync_state()

    def _state_and_clock(self, run_dir: Any) -> tuple[RunState, RunClock]:
        """The run state callbacks see, and the clock that counts the run: a trainer that counts
        on a clock builds it (with the length of its epochs and the agreement of its ranks)
        around this state -- which reads its progress -- and these callbacks; for any other,
        the Controller's own clock only takes the trainer's count and agrees on stops."""
        clocked = self._clocked
        state = RunState(progress=clocked.progress if clocked is not None else Progress(),
                         trainer=self.trainer, evaluator=self.evaluator, controller=self,
                         run_dir=run_dir)
        clock = (clocked.bind(state, self.callbacks) if clocked is not None
                 else RunClock(state=state, callbacks=self.callbacks))
        return state, clock

    # ------------------------------------------------------------------ properties and state

    def _find_global_step(self) -> Callable[[], int]:
        for runner in (self.trainer, self.evaluator):
            if runner is not None and hasattr(runner, "global_step"):
                found: Any = runner
                return lambda: int(found.global_step)
        raise TypeError(
            "Cannot find the global step: neither the trainer nor the evaluator has a "
            "`global_step` attribute. Pass global_step=lambda: <completed steps>."
        )

    @property
    def global_step(self) -> int:
        """Completed training steps, as the trainer reports them."""
        return self._global_step()

    @property
    def progress(self) -> Progress | None:
        """The trainer's step and epoch counters, when it keeps them (a `StandardTrainer`)."""
        return self._clock.progress if self._clocked is not None else None

    @property
    def steps_per_loop(self) -> int | None:
        """Steps in the next inner loop (a callable `steps_per_loop` is evaluated now)."""
        if callable(self._steps_per_loop):
            return check_steps_per_loop(self._steps_per_loop(self.global_step))  # type: ignore[return-value]
        return self._steps_per_loop

    def _sync_state(self) -> None:
        """A trainer that does not count on a clock counts its own steps: the run state shows
        its count."""
        if self._clocked is None:
            self._clock.set_global_step(self._global_step())

    # ------------------------------------------------------------------ checkpoints

    def restore_checkpoint(self, checkpoint_path: str | None = None) -> str | None:
        """Restores `checkpoint_path`, or the newest complete checkpoint; with none on disk, runs
        the manager's ``init_fn``.

        Returns:
            The restored checkpoint's path, or None if nothing was restored.

        Raises:
            ValueError: if the Controller has no checkpoint manager.
            CheckpointError: if the checkpoint is incomplete, corrupt, foreign or mismatched.
        """
        path = self._checkpoints.restore(checkpoint_path)
        self._sync_state()
        return path

    def checkpoint_follows_loop(self) -> bool:
        """Whether a checkpoint is saved after the loop that just ended -- its interval was
        crossed, training reached its target, or the ranks agreed to stop (a stop saves) --
        asked by ``on_loop_end`` callbacks that must check the weights before they are saved.
        The same answer on every rank: a stop counts once the ranks agreed on it."""
        step = self._global_step()
        target = self.state.target_step
        return self._checkpoints.manager is not None and (
            self._checkpoints.due(step) or self._clock.stopping
            or (target is not None and step >= target))

    def save_checkpoint(self) -> str:
        """Saves a checkpoint now, whatever the checkpoint interval.

        Raises:
            ValueError: if the Controller has no checkpoint manager.
        """
        return self._checkpoints.save()

    # ------------------------------------------------------------------ training

    def train(self, steps: int | None = None, checkpoint_at_completion: bool = True, *,
              epochs: int | None = None) -> None:
        """Trains until the global step reaches `steps` (an absolute target, not a count), or
        until `epochs` epochs are completed -- whichever comes first when both are given.

        Training also ends early, cleanly, when a callback requests a stop or the trainer's data
        runs out (with ``StandardTrainerOptions(stop_at_end_of_data=True)``).

        Args:
            steps: the global step to train to.
            checkpoint_at_completion: save a checkpoint when training ends (needs a manager).
            epochs: the number of completed epochs to train to (needs a trainer that counts
                epochs, such as a `StandardTrainer`).

        Returns when the checkpoints it saved are committed, also when the manager writes them
        in the background (``CheckpointManager(async_save=True)``), as Orbit does.

        Raises:
            ValueError: without a trainer, without a target, or for a negative target.
            TypeError: for `epochs` with a trainer that does not count epochs.
            StorageError: if the machine fails a write of the run -- a checkpoint, the
                summaries, an export -- (a full disk): one line naming what failed and the
                newest good checkpoint.
            CheckpointError: if writing a checkpoint in the background failed otherwise.
            Preempted: after SIGTERM or SIGINT, once the checkpoint is saved.
        """
        self._require("trainer")
        self._check_target(steps, epochs)
        self._record_resume(steps, epochs)
        self.state.target_step = steps if steps is not None else self._target_for(epochs)
        self.state.target_epoch = epochs
        with self._training():
            self._train_until(steps, epochs)
            self._finish_training(checkpoint_at_completion)

    def train_and_evaluate(
        self, train_steps: int, eval_steps: int = -1, eval_interval: int | None = None
    ) -> dict[str, Any] | None:
        """Trains to `train_steps`, evaluating every `eval_interval` steps and at the end.

        Evaluations happen exactly at multiples of `eval_interval` and once at the end. A run
        restarted after it finished runs its final evaluation if it had not run yet, and
        otherwise returns that evaluation's logs as the checkpoint kept them, without
        evaluating again (Orbit returns None). Returns when the checkpoints it saved are
        committed (see `train`).

        Returns:
            The logs of the last evaluation (restored from the checkpoint: only the values a
            checkpoint holds, see `cadence.core.logs.plain_logs`), or None if there are none
            (after a preemption; a checkpoint of an older cadence did not keep them).

        Raises:
            ValueError: without both a trainer and an evaluator, or on a bad interval.
            StorageError: if the machine fails a write of the run (see `train`).
            CheckpointError: if writing a checkpoint in the background failed otherwise.
            Preempted: after SIGTERM or SIGINT, once the checkpoint is saved.
        """
        self._require("trainer")
        self._require("evaluator")
        self._check_target(train_steps, None)
        check_eval_steps(eval_steps)
        interval = Interval(check_interval("eval_interval", eval_interval))
        self._record_resume(train_steps, None)
        self.state.target_step = train_steps
        output = None
        with self._training():
            current = self._global_step()
            while current < train_steps and not self._stopping():
                target = min(train_steps, interval.next_boundary(current) or train_steps)
                jumped = self._clock.jumped
                # A checkpoint due at the evaluation's step is saved after the evaluation, so
                # that a restarted run knows the evaluation happened.
                self._train_until(target, None, defer_save_at=target)
                current = self._global_step()
                if self._stopping() or current >= train_steps:
                    break
                if current != target and self._clock.jumped != jumped:
                    continue  # a heal took the step past it: the live groups evaluated there
                output = self.evaluate(eval_steps)
                if self._checkpoints.due(current):
                    self._checkpoints.save()
            preempted = self._preemption.agree(self._clock.agree)
            last = self._evaluations
            if not preempted and last.last_step != current:
                output = self.evaluate(eval_steps)
            elif not preempted and output is None and last.last_logs is not None:
                output = copy.deepcopy(last.last_logs)  # a restarted, finished run's
            # Saved after the final evaluation, so that a restarted run knows it happened.
            self._finish_training(True)
        return output

    def _check_target(self, steps: int | None, epochs: int | None) -> None:
        if steps is None and epochs is None:
            raise ValueError("Pass the global step to train to (`steps`) or a number of "
                             "`epochs`.")
        check_count("steps", steps)
        check_count("epochs", epochs)
        if epochs is not None and self.progress is None:
            raise TypeError(
                f"train(epochs=...) needs a trainer that counts epochs (got "
                f"{type(self.trainer).__name__}); subclass cadence.StandardTrainer, or pass "
                "`steps`."
            )

    def _record_resume(self, steps: int | None, epochs: int | None) -> None:
        """A run that continues from the checkpoint restored when the Controller was built
        says so once in its directory (`RunDirectory.record_resume`: ``cadence plot`` marks
        it) -- not a finished run run again (its target of `steps` or `epochs` reached)."""
        restored, self._resumed_from = self._resumed_from, None
        run_dir = self.state.run_dir
        step = self._global_step()
        if (restored is not None and isinstance(run_dir, RunDirectory) and step > 0
                and not self._reached(steps, epochs)):
            run_dir.record_resume(step, restored)

    def _target_for(self, epochs: int | None) -> int | None:
        """The global step at which `epochs` epochs will be completed, when the trainer knows."""
        if epochs is None or self._clocked is None:
            return None
        remaining = self._clock.steps_to_epochs(epochs)
        return None if remaining is None else self._global_step() + remaining

    def _reached(self, steps: int | None, epochs: int | None) -> bool:
        if steps is not None and self._global_step() >= steps:
            return True
        progress = self.progress
        return epochs is not None and progress is not None and progress.epochs_completed >= epochs

    def _session(self) -> contextlib.AbstractContextManager[None]:
        """Wraps each entry point: when the outermost one returns, the summary writers the
        Controller opened are closed, with the exception it raised if any (MLflow's run
        status; a later call opens them again), and injected ones are flushed
        (`RunSummaries.session`)."""
        return self._summaries.session()

    @contextlib.contextmanager
    def _training(self) -> Iterator[None]:
        with self._session():
            self._clock.clear_stop()
            self._sync_state()
            self.callbacks.fire("on_train_begin", self.state)
            try:
                self._preemption = self._new_preemption(self.handle_signals)
                with self._preemption.watch(self.state):
                    yield
            except BaseException as error:
                self.state.error = error  # on_train_end's writers report it
                self._checkpoints.wait(quiet=True, failing=True)  # keep the error
                self._checkpoints.name_newest(error)  # a full disk: where the run resumes
                raise
            finally:
                self.callbacks.fire_teardown("on_train_end", self.state)
                self.state.error = None
                self.summary_manager.flush()

    def _finish_training(self, save: bool) -> None:
        checkpoints = self._checkpoints
        # a signal to any rank preempts all: all save the same step
        self._preemption.agree(self._clock.agree)
        if checkpoints.manager is not None:
            def save_now() -> str | None:
                path = checkpoints.weights if checkpoints.saved_now() else checkpoints.save()
                checkpoints.wait()
                return path

            self._preemption.finish(save_now)
        else:
            self._preemption.finish(lambda: None)
        if save and checkpoints.manager is not None and not checkpoints.saved_now():
            checkpoints.save()
        checkpoints.wait()

    def _train_until(self, steps: int | None, epochs: int | None,
                     defer_save_at: int | None = None) -> None:
        target = steps if steps is not None else sys.maxsize
        while not self._reached(steps, epochs) and not self._stopping():
            current = self._global_step()
            steps_per_loop = self.steps_per_loop
            assert steps_per_loop is not None
            num_steps = min(steps_per_loop, steps_until_boundary(
                current, target, self._checkpoints.interval))
            to_epoch_end = (None if self._clocked is None
                            else self._clocked.max_steps_to_epoch_end() if epochs is not None
                            else self._clock.steps_to_epoch_end())
            if to_epoch_end is not None:
                num_steps = min(num_steps, to_epoch_end)
            progress = self.progress
            epochs_before = progress.epochs_completed if progress is not None else 0
            restores = self._checkpoints.restores
            self._train_n_steps(num_steps)
            after = self._global_step()
            if self._checkpoints.restores != restores:  # a callback restored one (recovery)
                logger.warning("A checkpoint of step %d was restored during the loop: training "
                               "again from there.", after)
                continue
            epochs_after = progress.epochs_completed if progress is not None else 0
            if after == current and epochs_after == epochs_before and not (
                    self.state.stop_requested):
                raise RuntimeError(
                    f"trainer.train({num_steps}) did not advance the global step (still "
                    f"{after}), so training would never reach its target. Make train() count "
                    "its steps, e.g. by subclassing cadence.StandardTrainer."
                )
            if self._checkpoints.due(after) and after != defer_save_at:
                self._checkpoints.save()
            # Under torchrun a stop requested on any rank -- by a callback after the loop, say
            # -- is every rank's, so that all take the next loop or none does; so is a signal.
            if self._clock.agree_to_stop():
                self._preemption.agree(self._clock.agree)

    def _stopping(self) -> bool:
        """Whether training stops before the next loop: across ranks, what the ranks agreed
        at the last agreement -- a signal that arrives after it on one rank must not end that
        rank's training alone; the next loop's agreement takes it (`RunClock.stopping`)."""
        return self._clock.stopping

    def _new_preemption(self, enabled: bool) -> Preemption:
        """The signal watch of a run: a signal is recorded in the run's timeline too."""
        return Preemption(enabled, on_signal=self.record.timeline.signal
                          if self.record is not None else None, slurm=self.slurm)

    def _record_if(self, step: int) -> bool:
        return self.summary_interval is None or step % self.summary_interval == 0

    def _train_n_steps(self, num_steps: int) -> None:
        assert self.trainer is not None
        before = self._global_step()
        self.callbacks.fire("on_loop_begin", self.state)
        view = self.state.trainer
        waited = view.data_wait_s if view is not None else 0.0  # host seconds: no sync
        jumped = self._clock.jumped
        start = time.perf_counter()
        # A clocked trainer says which method is its loop (its own `train` where a subclass
        # overrides it, else `train_steps`); any other trainer's loop is its `train`
        run = (self._clocked.inner_loop if self._clocked is not None
               else cast(Trainable, self.trainer).train)
        with self.summary_manager.as_default(record_if=self._record_if):
            output = run(num_steps)
        output = output if output is not None else {}
        for action in self.train_actions:
            action(output)
        # the one host-device synchronization of the loop
        logs = summary_logs(to_host(output), f"{type(self.trainer).__name__}.train()",
                            self._said)
        elapsed = time.perf_counter() - start
        after = self._global_step()
        jump = self._clock.jumped - jumped  # a heal's: not run here, and the loop shortened
        if jump:  # the boundaries the jump passed were trained, and saved, by the live groups
            self._checkpoints.jumped_to(after)
        done = after - before - jump
        if done != num_steps and not jump and not self.state.stop_requested:
            logger.warning(
                "trainer.train(%d) advanced the global step by %d. A step may do several "
                "updates, but the global step must count steps.", num_steps, done,
            )
        if done > 0:
            self._checkpoints.weights = None
        rates: dict[str, float] = {"steps_per_second": max(done, 0) / elapsed if elapsed else 0.0}
        examples = self._clocked.examples_per_step if self._clocked is not None else None
        if examples:  # every data shard's: tensor- and pipeline-parallel peers share a batch
            rates["examples_per_second"] = rates["steps_per_second"] * examples * data_size()
        if self._clocked is not None:  # tokens/s, TFLOPS, MFU, where the trainer knows them
            rates.update(self._clocked.loop_rates(rates["steps_per_second"]))
        if self.log_loops and loop_logger.isEnabledFor(logging.INFO):  # only when shown
            rate_text = " | ".join(
                f"{k.replace('_per_second', '/sec')}: {v:{'.1f' if v >= 100 else '.3g'}}"
                for k, v in rates.items())
            loop_logger.info("train | step: %d | %s | %s", after, rate_text, format_logs(logs))
        logs = {**logs, **rates}
        record = self.record
        if record is not None:  # this rank's loop, and on rank 0 the run's goodput so far
            waited = (view.data_wait_s if view is not None else 0.0) - waited
            record.timeline.loop_end(after, max(done, 0), elapsed, data_wait_s=max(waited, 0.0))
            logs.update(record.loop_logs())
        self.state.put_metrics(logs)
        self._clock.end_pending_epoch()  # an epoch that ended with the loop: sees these logs
        self.summary_manager.write_summaries(logs, step=after)
        self.summary_manager.flush()
        self._sync_state()
        self.callbacks.fire("on_loop_end", self.state, logs)

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, steps: int = -1, *, weights: str | None = None) -> dict[str, Any]:
        """Runs one evaluation of `steps` steps (-1: until the data is exhausted).

        The evaluation is recorded with the step and the checkpoint whose weights it used
        (None when the weights in memory were not checkpointed): in the log line, in the
        ``metrics.jsonl`` record, and in ``state.extra["last_eval"]``.

        Args:
            steps: evaluation steps, or -1.
            weights: where the weights in memory came from, when the caller loaded them itself
                (a checkpoint or an export it chose): what the evaluation records. By
                default, the checkpoint this Controller restored or saved last.

        Returns:
            The evaluator's logs on the host, plus ``steps_per_second`` when `steps` > 0.

        Raises:
            ValueError: without an evaluator, or if `steps` is neither positive nor -1.
        """
        self._require("evaluator")
        check_eval_steps(steps)
        with self._session():
            return self._evaluate(steps, weights)

    def _evaluate(self, steps: int, weights: str | None = None) -> dict[str, Any]:
        self._sync_state()
        assert self.evaluator is not None
        step, record = self._global_step(), self.record
        if record is not None:
            record.timeline.eval_begin(step)
        logs = self._evaluations.run(self.evaluator, steps, step,
                                     weights or self._checkpoints.weights,
                                     self.eval_summary_manager, self.eval_actions)
        if record is not None:
            record.timeline.eval_end(step)
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
        manager = self._checkpoints.require("evaluate_continuously()")
        if timeout_fn is not None and not callable(timeout_fn):
            raise TypeError(f"`timeout_fn` (got {type(timeout_fn).__name__}) must be a function "
                            "with no arguments that returns True to stop, or None.")

        def restore_and_evaluate(path: str) -> dict[str, Any]:
            self.restore_checkpoint(path)
            return self._evaluate(steps)

        with self._session():
            return evaluate_new_checkpoints(lambda: manager.checkpoints, restore_and_evaluate,
                                            timeout, timeout_fn, stop_at_step, poll_interval)

    # ------------------------------------------------------------------ helpers

    def _require(self, role: str) -> None:
        if getattr(self, role) is None:
            raise ValueError(f"This Controller has no {role}: pass Controller({role}=...).")

    def state_dict(self) -> dict[str, Any]:
        """The Controller's own state: which step was last evaluated, and that evaluation's
        logs (`cadence.core.logs.plain_logs`), which a finished run returns when restarted."""
        return self._evaluations.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._evaluations.load_state_dict(state_dict)

    def close(self) -> None:
        """Closes the summary writers the Controller opened and flushes injected ones. Every
        entry point does it when it returns; call it after using the writers directly."""
        self._summaries.release()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
