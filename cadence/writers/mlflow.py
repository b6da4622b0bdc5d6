"""`MLflowWriter`: a cadence run as one MLflow run, through MLflow's own client.

Scalars become MLflow metrics at their step, named by the path of the summary directory below the
run directory and the nesting of the logs (``train/training_loss``, ``eval/accuracy``,
``train/eval/x`` for ``{"eval": {"x": ...}}`` written to ``<run>/train``). The run's
hyper-parameters become MLflow params (`write_hparams`). The writers of one run directory share
one MLflow run (`cadence.writers.shared_run`); its id is kept in ``<run_dir>/mlflow_run.json``,
so a resumed cadence run logs to the same MLflow run (steps logged after the checkpoint it
resumed from are logged again: MLflow keeps both values of such a step).

Where the run goes:

- ``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the store the run directory's record
  names (a resumed run stays where it started), else a file store next to the run directory,
  ``file:<parent of run_dir>/mlruns`` (`default_tracking_uri`): the runs of one folder
  (``runs/<experiment>-<time>``) meet in one store, ``runs/mlruns``, and one MLflow UI
  compares them (``mlflow ui --backend-store-uri file:runs/mlruns``). MLflow has put its file
  store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is set: for a
  file store, cadence sets it to ``true`` when it is not set. Pass ``sqlite:///<path>`` (with
  SQLAlchemy installed) or a server's address for another store.
- ``experiment_name``, else ``MLFLOW_EXPERIMENT_NAME``, else MLflow's ``Default`` experiment;
  created when missing.
- ``run_name``, else the run directory's name.

The client is MLflow's `MlflowClient`, not the fluent ``mlflow.start_run``: a run the program
has open with the fluent API is left alone. ``mlflow`` is imported when the first writer is
built: ``pip install 'cadence[mlflow]'`` (MLflow's light client, ``mlflow-skinny``).
"""

from __future__ import annotations

import logging
import os
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cadence.core.logs import is_scalar
from cadence.writers.shared_run import (
    Outcome,
    SharedRuns,
    key_prefix,
    metric_name,
    read_run_file,
    write_run_file,
)

logger = logging.getLogger("cadence")

RUN_FILE = "mlflow_run.json"
"""Where the MLflow run of a run directory is recorded: its id, experiment and store."""
_METRICS_PER_BATCH = 1000  # MLflow's limits on one log_batch request
_PARAMS_PER_BATCH = 100
_PARAM_VALUE_LENGTH = 6000


def _import_mlflow() -> Any:
    try:
        import mlflow.entities
        import mlflow.exceptions
        import mlflow.tracking
    except ImportError:
        raise ImportError("The 'mlflow' metric writer needs MLflow: pip install "
                          "'cadence[mlflow]' (or pip install mlflow-skinny).") from None
    return mlflow


