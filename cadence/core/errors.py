"""Exceptions that callers of cadence are expected to catch by type."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint could not be read: missing, incomplete, corrupt or not written by cadence."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A checkpoint does not fit the objects it is loaded into.

    The message lists every difference (missing keys, unexpected keys, shape mismatches) so that one
    read of the error is enough to fix the model definition or pick the right checkpoint.
    """


class CheckpointIncompatibleError(CheckpointError):
    """A sound checkpoint that this job cannot continue from: written by another number of
    processes, with a data position or a rank-local state that cannot be dealt to this one; or
    written by an earlier cadence in a format this one does not read (``torch.save``'s
    ``state.pt``).

    Not damage: `CheckpointManager.restore_or_initialize` stops with it and leaves the checkpoint
    where and as it was, instead of setting it aside and resuming an older one (a refusal is
    never a rollback). The message says what to run instead (and names both world sizes for
    the first kind).
    """


class Preempted(SystemExit):
    """Raised after training was stopped by SIGTERM or SIGINT (or a Slurm job's stop signal,
    SIGUSR1 by default) and a checkpoint was saved.

    It is a `SystemExit`, so an unhandled one ends the program quietly with exit code
    ``128 + signal number`` (143 for SIGTERM, 130 for SIGINT, 138 for SIGUSR1), which schedulers
    read as "requeue". Running the same program again resumes from the checkpoint.

    Attributes:
        signum: the signal.
        checkpoint: the checkpoint saved, or None without a checkpoint manager.
        requeued: whether the Slurm job was requeued (`cadence.core.slurm.requeue`): Slurm runs
            the program again by itself.
    """

    def __init__(self, signum: int, checkpoint: str | None, *, requeued: bool = False) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.checkpoint = checkpoint
        self.requeued = requeued


class ConfigError(ValueError):
    """A configuration is invalid: an unknown key, a value of the wrong type, a value out of range,
    or an experiment that is not registered.

    The message names the offending key path and the source it came from (a file, an override)
    and lists the valid choices, so that one read is enough to fix the command line or the file.
    """


class HookError(Exception):
    """A hook the user wrote returned what cadence cannot use: a ``build_losses`` that returns a
    loss per example, a ``build_metrics`` that returns a number, a ``build_inputs`` that returns
    None or data of no batch, a runner's ``train_loop_end`` that returns a list.

    Each hook is checked where cadence first gets its result (see `cadence.core.hook_checks`).
    The message is one line naming the hook, what it returned and what it must return; the
    ``cadence`` command prints it as ``cadence: error: ...`` (exit status 2). Raised as a
    `HookTypeError` (a wrong kind: also a `TypeError`) or a `HookValueError` (a value cadence
    cannot use: also a `ValueError`).
    """


class HookTypeError(HookError, TypeError):
    """A hook returned the wrong kind of thing (a number where a mapping of metrics goes)."""


class HookValueError(HookError, ValueError):
    """A hook returned the right kind of thing with a value cadence cannot use (a loss of shape
    ``(8,)``, validation data of no batch)."""


class NotRegisteredError(ConfigError, KeyError):
    """A registry has no entry of that name (an experiment) or type (a task config).

    It is a `ConfigError` and, as TF Model Garden's registries raise, a `KeyError`. The message
    lists what is registered and says how to register.
    """

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class DivergenceError(FloatingPointError, RuntimeError):
    """The training loss diverged (NaN, infinity, or above the configured upper bound) and the
    recovery policy says to stop.

    A `FloatingPointError` and, as TF Model Garden raises for a NaN loss, a `RuntimeError`.
    """


class StopTraining(Exception):
    """Raise from a training step or any callback hook to end training cleanly: the running
    epoch's end hooks still run, the final checkpoint is saved, and the train call returns
    (tensorpack's ``StopTraining``; every front-end honours it)."""


class StepDiscarded(Exception):
    """Raised by a training step whose update was not applied and must not count: a replica
    group died during it, and no group committed it (`cadence.engine.fault_tolerance`). The
    runner does not count the step and goes on with the next one."""


class MissingMetricError(KeyError):
    """A callback (early stopping, a best-weights saver, ...) monitors a metric the run does not
    produce. The message lists the metrics there are."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class JobFailure(RuntimeError):
    """The job cannot go on because of the machines, not of the code or the config: another
    rank died or is stuck, or the ranks could not meet. The message says which and what to do;
    the ``cadence`` command prints it as one line (exit status 1)."""


class StorageError(JobFailure):
    """Writing the run's files failed for a reason of the machine -- a full disk or quota, a
    read-only or failing file system, a denied write -- whichever writer met it: a checkpoint
    (synchronous or in the background, sharded too), a best export, the summaries, the config,
    the lock. Every writer's own error type (an `OSError`, safetensors' ``SafetensorError``,
    ``torch.distributed.checkpoint``'s ``CheckpointException``, TensorBoard's and MLflow's
    ``OSError``) becomes this one (`cadence.core.storage`).

    The message is one line: what failed, why, the newest good checkpoint (when the run's
    checkpoints are known) and the fix. What was committed before is kept and nothing
    half-written is listed, so the same command resumes once the cause is gone. The ``cadence``
    command prints it as one line, exit status 1 (the environment's, not the user's mistake).

    Attributes:
        what: what failed (``"Saving checkpoint ckpt-20"``).
        reason: the machine's error (``"No space left on device"``, with the file when known).
        fix: what to do about it (``"free some space"``).
        errno: the error's number (``errno.ENOSPC``).
        newest: the sentence about the checkpoint a run resumes from, once known (None: not
            known where the error was raised).
    """

    def __init__(self, what: str, reason: str, fix: str, errno: int | None = None,
                 newest: str | None = None) -> None:
        super().__init__(what, reason, fix)
        self.what, self.reason, self.fix, self.errno = what, reason, fix, errno
        self.newest = newest

    def __str__(self) -> str:
        if self.newest is None:
            tail = (f"{self.fix[:1].upper()}{self.fix[1:]}, then run the same command again: "
                    "what was committed before is kept.")
        else:
            tail = f"{self.newest}: {self.fix}, then run the same command again."
        return f"{self.what} failed: {self.reason}. {tail}"
