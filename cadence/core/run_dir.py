"""`RunDirectory`: the layout of a run's directory, written down once.

Every front-end and built-in callback that writes into a run's directory finds its place here::

    <root>/
      params.yaml        the final config of a Task run (reloads exactly)
      checkpoints/       ckpt-<step>/ (atomic; a run resumes from the newest)
      train/             training summaries: TensorBoard event files, metrics.jsonl
      eval/              evaluation summaries
      best/              the best exports (safetensors + metrics.json, ledger info.json)
      stats.jsonl        the tensorpack monitors' one line per epoch

The Task front-end (``run_experiment``, the ``cadence`` command) calls the root its model
directory, the tensorpack front-end its ``logdir``. Callbacks read the run directory of the run
they are in from ``RunState.run_dir``.

>>> run = RunDirectory("runs/digits-1")
>>> str(run.checkpoints), str(run.best)
('runs/digits-1/checkpoints', 'runs/digits-1/best')
"""

from __future__ import annotations

import os
from pathlib import Path

PARAMS_FILE = "params.yaml"


class RunDirectory:
    """The paths of one run.

    Args:
        root: the run's directory (need not exist yet).
        eval_subdir: where evaluation summaries go (``trainer.validation_summary_subdir``).
        best_subdir: where the best exports go (``trainer.best_checkpoint_export_subdir``).
    """

    def __init__(self, root: str | os.PathLike[str], *, eval_subdir: str = "eval",
                 best_subdir: str = "best") -> None:
        self.root = Path(root)
        self.eval_subdir = eval_subdir
        self.best_subdir = best_subdir

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.root)!r})"

    @property
    def params(self) -> Path:
        """The saved config (``params.yaml``)."""
        return self.root / PARAMS_FILE

    @property
    def checkpoints(self) -> Path:
        """The checkpoint directory: where checkpoints are saved and resumed from."""
        return self.root / "checkpoints"

    @property
    def train(self) -> Path:
        """Training summaries."""
        return self.root / "train"

    @property
    def eval(self) -> Path:
        """Evaluation summaries."""
        return self.root / self.eval_subdir

    @property
    def best(self) -> Path:
        """The best exports."""
        return self.root / self.best_subdir

    @property
    def stats(self) -> Path:
        """The per-epoch JSON lines of the tensorpack monitors."""
        return self.root / "stats.jsonl"

    def subdir(self, name: str) -> Path:
        """Another directory of the run (a callback's own, e.g. ``profile``)."""
        return self.root / name
