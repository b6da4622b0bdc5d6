"""`TensorBoardWriter`: TensorBoard event files, one per (sub-)directory of nested logs, and the
run's hyper-parameters in TensorBoard's HPARAMS tab.

Events are TensorBoard's own protos, written with its record writer
(``tensorboard.summary.writer.record_writer``) in the calling thread: one event per record of
the logs, with each scalar as a ``simple_value`` (the form of PyTorch's ``add_scalar``), rather
than one event per scalar. TensorBoard's ``EventFileWriter`` -- what its public
``tensorboard.summary.Writer`` and PyTorch's ``SummaryWriter`` write through -- is not used,
for three reasons found in TensorBoard 2.21:

- it numbers a process's files ``...<pid>.9``, ``...<pid>.10``, which TensorBoard reads in the
  wrong order when they were opened in the same second (a Controller reopens its files after
  each entry point): the curve goes 10, 20, 110, 120, 30, ..., and a metric's "last" value is
  not the last one written. Files here are numbered ``...<pid>.0009``, ``...<pid>.0010``;
- it imports TensorFlow when TensorFlow is installed (through ``tensorboard.compat.tf``);
- without TensorFlow, its file stub opens and closes the file for each event, and each flush
  waits for its thread: about twice the CPU per record of the writing here.

TensorBoard is imported with this module, which a `SummaryManager` imports when it is built
(before training), never on the first write inside a loop. Nothing here imports torch.

**Hyper-parameters** (`write_hparams`; the Task front-end writes the final config, flattened)
become a session of TensorBoard's hparams plugin -- the summary of its public ``hparams_pb`` --
in an event file of the run's root (`run_dir`, the parent of ``train/`` and ``eval/``). The
HPARAMS tab then lists the run with its config, and with the last value of each scalar of the
run's directories as its metrics (``train/training_loss``, ``eval/accuracy``: the final
metrics). `close` ends the session with the run's outcome (`set_outcome`): success, or failure
(a crash, a divergence); the session of a run stopped by a signal (`cadence.Preempted`) is left
open, as the run resumes (TensorBoard has no status for a stop). Values the plugin cannot hold
(lists, None) are shown as text, as MLflow shows params. No experiment summary is written:
TensorBoard would take one run's for every run under its ``--logdir``, hiding the
hyper-parameters that only other runs have; without one, it builds the table from all the
runs' sessions.

TensorBoard keeps the first session of a run that it reads, so a resumed run (a new process)
replaces the session file that an earlier process of the same run wrote (``*.hparams`` event
files in the run's root, which hold nothing else): the tab shows the latest config and outcome.

**A step evaluated again** (`forget_step`, in an evaluation directory) replaces its earlier
events: the event files that earlier writers left there are read with TensorBoard's own reader
and rewritten without that step (each through a temporary file and a rename). TensorBoard's own
way of dropping data, a ``SessionLog.START`` at a step, drops every later step too.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.plugins.hparams.summary_v2 import hparams_pb
from tensorboard.summary.writer.record_writer import RecordWriter

from cadence.core.files import close_all
from cadence.core.logs import is_scalar
from cadence.writers.shared_run import Outcome

HPARAMS_SUFFIX = ".hparams"
"""The end of the names of the event files that hold a run's hparams session."""
_FILE_NUMBER = itertools.count()
_EVENTS = "events.out.tfevents."


class _EventFile:
    """One event file, named as TensorBoard names them but with the process's files numbered
    in the order they were opened, written with TensorBoard's ``RecordWriter`` in the caller's
    thread."""

    def __init__(self, directory: Path, suffix: str = "") -> None:
        name = (f"{_EVENTS}{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.{next(_FILE_NUMBER):04d}{suffix}")
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / name
        self._records = RecordWriter(open(self.path, "wb"))  # noqa: SIM115
        self.add_event(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_event(self, event: Event) -> None:
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()


def _hparam_value(value: Any) -> bool | int | float | str:
    """`value` as the hparams plugin holds it: a flag, a number or text (lists, None)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _summary_steps(path: Path) -> list[tuple[int | None, bytes]]:
    """The records of an event file, read with TensorBoard's reader (imported here: it imports
    TensorFlow when installed), each with its step if it holds a summary (None if not)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    records = [(Event.FromString(record), record)
               for record in RawEventFileLoader(str(path)).Load()]
    return [(event.step if event.HasField("summary") else None, record)
            for event, record in records]


def _rewrite_without(path: Path, step: int) -> None:
    """Rewrites an event file without the summaries of `step`, atomically."""
    kept = [record for at, record in _summary_steps(path) if at != step]
    temporary = path.with_name(".rewritten-events.tmp")  # not an event file's name
    records = RecordWriter(open(temporary, "wb"))  # noqa: SIM115
    for record in kept:
        records.write(record)
    records.close()
    os.replace(temporary, path)


