"""`WandbWriter`: a cadence run as one Weights & Biases run, through wandb's own client.

Scalars are logged with the global step as their x-axis (``global_step``, declared with
``define_metric``), named by the path of the summary directory below the run directory and the
nesting of the logs (``train/training_loss``, ``eval/accuracy``). The global step is a value of
each row rather than W&B's own ``step``, because W&B drops rows whose step goes back -- and a
resumed run goes back to its checkpoint's step. The run's hyper-parameters become its W&B config
(`write_hparams`). The writers of one run directory share one W&B run
(`cadence.writers.shared_run`); its id is kept in ``<run_dir>/wandb_run.json``, so a resumed
cadence run resumes the same W&B run (``resume="allow"``).

Where the run goes: ``project``, ``entity`` and ``mode`` (``online``, ``offline``, ``disabled``)
as given, else wandb's own defaults (``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_MODE``, your
login); wandb's files go under ``dir``, else ``WANDB_DIR``, else the run directory
(``<run_dir>/wandb/``); the run's name is ``name``, else the run directory's name. ``wandb`` is
imported when the first writer is built: ``pip install 'cadence[wandb]'``.
"""

from __future__ import annotations

import os
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

RUN_FILE = "wandb_run.json"
"""Where the W&B run of a run directory is recorded: its id, project and entity."""
STEP_KEY = "global_step"
"""The x-axis of every value cadence logs to W&B."""


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise ImportError("The 'wandb' metric writer needs wandb: pip install "
                          "'cadence[wandb]' (or pip install wandb).") from None
    return wandb


_RUNS: SharedRuns[Any] = SharedRuns()


class WandbWriter:
    """Logs scalars to one W&B run per run directory.

    Args:
        directory: the summary directory; values are named by its path below `run_dir`.
        run_dir: the run's root: the W&B run is recorded there (``wandb_run.json``), and wandb's
            files go there by default. Defaults to `directory`.
        project, entity, mode: as ``wandb.init`` takes them (None: wandb's defaults).
        dir: where wandb writes its files (see the module docstring).
        name: the W&B run's name; defaults to the run directory's name.
        init_options: more arguments of ``wandb.init`` (``group``, ``tags``, ``settings``...).

    Raises:
        ImportError: if wandb is not installed.
        ValueError: if `directory` is not inside `run_dir`.
    """

    run_scoped = True
    """Built by name with the run's root (see `cadence.core.protocols.MetricWriter`)."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 run_dir: str | os.PathLike[str] | None = None, project: str | None = None,
                 entity: str | None = None, mode: str | None = None,
                 dir: str | os.PathLike[str] | None = None, name: str | None = None,
                 init_options: Mapping[str, Any] | None = None) -> None:
        self._wandb = _import_wandb()
        self.directory = Path(directory)
        self.run_dir = Path(run_dir) if run_dir is not None else self.directory
        self._prefix = key_prefix(self.directory, self.run_dir)
        self.project, self.entity, self.mode = project, entity, mode
        self.dir = Path(dir or os.environ.get("WANDB_DIR") or self.run_dir)
        self.name = name or Path(os.path.abspath(self.run_dir)).name
        self.init_options = dict(init_options or {})
        self._run_file = self.run_dir / RUN_FILE
        self._key = str(Path(os.path.abspath(self._run_file)))
        self._run: Any = None

    @property
    def run(self) -> Any:
        """The W&B run (a ``wandb.Run``) once this writer has written (None before)."""
        return self._run

    def _open(self) -> Any:
        if self._run is None:
            self._run = _RUNS.acquire(self._key, self._start)
        return self._run

    def _start(self) -> Any:
        """Resumes the run recorded in the run directory, or starts one and records it."""
        record = read_run_file(self._run_file) or {}
        self.dir.mkdir(parents=True, exist_ok=True)  # wandb falls back to /tmp without it
        run = self._wandb.init(
            **{"project": self.project, "entity": self.entity, "mode": self.mode,
               "dir": str(self.dir), "id": record.get("id"), "resume": "allow",
               "name": self.name, "reinit": "create_new", **self.init_options})
        run.define_metric(STEP_KEY)
        run.define_metric("*", step_metric=STEP_KEY)
        write_run_file(self._run_file, {"id": run.id, "project": run.project,
                                        "entity": run.entity})
        return run

    def write(self, step: int, values: Mapping[str, Any], group: tuple[str, ...] = (),
              extra: Mapping[str, Any] | None = None) -> None:
        """Logs the scalar `values` at `step` (other values and `extra` are not logged)."""
        row = {metric_name((*self._prefix, *group), name): value
               for name, value in values.items() if is_scalar(value)}
        if row:
            self._open().log({STEP_KEY: int(step), **row})

    def write_hparams(self, params: Mapping[str, Any]) -> None:
        """Sets `params` in the run's W&B config (a resumed run's changed values replace the
        old ones)."""
        self._open().config.update(dict(params), allow_val_change=True)

    def flush(self) -> None:
        """Nothing to do: wandb sends rows in the background."""

    def set_outcome(self, error: BaseException | None) -> None:
        """Records how the run ends, for its exit code (`close`): `error` is the exception it
        ends with, None when it completed."""
        if self._run is not None:
            _RUNS.record_outcome(self._key, Outcome.of(error))

    def close(self) -> None:
        """The last writer of the run finishes it with the exit code of its outcome
        (`set_outcome`): 0 when it completed, 128 + the signal's number for a
        `cadence.Preempted` (130 for a notebook's `KeyboardInterrupt`), 1 for any other
        exception (a crash, a divergence). wandb then uploads what is left."""
        if self._run is not None:
            self._run = None
            _RUNS.release(self._key,
                          lambda run, outcome: run.finish(exit_code=outcome.exit_code))
