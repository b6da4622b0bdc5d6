"""The distributed runtime, one for every front-end: joining a ``torchrun`` job, the device of
each rank, bounded failures, agreed stops, and how a model is spread over the ranks.

- `init_distributed` joins the job when ``torchrun`` started several processes: a process group
  whose collectives time out after ``timeout`` seconds, so that a dead or stuck rank ends the
  job in bounded time instead of hanging it; ranks other than 0 log warnings only.
- `local_device` is this rank's device: ``cuda:<LOCAL_RANK>`` on a GPU machine.
- `StopAgreement` carries the stop flags across ranks for the run clock, which makes a stop
  requested on any rank (a signal, a callback, a time limit) the stop of every rank, at the
  same step, without a host-device sync per step.
- `prepare_model` spreads a model over the ranks as the strategy says (none, DDP, FSDP2 per
  repeated block: `cadence.engine.parallelize`), in a group of one where there is no job.
- `gather_objects` brings every rank's host-side values to every rank; `gather_on_rank_zero`
  to rank 0 alone.
- `shutdown` destroys the process group `init_distributed` created.

Which process this is (rank, world size) is answered by `cadence.core.rank`, for the
torch-free engine too.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

# Imported before any process group exists -- this module is imported before a job makes its
# group (cadence's `init_distributed`, or a script that imports cadence first). When
# torch.distributed.nn is first imported, its functions bind the default group as default
# arguments; the first optimizer imports it (through torch._dynamo), usually after
# init_process_group, and the group then outlives destroy_process_group: its gloo worker threads
# run into interpreter exit, where a rank that finished well now and then aborts ("terminate
# called without an active exception"). Training imports it anyway: this costs nothing.
import torch.distributed.nn
from torch import nn

from cadence.core.errors import JobFailure
from cadence.core.intervals import check_int
from cadence.core.rank import local_rank, process_rank, world_size
from cadence.engine.parallelize import ParallelOptions, parallelize_model, unwrapped_name
from cadence.engine.strategies import STRATEGIES

logger = logging.getLogger("cadence")

DEFAULT_TIMEOUT = 600.0
"""Seconds a collective may wait for the other ranks before the job is ended."""

_created_group = False


class CollectiveTimeout(JobFailure):
    """A collective operation did not complete in time: another rank is dead or stuck."""


def is_distributed() -> bool:
    """Whether a process group with more than one rank exists."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def local_device(name: str = "auto", setting: str | None = None) -> torch.device:
    """This rank's device for a device name: ``auto`` is CUDA when available, else the CPU;
    under torchrun a CUDA device without an index is ``cuda:<LOCAL_RANK>``, so that every rank
    of a machine takes its own GPU.

    Args:
        name: the device name.
        setting: where the caller's user wrote `name` (a Task config: ``"runtime.device"``), for
            the error messages; None names this function's argument.

    Raises:
        ValueError: for a name that is not a device, or CUDA where there is none.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as error:
        where = f"{setting} {name!r}" if setting else f"local_device: `name` (got {name!r})"
        raise ValueError(f"{where} is not a device: {error}. Use 'auto', 'cpu', 'cuda' or "
                         "'cuda:<index>'.") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            where = f"{setting} is {name!r}" if setting else f"local_device: `name` is {name!r}"
            fix = f"set {setting}=auto (or cpu)" if setting else "pass 'auto' (or 'cpu')"
            raise ValueError(f"{where} but CUDA is not available here: {fix}.")
        if device.index is None:
            device = torch.device("cuda", local_rank() % max(torch.cuda.device_count(), 1))
    return device


def init_distributed(timeout: float = DEFAULT_TIMEOUT, device: torch.device | None = None,
                     backend: str | None = None, setting: str | None = None) -> bool:
    """Joins the ``torchrun`` job when there are several processes (``WORLD_SIZE`` > 1) and no
    process group yet. Returns whether a group with several ranks exists now.

    Collectives of the group time out after `timeout` seconds: a rank that died or stopped
    makes the others fail with `CollectiveTimeout` instead of waiting forever. The backend is
    NCCL for CUDA devices, else gloo. Ranks other than 0 log only warnings.

    Args:
        timeout: seconds.
        device: this rank's device.
        backend: the process group's backend; None picks it from `device`.
        setting: where the caller's user wrote `timeout` (a Task config:
            ``"runtime.collective_timeout"``), for the error messages; None names the argument.

    Raises:
        ValueError: for a timeout that is not positive.
        SetupTimeout: when the ranks do not meet within `timeout` seconds.
    """
    if not timeout or timeout <= 0:
        raise ValueError(f"{setting or 'init_distributed: `timeout`'} (got {timeout!r}) must be "
                         "a positive number of seconds.")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and dist.is_available() and (
            not dist.is_initialized()):
        _create_group(device, timeout, backend, setting=setting)
    if is_distributed() and process_rank() != 0:
        cadence_logger = logging.getLogger("cadence")
        if cadence_logger.getEffectiveLevel() < logging.WARNING:
            cadence_logger.setLevel(logging.WARNING)
    return is_distributed()


class SetupTimeout(JobFailure):
    """The process group of a torchrun job could not be set up in time: a rank did not start,
    or cannot reach the others."""


def _create_group(device: torch.device | None, timeout: float, backend: str | None = None,
                  setting: str | None = None, **how: Any) -> None:
    """Creates the default process group -- NCCL for a CUDA device, else gloo; the device set
    as this process's -- and destroys it at exit (`shutdown`). `how`: a store, rank and world
    size, where not torchrun's environment (else `_round_store`).

    Raises:
        SetupTimeout: when the rendezvous or the connections between the ranks take longer
            than `timeout` seconds (one line, naming the rank and the address).
    """
    global _created_group
    if backend is None:
        backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)
    bound = datetime.timedelta(seconds=timeout)
    try:
        with signals_to_the_main_thread():
            if not how and "TORCHELASTIC_RESTART_COUNT" in os.environ:
                how = _round_store(bound)
            dist.init_process_group(backend, timeout=bound, **how)
    except (RuntimeError, dist.DistError) as error:  # DistStoreError, gloo's connectFullMesh
        text = str(error).lower()
        if not isinstance(error, dist.DistError) and not any(
                word in text for word in ("timed out", "timeout", "connect", "refused")):
            raise  # not the meeting of the ranks (e.g. a backend that is not built): as it is
        where = (f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}")
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SetupTimeout(
            f"Rank {os.environ.get('RANK', '?')} of {os.environ.get('WORLD_SIZE', '?')} could "
            f"not join the job's process group within {timeout:g} s "
            f"({setting or 'init_distributed: `timeout`'}) through {where}: {first}. A rank did "
            "not start or cannot reach the others; torchrun restarts the job if --max-restarts "
            "allows.") from error
    _created_group = True
    atexit.register(shutdown)


def _round_store(timeout: datetime.timedelta) -> dict[str, Any]:
    """The store, rank and world size of this round of a torchrun job, its keys under a prefix
    of their own: ``cadence/round-<TORCHELASTIC_RESTART_COUNT>/``.

    After ``torchrun --max-restarts`` restarts the workers, the new round's ranks meet in the
    store of the round before, which still holds the old ranks' keys -- gloo's addresses among
    them. A new rank that reads a key before its new owner rewrote it connects to a process that
    is gone ("connectFullMesh failed ... Connection refused"), or waits for it. A prefix per
    round leaves the old keys unread. The store's own timeout bounds the rendezvous."""
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {"store": dist.PrefixStore(f"cadence/round-{restart}/", store), "rank": rank,
            "world_size": world_size}


