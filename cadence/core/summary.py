"""`SummaryManager`: routes a run's logs to its metric writers.

It is Orbit's summary manager: one per directory, and nested logs written one nesting level per
group -- a sub-directory for TensorBoard and JSON lines -- so that TensorBoard shows
``{"train": {...}, "eval": {...}}`` as two runs on shared axes. *Where* the values go is the
writers' business (`cadence.core.protocols.MetricWriter`): TensorBoard event files and a
``metrics.jsonl`` by default; ``csv``, ``mlflow`` and ``wandb`` by name (`WRITERS`), any other
backend as a factory. Backends are imported by name when an active manager is built
(TensorBoard's import takes ~0.1 s, MLflow's seconds: never on the first write inside a training
loop), so nothing here imports them, or torch. MLflow and W&B record a whole run in one place:
the managers of a run's train and eval directories share one MLflow or W&B run, kept in the
run's root (``run_dir``), and name values by the directory below it (``train/loss``,
``eval/accuracy``). ``docs/writers.md`` says how to choose them.

In a distributed run only rank 0 writes.

Summaries can also be written from inside a step with `scalar`; the tag is prefixed by the
current name scope (`Module.name_scope`). Values are kept as they are -- tensors stay on the
device -- and reach the host when the manager is flushed, at the end of the loop.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cadence.core.logs import Logs, flatten
from cadence.core.protocols import (
    HParamsWriter,
    MetricWriter,
    OutcomeWriter,
    StepReplacingWriter,
    SummaryManagerLike,
)
from cadence.core.rank import process_rank
from cadence.core.scope import scoped
from cadence.core.storage import writing

logger = logging.getLogger("cadence")

WRITERS: dict[str, str] = {
    "tensorboard": "cadence.writers.tensorboard:TensorBoardWriter",
    "jsonl": "cadence.writers.jsonl:JSONLWriter",
    "csv": "cadence.writers.csv:CSVWriter",
    "mlflow": "cadence.writers.mlflow:MLflowWriter",
    "wandb": "cadence.writers.wandb:WandbWriter",
}
"""The metric writers a `SummaryManager` knows by name, as ``module:class``. ``mlflow`` and
``wandb`` need their library (``pip install 'cadence[mlflow]'``, ``'cadence[wandb]'``)."""
DEFAULT_WRITERS = ("tensorboard", "jsonl")

WriterSpec = str | Callable[[Path], MetricWriter]
"""A writer's name in `WRITERS`, or a function that builds a writer for a directory (e.g.
``functools.partial(MLflowWriter, experiment_name="digits")``)."""


def to_host(value: Any) -> Any:
    """Returns `value` with every tensor or array leaf converted to Python numbers or lists:
    logs as writers and callbacks take them.

    For a CUDA tensor this synchronizes with the device: the Controller calls it once per loop,
    not per step.
    """
    if isinstance(value, Mapping):
        return {str(k): to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_host(v) for v in value]
    return _host_leaf(value)


def _host_leaf(value: Any) -> Any:
    detach = getattr(value, "detach", None)
    if detach is not None:  # a torch.Tensor: detach first so autograd history is dropped
        value = detach()
    tolist = getattr(value, "tolist", None)
    if tolist is not None:  # torch.Tensor, numpy.ndarray, numpy scalar
        return tolist()
    return value


def iter_groups(logs: Logs, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict]]:
    """Yields ``(path, leaves)`` for each level of nested logs, leaves being the non-mapping items,
    on the host (`to_host`'s conversion, in the same walk: logs already on the host pass as they
    are).

    Orbit writes each nesting level to its own summary sub-directory; this is that split.
    """
    leaves = {str(k): to_host(v) for k, v in logs.items() if not isinstance(v, Mapping)}
    if leaves or not path:
        yield path, leaves
    for key, value in logs.items():
        if isinstance(value, Mapping):
            yield from iter_groups(value, (*path, str(key)))


def check_writers(specs: Sequence[WriterSpec]) -> tuple[WriterSpec, ...]:
    """Returns `specs` if each is a name in `WRITERS` or callable; imports nothing.

    Raises:
        ValueError: for a name that is not in `WRITERS` (the message lists them).
        TypeError: for anything that is neither a name nor callable, or a lone string.
    """
    if isinstance(specs, str):
        raise TypeError(f"`writers` (got {specs!r}) must be a list of writers, e.g. "
                        f"[{specs!r}].")
    for spec in specs:
        if callable(spec):
            continue
        if not isinstance(spec, str):
            raise TypeError(f"A writer (got {type(spec).__name__}) must be a name "
                            f"({', '.join(WRITERS)}) or a function of the directory.")
        if spec not in WRITERS:
            raise ValueError(f"Unknown metric writer {spec!r}; known: {', '.join(WRITERS)}. "
                             "Pass a function of the directory that returns a writer for "
                             "another backend.")
    return tuple(specs)


def writer_factory(spec: WriterSpec, run_dir: str | os.PathLike[str] | None = None
                   ) -> Callable[[Path], MetricWriter]:
    """The function that builds the writer `spec` names for a directory (importing its module).

    Args:
        spec: a name in `WRITERS`, or a function of the directory (returned as it is).
        run_dir: the run's root, given to a named writer of the whole run (``run_scoped``).

    Raises:
        ValueError: for a name that is not in `WRITERS`.
        TypeError: for anything that is neither a name nor callable.
    """
    check_writers([spec])
    if callable(spec):
        return spec
    module, _, name = WRITERS[spec].partition(":")
    factory: Callable[..., MetricWriter] = getattr(importlib.import_module(module), name)
    if run_dir is not None and getattr(factory, "run_scoped", False):
        return functools.partial(factory, run_dir=Path(run_dir))
    return factory


def import_writer(writers: Sequence[WriterSpec] = DEFAULT_WRITERS) -> None:
    """Imports the modules of `writers` now (TensorBoard's import takes about 0.1 s, once per
    process), so that the first summary written inside a training loop does not pay for it.

    Raises:
        ValueError, TypeError: as `check_writers`.
    """
    for spec in check_writers(writers):
        writer_factory(spec)


def shared_run_dir(summary_dir: str | os.PathLike[str] | None,
                   eval_summary_dir: str | os.PathLike[str] | None) -> Path | None:
    """The root of a run whose train and eval summaries go to these directories: where writers
    of the whole run (MLflow, W&B) keep it.

    It is the train directory when evaluations write there or below it, and the parent of both
    when they are siblings (``<run>/train``, ``<run>/eval``); None for unrelated directories
    (each manager then keeps its own run).

    >>> str(shared_run_dir("runs/a/train", "runs/a/eval")), str(shared_run_dir("runs/a", None))
    ('runs/a', 'runs/a')
    """
    if summary_dir is None or eval_summary_dir is None:
        given = summary_dir if summary_dir is not None else eval_summary_dir
        return Path(given) if given is not None else None
    train, evaluation = Path(summary_dir), Path(eval_summary_dir)
    train_abs, eval_abs = Path(os.path.abspath(train)), Path(os.path.abspath(evaluation))
    if eval_abs == train_abs or train_abs in eval_abs.parents:
        return train
    if train_abs.parent == eval_abs.parent:
        return train.parent
    return None


class SummaryManager:
    """Writes logs as summaries under `summary_dir`, through its metric writers.

    Args:
        summary_dir: where to write; None makes every method a no-op.
        global_step: returns the step to write at when `write_summaries` gets none.
        writers: the metric writers, by name (see `WRITERS`) or as functions of the directory.
        enabled: whether this process writes; defaults to "rank 0 only".
        run_dir: the run's root, for the writers of a whole run (MLflow, W&B): they keep the
            run there and name values by the path of `summary_dir` below it. Defaults to
            `summary_dir`.
        replace_steps: for an evaluation directory: logs written at a step replace the records
            that earlier writers (an earlier evaluation of the same checkpoint, in this process
            or another) left at that step, in the writers that can (`StepReplacingWriter`:
            JSON lines, CSV and TensorBoard rewrite their files of that directory without
            them), so that evaluating a step again does not repeat it. MLflow and W&B keep
            both values; MLflow's latest value of the metric is the new one. Never for a
            training directory: its files are large, and a resumed run's repeats are the
            readers' to handle.
        writes: None: a manager that is `enabled` writes. A function: whether it writes the
            logs it is given now -- False when another job writes the same logs (replica
            groups evaluate alike: the first of the live groups writes the evaluations).

    Raises:
        ValueError: for an unknown writer name.
        TypeError: for a writer that is neither a name nor callable.
        ImportError: for a writer whose library is not installed (the message says what to
            install).
    """

    def __init__(
        self,
        summary_dir: str | os.PathLike[str] | None,
        global_step: Callable[[], int] | None = None,
        *,
        writers: Sequence[WriterSpec] = DEFAULT_WRITERS,
        enabled: bool | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        replace_steps: bool = False,
        writes: Callable[[], bool] | None = None,
    ) -> None:
        self.summary_dir = Path(summary_dir) if summary_dir is not None else None
        self.writes = writes
        self.run_dir = Path(run_dir) if run_dir is not None else self.summary_dir
        self.replace_steps = replace_steps
        self._global_step = global_step
        self.enabled = (process_rank() == 0) if enabled is None else enabled
        self._specs = check_writers(writers)  # on every rank, so a typo fails everywhere
        self._factories: list[Callable[[Path], MetricWriter]] = []
        self._writers: list[MetricWriter] | None = None
        self._pending: list[tuple[str, Any, int]] = []
        if self.active:  # built now, so that imports happen here, not inside the first loop
            self._factories = [writer_factory(spec, self.run_dir) for spec in self._specs]
            self._writers = self.writers

    @property
    def active(self) -> bool:
        """Whether writes go anywhere."""
        return self.enabled and self.summary_dir is not None

    @property
    def writers(self) -> list[MetricWriter]:
        """The writers (built again on the first write after `close`); none when inactive. A
        writer creates no file until something is written."""
        if not self.active:
            return []
        if self._writers is None:
            assert self.summary_dir is not None
            self._writers = [factory(self.summary_dir) for factory in self._factories]
        return self._writers

    def _step(self, step: int | None) -> int:
        if step is not None:
            return step
        if self._global_step is None:
            raise ValueError(
                "write_summaries() got no `step` and the SummaryManager has no `global_step`. "
                "Pass step=... or build the manager with global_step=lambda: trainer.global_step."
            )
        return self._global_step()

    def write_summaries(
        self, logs: Logs, step: int | None = None, *, extra: dict[str, Any] | None = None
    ) -> None:
        """Writes `logs` at `step`; each nested mapping is a group (a sub-directory) of its key.
        With `replace_steps`, they replace the records earlier writers left at `step`.

        Args:
            logs: nested mapping of names to tensors, arrays or numbers.
            step: the x-axis value; defaults to the manager's `global_step`.
            extra: fields that describe the top-level record rather than measure anything
                (e.g. which checkpoint an evaluation ran on): JSON lines keep them, TensorBoard
                does not show them.
        """
        if not self.active or (self.writes is not None and not self.writes()):
            return
        step = self._step(step)
        with self._writing():
            writers = self.writers
            for group, leaves in iter_groups(logs):
                for writer in writers:
                    if self.replace_steps and isinstance(writer, StepReplacingWriter):
                        writer.forget_step(step, group)
                    writer.write(step, leaves, group, extra if not group else None)

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        """The writers' failures of the machine (a full disk), whichever writer met them, as
        one `cadence.StorageError` naming this directory (`cadence.core.storage`)."""
        return writing(f"Writing the summaries to {str(self.summary_dir)!r}")

    def write_hparams(self, params: Mapping[str, Any]) -> None:
        """Records the run's hyper-parameters with every writer that can (`HParamsWriter`:
        MLflow's params, W&B's config); the others ignore them.

        Args:
            params: a (possibly nested) mapping; nested keys are joined with dots.
        """
        if not self.active:
            return
        flat = flatten(params, sep=".")
        with self._writing():
            for writer in self.writers:
                if isinstance(writer, HParamsWriter):
                    writer.write_hparams(flat)

    def add_pending(self, tag: str, value: Any, step: int) -> None:
        """Queues one in-step summary; it is converted and written at the next `flush`."""
        detach = getattr(value, "detach", None)
        self._pending.append((tag, detach() if detach is not None else value, step))

    def flush(self) -> None:
        """Writes queued in-step summaries, then flushes every writer."""
        with self._writing():
            if self._pending and self.active:
                by_step: dict[int, dict[str, Any]] = {}
                for tag, value, step in self._pending:
                    by_step.setdefault(step, {})[tag] = to_host(value)
                self._pending.clear()
                for step, values in sorted(by_step.items()):
                    for writer in self.writers:
                        writer.write(step, values, (), None)
            self._pending.clear()
            for writer in self._writers or ():
                writer.flush()

    def close(self, error: BaseException | None = None) -> None:
        """Flushes and closes every writer; a later write opens them again.

        Args:
            error: the exception the run ends with, None when it completed: the writers that
                record outcomes (`OutcomeWriter`) get it, e.g. MLflow's run status is
                ``FAILED`` after a crash or a divergence, ``KILLED`` after `cadence.Preempted`.
        """
        writers, failure = self._writers or [], None
        try:
            with self._writing():
                try:
                    self.flush()
                finally:  # every writer is closed (its file released), also after a failure
                    for writer in writers:
                        try:
                            if isinstance(writer, OutcomeWriter):
                                writer.set_outcome(error)
                            writer.close()
                        except Exception as failed:
                            failure = failure or failed
                if failure is not None:
                    raise failure
        finally:
            self._writers = None

    @contextlib.contextmanager
    def as_default(self, record_if: Callable[[int], bool] | None = None) -> Iterator[None]:
        """Makes this manager the target of `scalar` calls inside the block.

        Args:
            record_if: called with the step of each `scalar` call; False drops the summary.
        """
        token = _ACTIVE.set((self, record_if))
        try:
            yield
        finally:
            _ACTIVE.reset(token)


def close_summaries(error: BaseException | None, *, close: Iterable[SummaryManager] = (),
                    flush: Iterable[SummaryManagerLike] = ()) -> None:
    """Ends a use of summary managers with how the run ended: this is the one place where the
    summary writers of a run are closed with its outcome.

    The managers the caller built (`close`) are closed with `error` (`SummaryManager.close`),
    so that the writers that record outcomes get it: MLflow's run status, W&B's exit code,
    TensorBoard's session status. The managers it was given (`flush`) are its owner's to close:
    they are only flushed. A manager listed twice (the train and eval managers of one
    directory) is handled once, the first way it is listed. When the run ends with an error, a
    failure to close or flush (the full disk that ended the run) is logged, not raised: the
    run's own error is the one to report.

    Args:
        error: the exception the run ends with; None when it completed.
        close: the managers to close.
        flush: the managers to flush.
    """
    done: set[int] = set()
    for manager in close:
        if id(manager) not in done:
            done.add(id(manager))
            with _failing_already(error):
                manager.close(error)
    for injected in flush:
        if id(injected) not in done:
            done.add(id(injected))
            with _failing_already(error):
                injected.flush()


@contextlib.contextmanager
def _failing_already(error: BaseException | None) -> Iterator[None]:
    """A failure to close summaries while the run ends with `error` (the full disk that ended
    it) is logged, not raised: the run's own error is the one to report."""
    try:
        yield
    except Exception as failed:
        if error is None:
            raise
        logger.warning("Closing the summaries failed too: %s", failed)