def _session_end(outcome: Outcome) -> Summary:
    """The hparams plugin's summary of the end of a session that completed or failed."""
    status = api_pb2.STATUS_SUCCESS if outcome.exit_code == 0 else api_pb2.STATUS_FAILURE
    content = plugin_data_pb2.HParamsPluginData(
        session_end_info=plugin_data_pb2.SessionEndInfo(status=status,
                                                        end_time_secs=time.time()))
    summary = Summary()
    summary.value.add(tag=metadata.SESSION_END_INFO_TAG, tensor=metadata.NULL_TENSOR,
                      metadata=metadata.create_summary_metadata(content))
    return summary


class TensorBoardWriter:
    """Writes scalars as TensorBoard summaries under `directory`; each nesting group of the logs
    goes to a sub-directory (TensorBoard shows them as runs on shared axes). Hyper-parameters
    go to the HPARAMS tab (see the module docstring).

    Args:
        directory: the root directory of the scalars; created on the first write.
        run_dir: the run's root, where the hparams session goes. Defaults to `directory`.
    """

    run_scoped = True
    """Built by name with the run's root (see `cadence.core.protocols.MetricWriter`): the
    hparams session goes there, the parent of the train and eval directories."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 run_dir: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory)
        self.run_dir = Path(run_dir) if run_dir is not None else self.directory
        self._files: dict[tuple[str, ...], _EventFile] = {}
        self._session: _EventFile | None = None
        self._outcome = Outcome()
        self._earlier: dict[tuple[str, ...], dict[Path, set[int | None]]] = {}

    def write(self, step: int, values: Mapping[str, Any], group: tuple[str, ...] = (),
              extra: Mapping[str, Any] | None = None) -> None:
        """Writes the scalar `values` at `step` as one event (other values and `extra` are not
        TensorBoard's to show)."""
        scalars = [Summary.Value(tag=tag, simple_value=float(value))
                   for tag, value in values.items() if is_scalar(value)]
        if not scalars:
            return
        events = self._files.get(group)
        if events is None:
            events = self._files[group] = _EventFile(self.directory.joinpath(*group))
        event = Event(wall_time=time.time(), step=int(step))
        event.summary.value.extend(scalars)
        events.add_event(event)

    def forget_step(self, step: int, group: tuple[str, ...] = ()) -> None:
        """Drops the events of `step` from the event files of `group`'s directory that earlier
        writers wrote, rewriting those that have some; this writer's own file stays
        (`cadence.core.protocols.StepReplacingWriter`). The files are read once per writer."""
        earlier = self._earlier.get(group)
        if earlier is None:
            own = self._files.get(group)
            earlier = self._earlier[group] = {
                path: {at for at, _ in _summary_steps(path)}
                for path in sorted(self.directory.joinpath(*group).glob(f"{_EVENTS}*"))
                if not path.name.endswith(HPARAMS_SUFFIX) and (own is None or path != own.path)}
        for path, steps in earlier.items():
            if step in steps:
                _rewrite_without(path, step)
                steps.discard(step)

    def write_hparams(self, params: Mapping[str, Any]) -> None:
        """Starts the run's hparams session with `params` (flat: dotted names to values),
        replacing the session an earlier process of the run wrote."""
        summary = hparams_pb({name: _hparam_value(value) for name, value in params.items()},
                             trial_id=None, start_time_secs=time.time())
        if self._session is None:
            for old in self.run_dir.glob(f"events.out.tfevents.*{HPARAMS_SUFFIX}"):
                old.unlink(missing_ok=True)
            self._session = _EventFile(self.run_dir, HPARAMS_SUFFIX)
        self._session.add_event(Event(wall_time=time.time(), summary=summary))
        self._session.flush()

    def set_outcome(self, error: BaseException | None) -> None:
        """Records how the run ends (the exception it ends with, None when it completed): the
        status of the hparams session that `close` ends."""
        self._outcome = Outcome.of(error)

    def flush(self) -> None:
        for events in self._files.values():
            events.flush()

    def close(self) -> None:
        """Closes the event files; ends the hparams session, if one was started, with the
        outcome `set_outcome` recorded (success without one; left open after a stop)."""
        files, self._files = list(self._files.values()), {}
        session, self._session = self._session, None
        outcome, self._outcome = self._outcome, Outcome()
        try:
            if session is not None and not outcome.stopped:  # a stopped run's session goes
                session.add_event(Event(wall_time=time.time(),  # on when it resumes
                                        summary=_session_end(outcome)))
        finally:  # every file is closed, also on a full disk
            close_all([*files, *([session] if session is not None else [])])