@contextlib.contextmanager
def signals_to_the_main_thread() -> Iterator[None]:
    """Blocks SIGTERM and SIGINT while inside, so that the threads a process group starts here
    (gloo's transport and worker threads) inherit a mask that keeps them off those signals:
    the kernel then delivers a SIGTERM to the main thread, whose handler asks for a clean stop,
    and never interrupts a thread in the middle of a collective's read. A signal that arrives
    inside is delivered when the block ends."""
    if (not hasattr(signal, "pthread_sigmask")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def shutdown() -> None:
    """Destroys the process group `init_distributed` created (a no-op otherwise)."""
    global _created_group
    if _created_group and dist.is_initialized():
        import gc

        gc.collect()  # a DDP module's reducer left for the collector holds work on the group
        dist.destroy_process_group()
    _created_group = False


class GlooGroup:
    """A gloo group of all ranks, created on first use (a collective: every rank must reach
    it) and referenced weakly: c10d's registry owns it, so that ``dist.destroy_process_group()``
    -- `shutdown`'s, or the user's own -- really destroys it, joining its worker threads while
    the interpreter is alive. A strong reference kept here would keep those threads running
    into interpreter exit, where one that drops a finished collective's tensor needs the GIL,
    and the rank aborts after a run that went well ("terminate called without an active
    exception"). A job that makes a new default group gets a new group here too."""

    def __init__(self) -> None:
        self._group: weakref.ref[Any] | None = None

    def get(self) -> Any:
        group = self._group() if self._group is not None else None
        if group is None:
            with signals_to_the_main_thread(), _lazy_gloo_connections():
                group = dist.new_group(backend="gloo")
            self._group = weakref.ref(group)
        return group


@contextlib.contextmanager
def _lazy_gloo_connections() -> Iterator[None]:
    """Gloo groups made inside connect a pair of ranks when they first exchange data
    (``TORCH_GLOO_LAZY_INIT``, read per group), instead of a full mesh at creation: 523,776 TCP
    connections at 1,024 ranks. A ring all-reduce (the stop agreement) then connects each rank
    to its two neighbours; a gather (the digests) rank 0 to every rank. Measured at 4 ranks:
    1 socket a rank at creation and 2 more after an all-reduce, instead of 4 (``docs/scale.md``)."""
    previous = os.environ.get("TORCH_GLOO_LAZY_INIT")
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TORCH_GLOO_LAZY_INIT"]
        else:
            os.environ["TORCH_GLOO_LAZY_INIT"] = previous


_control_group = GlooGroup()


def control_group() -> Any:
    """A gloo group of all ranks for small host-side messages (stop flags, objects): its
    collectives run on CPU tensors, so reading their result never waits for a GPU. Created on
    first use -- a collective call, so every rank must reach it."""
    if dist.get_backend() == "gloo":
        return dist.group.WORLD  # looked up, never kept: see `GlooGroup`
    return _control_group.get()


@contextlib.contextmanager
def collective_errors(what: str) -> Iterator[None]:
    """Turns a collective's timeout into `CollectiveTimeout` with a message that says what
    probably happened and what to do."""
    try:
        yield
    except RuntimeError as error:
        text = str(error).lower()
        if "timed out" in text or "timeout" in text or "connection closed" in text:
            raise CollectiveTimeout(
                f"{what}: a collective did not complete on rank {process_rank()} of "
                f"{world_size()} ({error}). Another rank is probably dead or stuck; the job "
                "ends. Check the other ranks' logs; raise the process group's timeout "
                "(init_distributed(timeout=...)) if a rank legitimately needs longer (e.g. a slow "
                "first compilation)."
            ) from error
        raise


def any_rank(flag: bool, what: str = "agreeing on a stop") -> bool:
    """Whether `flag` is true on any rank (an all-reduce on the control group; blocking)."""
    if not is_distributed():
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int32)
    with collective_errors(what):
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=control_group())
    return bool(value.item())  # a CPU tensor: no device sync