class _Run:
    """The MLflow run the writers of one run directory share."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client = client
        self.run_id = run_id


_RUNS: SharedRuns[_Run] = SharedRuns()


def default_tracking_uri(run_dir: str | os.PathLike[str]) -> str:
    """The MLflow store of a run directory when none is given: ``mlruns`` in its parent, shared
    by the runs of that folder.

    >>> default_tracking_uri("/work/runs/digits-20250101-120000")
    'file:/work/runs/mlruns'
    """
    return f"file:{Path(os.path.abspath(run_dir)).parent / 'mlruns'}"


def _is_file_store(uri: str) -> bool:
    """Whether MLflow keeps runs at `uri` in its file store (a ``file:`` URI or a path)."""
    scheme = urllib.parse.urlparse(uri).scheme
    return (scheme == "file" or len(scheme) <= 1) and not uri.startswith("databricks")


class MLflowWriter:
    """Writes scalars as metrics of one MLflow run per run directory.

    Args:
        directory: the summary directory; values are named by its path below `run_dir`.
        run_dir: the run's root: the MLflow run is recorded there (``mlflow_run.json``), and
            the default store is ``mlruns`` in its parent. Defaults to `directory`.
        tracking_uri: where MLflow stores the run (see the module docstring).
        experiment_name: the MLflow experiment (created when missing).
        run_name: the MLflow run's name; defaults to the run directory's name.
        tags: tags set on the MLflow run when it is created.

    Raises:
        ImportError: if MLflow is not installed.
        ValueError: if `directory` is not inside `run_dir`.
    """

    run_scoped = True
    """Built by name with the run's root (see `cadence.core.protocols.MetricWriter`)."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 run_dir: str | os.PathLike[str] | None = None, tracking_uri: str | None = None,
                 experiment_name: str | None = None, run_name: str | None = None,
                 tags: Mapping[str, str] | None = None) -> None:
        self._mlflow = _import_mlflow()
        self.directory = Path(directory)
        self.run_dir = Path(run_dir) if run_dir is not None else self.directory
        self._prefix = key_prefix(self.directory, self.run_dir)
        self._run_file = self.run_dir / RUN_FILE
        recorded = (read_run_file(self._run_file) or {}).get("tracking_uri")
        self.tracking_uri = (tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
                             or (recorded if isinstance(recorded, str) else None)
                             or default_tracking_uri(self.run_dir))
        self.experiment_name = (experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                                or "Default")
        self.run_name = run_name or Path(os.path.abspath(self.run_dir)).name
        self.tags = dict(tags or {})
        self._key = str(Path(os.path.abspath(self._run_file)))
        self._run: _Run | None = None
        self._pending: list[Any] = []  # operations of MLflow's asynchronous logging, if on

    # ------------------------------------------------------------------ the shared run

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id once this writer has written (None before)."""
        return self._run.run_id if self._run is not None else None

    def _open(self) -> _Run:
        if self._run is None:
            self._run = _RUNS.acquire(self._key, self._start)
        return self._run

    def _start(self) -> _Run:
        """Resumes the run recorded in the run directory, or creates one and records it."""
        if _is_file_store(self.tracking_uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = self._mlflow.tracking.MlflowClient(tracking_uri=self.tracking_uri)
        record = read_run_file(self._run_file)
        if record is not None and self._resume(client, str(record.get("run_id"))):
            return _Run(client, str(record["run_id"]))
        experiment = client.get_experiment_by_name(self.experiment_name)
        if experiment is None:
            experiment_id = self._create_experiment(client)
        elif experiment.lifecycle_stage == "deleted":
            raise RuntimeError(f"The MLflow experiment {self.experiment_name!r} is deleted in "
                               f"{self.tracking_uri}: restore it, or log to another "
                               "experiment (experiment_name=..., runtime.mlflow.experiment_name).")
        else:
            experiment_id = experiment.experiment_id
        tags = {"cadence.run_dir": os.path.abspath(self.run_dir), **self.tags}
        run = client.create_run(experiment_id, run_name=self.run_name, tags=tags)
        write_run_file(self._run_file, {"run_id": run.info.run_id,
                                        "experiment_id": experiment_id,
                                        "tracking_uri": self.tracking_uri})
        return _Run(client, run.info.run_id)

    def _create_experiment(self, client: Any) -> str:
        """Creates the experiment, or takes the one that another run of the shared store
        created since it was looked up."""
        try:
            return str(client.create_experiment(self.experiment_name))
        except self._mlflow.exceptions.MlflowException as error:
            experiment = client.get_experiment_by_name(self.experiment_name)
            if error.error_code != "RESOURCE_ALREADY_EXISTS" or experiment is None:
                raise
            return str(experiment.experiment_id)

    def _resume(self, client: Any, run_id: str) -> bool:
        """Marks the recorded run running again; False when the store does not have it."""
        try:
            run = client.get_run(run_id)
        except self._mlflow.exceptions.MlflowException as error:
            if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            run = None
        if run is None or run.info.lifecycle_stage == "deleted":
            logger.warning("%s names the MLflow run %s, which %s has not (or has deleted): "
                           "starting a new MLflow run.", self._run_file, run_id,
                           self.tracking_uri)
            return False
        if run.info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
        return True

    def _log(self, **batch: Any) -> None:
        run = self._open()
        operation = run.client.log_batch(run.run_id, **batch)
        if operation is not None:
            self._pending.append(operation)

    # ------------------------------------------------------------------ MetricWriter

    def write(self, step: int, values: Mapping[str, Any], group: tuple[str, ...] = (),
              extra: Mapping[str, Any] | None = None) -> None:
        """Logs the scalar `values` at `step` (other values and `extra` are not metrics)."""
        timestamp = int(time.time() * 1000)
        Metric = self._mlflow.entities.Metric
        metrics = [Metric(metric_name((*self._prefix, *group), name), float(value), timestamp,
                          int(step))
                   for name, value in values.items() if is_scalar(value)]
        for start in range(0, len(metrics), _METRICS_PER_BATCH):
            self._log(metrics=metrics[start:start + _METRICS_PER_BATCH])

    def write_hparams(self, params: Mapping[str, Any]) -> None:
        """Logs `params` as the run's MLflow params (values as text, as MLflow keeps them).

        MLflow keeps a param's first value: on a resumed run, a param whose value changed
        (``--allow-config-change``) keeps its old value, and a warning names it.
        """
        run = self._open()
        logged = run.client.get_run(run.run_id).data.params
        Param = self._mlflow.entities.Param
        new, changed = [], []
        for key, value in params.items():
            name, text = metric_name((), key), str(value)[:_PARAM_VALUE_LENGTH]
            if name not in logged:
                new.append(Param(name, text))
            elif logged[name] != text:
                changed.append(f"{name}: {logged[name]} -> {text}")
        for start in range(0, len(new), _PARAMS_PER_BATCH):
            self._log(params=new[start:start + _PARAMS_PER_BATCH])
        if changed:
            logger.warning("MLflow keeps the first value of a run's params; these changed and "
                           "keep their old value in run %s: %s", run.run_id, "; ".join(changed))

    def set_outcome(self, error: BaseException | None) -> None:
        """Records how the run ends, for its status (`close`): `error` is the exception it
        ends with, None when it completed."""
        if self._run is not None:
            _RUNS.record_outcome(self._key, Outcome.of(error))

    def flush(self) -> None:
        """Nothing to do: each write is sent (or queued, with MLflow's asynchronous logging)."""

    def close(self) -> None:
        """Waits for queued writes; the last writer of the run ends it with the status of its
        outcome (`set_outcome`): ``FINISHED`` when it completed, ``KILLED`` when it was
        stopped (`cadence.Preempted`, a notebook's `KeyboardInterrupt`), ``FAILED`` for any
        other exception (a crash, a divergence)."""
        for operation in self._pending:
            operation.wait()
        self._pending.clear()
        if self._run is not None:
            self._run = None
            _RUNS.release(self._key, lambda run, outcome: run.client.set_terminated(
                run.run_id, outcome.status))
