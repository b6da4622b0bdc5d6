"""cadence's engine: everything between steps that needs no tensors.

Nothing in this package imports torch (a test checks it), so the Controller, callbacks,
intervals, summaries and checkpoint-file management can be read and tested on their own.
"""

from cadence.core.callbacks import Callback, CallbackList, RunState
from cadence.core.checkpoint_dir import CheckpointDirectory, CheckpointInfo, read_manifest
from cadence.core.controller import Action, Controller
from cadence.core.errors import CheckpointError, CheckpointMismatchError, Preempted
from cadence.core.intervals import Interval
from cadence.core.protocols import CheckpointManagerLike, Evaluable, Stateful, Trainable
from cadence.core.summary import SummaryManager, scalar

__all__ = [
    "Action",
    "Callback",
    "CallbackList",
    "CheckpointDirectory",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManagerLike",
    "CheckpointMismatchError",
    "Controller",
    "Evaluable",
    "Interval",
    "Preempted",
    "RunState",
    "Stateful",
    "SummaryManager",
    "Trainable",
    "read_manifest",
    "scalar",
]