class StopAgreement:
    """Agrees across ranks on a stop requested on any of them, at the same step on every rank.

    Every `every` steps each rank starts an all-reduce (MAX) of its stop flag on the CPU
    control group, and reads the result of the previous one -- started `every` steps earlier,
    so it is done by now: no rank waits for another, no GPU is synchronized. A stop requested on
    any rank is taken by all within at most ``2 * every`` steps.

    Args:
        every: steps between two agreements.
    """

    def __init__(self, every: int = 10) -> None:
        self.every = check_int("StopAgreement", "every", every, "Pass e.g. every=10.")
        self._steps = 0
        self._pending: tuple[Any, torch.Tensor] | None = None

    def reset(self) -> None:
        """Forgets a pending agreement (at the end of a loop, where ranks agree at once)."""
        if self._pending is not None:
            with collective_errors("agreeing on a stop"):
                self._pending[0].wait()
        self._pending = None
        self._steps = 0

    def poll(self, local: bool) -> bool:
        """Called after every step with this rank's stop flag; True when the ranks agreed to
        stop (then on every rank at this same step)."""
        self._steps += 1
        if self._steps % self.every:
            return False
        agreed = False
        if self._pending is not None:
            work, value = self._pending
            with collective_errors("agreeing on a stop"):
                work.wait()
            agreed = bool(value.item())  # a CPU tensor: no device sync
        value = torch.tensor([int(local)], dtype=torch.int32)
        work = dist.all_reduce(value, op=dist.ReduceOp.MAX, group=control_group(),
                               async_op=True)
        self._pending = (work, value)
        return agreed

    def agree(self, local: bool) -> bool:
        """Whether any rank says `local`, at once (a loop's end: see `any_rank`)."""
        return any_rank(local)


def broadcast_object(value: Any) -> Any:
    """Rank 0's `value`, on every rank (`value` itself in a single process)."""
    if not is_distributed():
        return value
    box = [value]
    with collective_errors("receiving rank 0's choice"):
        dist.broadcast_object_list(box, src=0, group=control_group())
    return box[0]


