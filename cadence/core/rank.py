"""Which process this is in a distributed job: the one place that answers it.

A job launched by ``torchrun`` has ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` in its environment;
once ``torch.distributed`` has a process group, its answers win (a group may also be created
without torchrun). torch is never imported here: the process group is consulted only if the
program already imported ``torch.distributed``, so the torch-free engine can ask too.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _process_group() -> Any:
    """``torch.distributed`` when it is imported and has a process group, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def process_rank() -> int:
    """This process's rank (0 in a single-process job)."""
    dist = _process_group()
    if dist is not None:
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """How many processes the job has (1 in a single-process job)."""
    dist = _process_group()
    if dist is not None:
        return int(dist.get_world_size())
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    """This process's index on its machine (``LOCAL_RANK``; 0 when not launched by torchrun)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_chief() -> bool:
    """Whether this process is rank 0: the one that writes summaries, progress and exports."""
    return process_rank() == 0