@contextlib.contextmanager
def closing_summaries(*, close: Iterable[SummaryManager] = (),
                      flush: Iterable[SummaryManagerLike] = (),
                      error: BaseException | None = None) -> Iterator[None]:
    """`close_summaries` when the block ends, with the exception the block raised.

    Args:
        close, flush: as `close_summaries`.
        error: the outcome when the block raises nothing: an exception already on its way
            when the block runs (an ``__exit__``'s), None for a run that completed.
    """
    ended_with = error
    try:
        yield
    except BaseException as raised:
        ended_with = raised
        raise
    finally:
        close_summaries(ended_with, close=close, flush=flush)
        del ended_with  # its traceback holds the frames of the run (the trainer's)


class RunSummaries:
    """The train and evaluation summary managers of a run, and who closes them.

    Managers it builds from directories are its own: `release` closes them (a later write opens
    the files again). Injected ones are the caller's: `release` only flushes them.

    Args:
        summary_dir, eval_summary_dir: directories to build managers for (the eval one defaults
            to the train one).
        summary_manager, eval_summary_manager: managers to use instead (the eval one defaults to
            the train one when no eval directory is given).
        global_step: the default step of the managers built here.
        writers: the writers of the managers built here; writers of a whole run (MLflow, W&B)
            keep it in `shared_run_dir`. The eval manager built for its own directory
            replaces the records of a step evaluated again (``replace_steps``).
    """

    def __init__(self, summary_dir: str | None, eval_summary_dir: str | None,
                 summary_manager: SummaryManagerLike | None,
                 eval_summary_manager: SummaryManagerLike | None,
                 global_step: Callable[[], int],
                 writers: Sequence[WriterSpec] = DEFAULT_WRITERS) -> None:
        self._owned: list[SummaryManager] = []
        run_dir = shared_run_dir(summary_dir, eval_summary_dir)
        if summary_manager is None:
            summary_manager = SummaryManager(summary_dir, global_step, writers=writers,
                                             run_dir=run_dir)
            self._owned.append(summary_manager)
        if eval_summary_manager is None:
            if eval_summary_dir is None or eval_summary_dir == summary_dir:
                eval_summary_manager = summary_manager
            else:
                eval_summary_manager = SummaryManager(eval_summary_dir, global_step,
                                                      writers=writers, run_dir=run_dir,
                                                      replace_steps=True)
                self._owned.append(eval_summary_manager)
        self.train: SummaryManagerLike = summary_manager
        self.eval: SummaryManagerLike = eval_summary_manager
        self._injected = [m for m in (self.train, self.eval)
                          if not any(m is owned for owned in self._owned)]
        self._depth = 0  # nesting of sessions (entry points): the outermost one releases

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Wraps a use of the managers (a Controller's entry point): when the outermost one
        ends, they are released with the exception it raised, if any (`closing_summaries`),
        so that the writers that record how a run ended get it (MLflow's run status, W&B's
        exit code)."""
        ending: contextlib.AbstractContextManager[None] = (
            closing_summaries(close=self._owned, flush=self._injected) if self._depth == 0
            else contextlib.nullcontext())
        self._depth += 1
        try:
            with ending:
                yield
        finally:
            self._depth -= 1

    def release(self, error: BaseException | None = None) -> None:
        """Closes the managers built here, with the exception the run ends with (`error`,
        None when it completed: see `close_summaries`), and flushes the injected ones."""
        close_summaries(error, close=self._owned, flush=self._injected)


_ACTIVE: contextvars.ContextVar[
    tuple[SummaryManager, Callable[[int], bool] | None] | None
] = contextvars.ContextVar("cadence_summary", default=None)


def scalar(name: str, value: Any, step: int | None = None) -> bool:
    """Writes a scalar summary from inside a step, tagged with the current name scope.

    Does nothing outside a Controller's loop (no default manager) or when the Controller's
    `summary_interval` says this step is not recorded. No host-device synchronization happens
    here: a tensor value is read when the loop ends.

    Args:
        name: the tag, prefixed by the current name scope.
        value: a number or a one-element tensor.
        step: the step to record at; defaults to the manager's global step.

    Returns:
        Whether the summary was recorded.
    """
    active = _ACTIVE.get()
    if active is None:
        return False
    manager, record_if = active
    if not manager.active:
        return False
    step = manager._step(step)
    if record_if is not None and not record_if(step):
        return False
    manager.add_pending(scoped(name), value, step)
    return True