def gather_objects(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order (``[value]`` in a single process)."""
    if not is_distributed():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    with collective_errors("gathering host-side values"):
        dist.all_gather_object(gathered, value, group=control_group())
    return gathered


def gather_on_rank_zero(value: Any, what: str = "gathering host-side values") -> list[Any]:
    """Every rank's `value`, in rank order, on rank 0 (others get ``[]``): what rank 0 alone
    needs costs the other ranks one send each, not N receives."""
    if not is_distributed():
        return [value]
    rank = dist.get_rank()
    gathered: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    with collective_errors(what):
        dist.gather_object(value, gathered, dst=0, group=control_group())
    return gathered or []


def broadcast_module(module: nn.Module) -> None:
    """Makes every rank's parameters and buffers rank 0's (replicas start equal, as DDP's do)."""
    if not is_distributed():
        return
    with collective_errors("broadcasting the model"), torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)


def average_gradients(parameters: Any) -> None:
    """Averages the gradients of `parameters` over the ranks, in one all-reduce of their
    concatenation (for a step that is not a DDP module's: tensorpack's SimpleTrainer)."""
    if not is_distributed():
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    with collective_errors("averaging gradients"):
        dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def resolve_strategy(strategy: str, model: nn.Module) -> str:
    """The strategy `auto` stands for here: DDP with several ranks and trainable parameters.

    Raises:
        ValueError: for an unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"`strategy` (got {strategy!r}) must be one of "
                         f"{', '.join(STRATEGIES)}.")
    if strategy == "auto":
        trains = any(p.requires_grad for p in model.parameters())
        return "ddp" if is_distributed() and trains else "none"
    return strategy


def ensure_process_group(device: torch.device, timeout: float = DEFAULT_TIMEOUT) -> None:
    """A process group of this process alone, when there is none (``python -m cadence`` or
    ``torchrun --nproc_per_node=1``): DDP and FSDP2 need one, and with it a run of either
    strategy continues on one process -- a resume at another world size -- exactly as on
    several (FSDP2's checkpoints stay sharded through DCP)."""
    if not dist.is_initialized():
        _create_group(device, timeout, store=dist.HashStore(), rank=0, world_size=1)


def device_mesh(device: torch.device) -> Any:
    """The one-dimensional mesh of every rank (named ``dp``), on `device`'s type."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))


def prepare_model(model: nn.Module, strategy: str, device: torch.device,
                  optimizers: Any = (), options: ParallelOptions | None = None,
                  parallelize: Callable[[nn.Module, Any, ParallelOptions], nn.Module]
                  | None = None) -> nn.Module:
    """The module to train: `model` spread over the ranks as `strategy` says, by `parallelize`
    (default `cadence.engine.parallelize.parallelize_model`: per-block activation checkpointing
    and compile as `options` say, then ``none``: `model` itself; ``ddp``: a DDP wrapper, while
    checkpoints hold `model`; ``fsdp2``: `model` sharded in place per repeated block, its
    parameters DTensors that checkpoints save and load sharded). DDP and FSDP2 in a process
    without a group get a group of one (`ensure_process_group`).

    Sharding replaces the parameters: the `optimizers` built over the old ones are pointed at
    the new ones, by name.

    Raises:
        ValueError: for an unknown strategy.
        RuntimeError: if `parallelize` left an optimizer with parameters the trained module
            does not have (it would update nothing that trains).
    """
    strategy = resolve_strategy(strategy, model)
    options = dataclasses.replace(options or ParallelOptions(), strategy=strategy)
    if not options.wraps and parallelize is None:
        return model
    mesh = None
    if strategy != "none":
        ensure_process_group(device)
        mesh = device_mesh(device)
    names = {id(param): unwrapped_name(name) for name, param in model.named_parameters()}
    trained = (parallelize or parallelize_model)(model, mesh, options)
    now = {unwrapped_name(name): param for name, param in model.named_parameters()}
    live = {id(param) for param in trained.parameters()}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            before = [id(p) in names for p in group["params"]]
            group["params"] = [now.get(names.get(id(p), ""), p) for p in group["params"]]
            if any(was and id(p) not in live for was, p in zip(before, group["params"])):
                raise RuntimeError(
                    "After parallelizing the model, the optimizer holds parameters the trained "
                    "model does not have: it would not train it. A custom Task.parallelize must "
                    "change the model in place (fully_shard, wrappers registered in its "
                    "parents), not build a new one.")
    return trained
