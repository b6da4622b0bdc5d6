"""`ReplicaGroups`: replica groups that train on when one of them dies, through torchft.

Restarting every rank after a failure costs every rank the restart, the restore and the steps
since the last checkpoint. With replica groups, the job is several ``torchrun`` launches -- one
per group, each group data-parallel inside (DDP or FSDP2) -- whose groups average their
gradients at every step through torchft's ``Manager`` (PyPI ``torchft``, the PyTorch project's
fault-tolerance library) and a lighthouse that keeps the quorum. Per step, on every rank::

    replicas.begin_step()        # the step's quorum starts (in a thread: overlaps the forward)
    ...forward, backward...      # in the group: DDP's or FSDP2's own reduction
    replicas.reduce_gradients()  # across groups: the average of the live groups' gradients
    if replicas.commit():        # every group agrees the step is whole
        optimizer.step() ...
    else:                        # a group died during the step: it is discarded everywhere
        raise StepDiscarded

When a group dies, the others' step fails to reduce, none commits it, and the next quorum goes
on without the dead group (after the lighthouse's heartbeat timeout); when it comes back (its
``torchrun`` started again), it joins the next quorum, takes a live group's state -- the
model, optimizer, schedules, step counters and metrics registered with `register` -- before
its own update of that step, and from then on applies the same averaged gradients: it is
bitwise in step with the others. Nothing here stops a group's ranks: a dead rank of a group is
that group's failure (its own process group's timeout ends it), not the job's.

Across groups the gradients are reduced after backward, on each rank's local shards (the
groups are sharded alike), as one flat buffer per dtype: nothing depends on DDP's buckets or
FSDP2's hooks, so a group that joins in the middle meets the others' layout.

The data of a group is its share: with ``G`` groups of ``W`` ranks, rank ``r`` of group ``g``
reads shard ``g * W + r`` of ``G * W`` (`input_context`). `docs/reliability.md` says what a
dead group's steps lose.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from cadence.core.errors import ConfigError, JobFailure
from cadence.core.protocols import Stateful
from cadence.data.sharding import InputContext
from cadence.engine.finite import local_shard

logger = logging.getLogger("cadence")

LIGHTHOUSE_HINT = ("start one with `torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 "
                   "--join_timeout_ms 10000 --bind [::]:29510` and pass its address "
                   "(runtime.fault_tolerance.lighthouse, or TORCHFT_LIGHTHOUSE=http://host:29510)")


class ReplicaGroupFailure(JobFailure):
    """The replica groups cannot go on: no quorum forms (the lighthouse is gone, or fewer groups
    than the minimum are alive)."""


class ReplicaSettings(Protocol):
    """The settings every replica group of a job shares: ``runtime.fault_tolerance``
    (`cadence.task.config.FaultToleranceConfig`, where they are defined, with their defaults
    and what each means)."""

    replica_groups: int
    min_live_groups: int
    timeout: float
    quorum_timeout: float
    connect_timeout: float


@dataclass(frozen=True)
class ReplicaOptions:
    """Where this process's group stands among the replica groups: what is resolved for it
    (the config's, else the environment's), beside the job's settings.

    Attributes:
        replica_id: this group's number, from 0.
        lighthouse: the lighthouse's address, ``http://host:port``.
        settings: the settings every group shares.
    """

    replica_id: int
    lighthouse: str
    settings: ReplicaSettings


def reach_lighthouse(address: str, timeout: float) -> None:
    """Checks that the lighthouse at `address` answers (its read-only status page): a replica
    group that cannot reach it would otherwise wait `connect_timeout` inside torchft first.

    Raises:
        ConfigError: naming the address, what happened, and how to start a lighthouse.
    """
    if not address.startswith(("http://", "https://")):
        raise ConfigError(f"runtime.fault_tolerance.lighthouse (got {address!r}) must be an "
                          f"address such as http://localhost:29510: {LIGHTHOUSE_HINT}.")
    try:
        with urllib.request.urlopen(f"{address.rstrip('/')}/status", timeout=timeout) as answer:
            answer.read(1)
    except (OSError, urllib.error.URLError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise ConfigError(f"Cannot reach the torchft lighthouse at {address} ({reason}): "
                          f"{LIGHTHOUSE_HINT}.") from None


class ReplicaGroups:
    """This process's part in the replica groups of a fault-tolerant job (see the module
    docstring). Made under ``torchrun`` (torchft's Manager joins the launcher's store).

    Args:
        options: this group's place and the timeouts.
        group_rank: this process's rank in its group.
        group_size: the ranks of its group.

    Raises:
        ConfigError: when torchft is not installed, the job was not started by torchrun, or
            the lighthouse cannot be reached.
    """

    def __init__(self, options: ReplicaOptions, group_rank: int = 0,
                 group_size: int = 1) -> None:
        # torchft's Rust side logs every quorum at INFO to stderr: warnings only, unless asked.
        os.environ.setdefault("RUST_LOG", "warn")
        try:
            import torchft
        except ImportError:
            raise ConfigError("runtime.fault_tolerance.enabled needs torchft: pip install "
                              "'cadence[ft]' (or torchft), then run the same command.") from None
        if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            raise ConfigError("runtime.fault_tolerance.enabled: start each replica group with "
                              "torchrun (torchrun --standalone --nproc_per_node=N -m cadence "
                              "train ...), also a group of one rank: torchft's Manager joins "
                              "the launcher's store.")
        settings = options.settings
        reach_lighthouse(options.lighthouse, settings.connect_timeout)
        self.options = options
        self.group_rank, self.group_size = group_rank, group_size
        seconds = datetime.timedelta
        self.manager = torchft.Manager(
            pg=torchft.ProcessGroupGloo(timeout=seconds(seconds=settings.timeout)),
            load_state_dict=None, state_dict=None,
            min_replica_size=settings.min_live_groups,
            use_async_quorum=True,
            timeout=seconds(seconds=settings.timeout),
            quorum_timeout=seconds(seconds=settings.quorum_timeout),
            connect_timeout=seconds(seconds=settings.connect_timeout),
            replica_id=f"cadence_{options.replica_id}",
            lighthouse_addr=options.lighthouse,
            init_sync=False,  # every group starts from the same seed or checkpoint
        )
        self.discarded = 0
        """Steps this group ran that were not committed (a group died during them)."""
        self._began = self._reducing = 0.0  # host clock of the step's beginning, its reduction
        self._stall_s = self._discarded_s = 0.0
        self._waiting = True  # the next committed step's reduction waited for a quorum to form
        self._live: int | None = None  # groups in the last quorum
        self._healed = False

    # ------------------------------------------------------------------ healing

    def register(self, name: str, part: Stateful,
                 load: Callable[[dict[str, Any]], Any] | None = None,
                 save: Callable[[], dict[str, Any]] | None = None) -> None:
        """Makes `part` part of what a joining group takes from a live one (by `name`, the same
        on every group): its ``state_dict`` is sent, its ``load_state_dict`` takes it -- or
        `save` and `load` instead."""
        take = load or part.load_state_dict

        def load_healing(state: dict[str, Any]) -> Any:
            self._healed = True
            return take(state)

        self.manager.register_state_dict_fn(name, load_healing, save or part.state_dict)

    # ------------------------------------------------------------------ the step

    def begin_step(self) -> None:
        """Starts this step's quorum (in torchft's thread: it overlaps the forward).

        Raises:
            ReplicaGroupFailure: when the groups cannot agree any more (see `commit`).
        """
        self._began = time.perf_counter()
        with self._failures("starting a step's quorum"):
            self.manager.start_quorum()

    @torch.no_grad()
    def reduce_gradients(self, parameters: Iterable[nn.Parameter]) -> None:
        """Averages the gradients of `parameters` (each rank's local shards) over the live
        groups, in one reduction per dtype. A parameter without a gradient counts as zeros, so
        that every group reduces the same tensors."""
        self._reducing = time.perf_counter()
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for parameter in parameters:
            if not parameter.requires_grad:
                continue
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            grad = local_shard(parameter.grad)
            by_dtype.setdefault(grad.dtype, []).append(grad)
        for grads in by_dtype.values():
            flat = torch.cat([grad.reshape(-1) for grad in grads])
            with self._failures("averaging the gradients over the groups"):
                self.manager.allreduce(flat).wait()  # the mean over the live groups
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()

    def commit(self) -> bool:
        """Whether every live group finished this step whole (then update; else discard it):
        the same answer on every rank of every live group. A group that joined this step has
        taken a live group's state by now.

        Raises:
            ReplicaGroupFailure: when no quorum can be formed within ``quorum_timeout`` (the
                lighthouse is gone, or too few groups are alive).
        """
        with self._failures("agreeing on the step"):
            committed = bool(self.manager.should_commit())
        reduced = max(0.0, time.perf_counter() - self._reducing)
        changed = self._note_membership()
        if not committed:  # its compute is thrown away; its reduction waited on the dead group
            self.discarded += 1
            self._discarded_s += max(0.0, self._reducing - self._began)
            self._stall_s += reduced
            self._waiting = True
        elif self._waiting or changed:  # its reduction waited for a quorum to form
            self._stall_s += reduced
            self._waiting = False
        return committed

    def waits(self) -> dict[str, float]:
        """What the training thread lost to the groups so far (host seconds), as a run's
        timeline records it with each loop (`cadence.records.timeline`): ``stall_s``, waiting
        for the groups to agree -- the detection of a dead group (the discarded step's
        reduction and the next quorum) and the wait to join a quorum at the start -- and
        ``discarded_s``, the compute of the steps no group committed. A step's reduction
        counts as a stall when the step was discarded, follows one, is this process's first,
        or met a quorum of other groups than the step before."""
        return {"stall_s": self._stall_s, "discarded_s": self._discarded_s}

    def _note_membership(self) -> bool:
        """Logs, in one line each, a group that left or joined the quorum, and this group's own
        join (it took a live group's state); returns whether the live groups changed at this
        step (the quorum was formed anew: the step waited for it)."""
        with self._failures("counting the live groups"):
            live = int(self.manager.num_participants())
        previous, self._live = self._live, live
        said = self.group_rank == 0  # one line a group
        if self._healed:  # the quorum it healed in counted only the groups it joined
            self._healed, self._live = False, None  # the next one, with it, is no news
            if said:
                logger.info("Replica group %d joined the others: it took a live group's state.",
                            self.options.replica_id)
            return True
        if previous is None or live == previous:
            return False
        if said and live < previous:
            logger.warning("A replica group left: %d of %d groups train on (this is group %d).",
                           live, self.options.settings.replica_groups, self.options.replica_id)
        elif said:
            logger.info("A replica group joined: %d of %d groups train (this is group %d).",
                        live, self.options.settings.replica_groups, self.options.replica_id)
        return True

    @property
    def writes_checkpoints(self) -> bool:
        """Whether this group writes the job's checkpoints: the first of the live groups."""
        with self._failures("choosing the group that writes the checkpoint"):
            return int(self.manager.participating_rank() or 0) == 0

    def input_context(self) -> InputContext:
        """This rank's share of the data: shard ``replica_id * group_size + group_rank`` of
        ``replica_groups * group_size``."""
        options = self.options
        shards = options.settings.replica_groups * self.group_size
        return InputContext(shards, options.replica_id * self.group_size + self.group_rank,
                            shards)

    @contextlib.contextmanager
    def _failures(self, what: str) -> Iterator[None]:
        """Turns torchft's failure to form a quorum into one `ReplicaGroupFailure`."""
        try:
            yield
        except (TimeoutError, RuntimeError) as error:
            text = str(error).strip()
            found = re.search(r'message: "([^"]*)"', text)  # torchft's gRPC status
            said = found.group(1) if found else (text.splitlines()[0][:300] if text else "")
            raise ReplicaGroupFailure(
                f"Replica group {self.options.replica_id} failed {what} ({type(error).__name__}"
                f"{': ' + said if said else ''}): the lighthouse at {self.options.lighthouse} is "
                "probably gone, or too few groups are alive "
                f"(runtime.fault_tolerance.min_live_groups = "
                f"{self.options.settings.min_live_groups}). "
                "The run's checkpoints are kept: start the lighthouse again and run the same "
                "commands (or train without runtime.fault_tolerance: the checkpoints restore "
                "either way)."
            ) from error

    def shutdown(self) -> None:
        """Leaves the groups (torchft's threads stop)."""
        self.manager.shutdown(wait=False)
