"""`Runtime`: where this process sits in the job -- its device, its place in a named N-D mesh,
its data coordinate, the groups each reduction uses -- built once, asked by everything else.

A job's processes split the work along up to five dimensions (torchtitan's ``ParallelDims``),
outermost first::

    pp            pipeline stages: each holds a slice of the layer stack
    dp_replicate  data-parallel replicas (DDP; with dp_shard > 1, HSDP's replicas)
    dp_shard      data-parallel shards (FSDP2: parameters, gradients and optimizer state)
    cp            context parallelism (a sequence split across ranks; GPU only, not yet here)
    tp            tensor parallelism: each layer's matrices split across ranks

`cadence.engine.parallel_dims.ParallelDims` holds the degrees (their product is the world size;
``dp_shard=-1`` takes what the others leave) and the arithmetic of a rank's coordinates.

The **data coordinate** is a rank's place among the data-parallel ranks: ``dp_rank`` and
``dp_size`` (= ``dp_replicate * dp_shard``). Tensor-, context- and pipeline-parallel peers read
the same batch: everything that shards, positions or counts data asks the data coordinate,
never the global rank.

`Runtime` adds the process: its rank, its device and the device's module
(``torch.get_device_module``: ``torch.cuda``, ``torch.xpu``, ...; none is named here but the
device type), the backend (NCCL for CUDA, gloo for the CPU), the process group (joined from
torchrun's environment -- or Slurm's, `cadence.core.slurm` -- with collectives that time out, so
a dead rank ends the job), the `DeviceMesh` of the dimensions of degree > 1 (made on first use:
it is a collective) and its sub-meshes by name. `setup_runtime` builds one from a config's
degrees and makes it the process's (`current_runtime`); `current_runtime` otherwise builds one
where every process is a data shard, as a job of one dimension always was. The torch-free
engine reads the same answers through `cadence.core.rank`, which the runtime keeps up to date.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import os
import signal
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
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

from cadence.core import rank as place
from cadence.core.errors import JobFailure
from cadence.core.slurm import adopt_launch_environment
from cadence.engine.parallel_dims import (
    DIMENSIONS,
    ParallelDims,
    check_layout,
    data_parallel_dims,
    resolve_layout,
)

logger = logging.getLogger("cadence")

DEFAULT_TIMEOUT = 600.0
"""Seconds a collective may wait for the other ranks before the job is ended."""


# ---------------------------------------------------------------------------- the process


def local_device(name: str = "auto", setting: str | None = None) -> torch.device:
    """This rank's device for a device name: ``auto`` is the machine's accelerator when it has
    one (CUDA, XPU, MPS: ``torch.accelerator``), else the CPU; under torchrun an accelerator
    without an index is ``<type>:<LOCAL_RANK>``, so that every rank of a machine takes its own.

    Args:
        name: the device name.
        setting: where the caller's user wrote `name` (a Task config: ``"runtime.device"``), for
            the error messages; None names this function's argument.

    Raises:
        ValueError: for a name that is not a device, or an accelerator that is not there.
    """
    if name == "auto":
        accelerator = torch.accelerator.current_accelerator(check_available=True)
        name = accelerator.type if accelerator is not None else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as error:
        where = f"{setting} {name!r}" if setting else f"local_device: `name` (got {name!r})"
        raise ValueError(f"{where} is not a device: {error}. Use 'auto', 'cpu', 'cuda' or "
                         "'cuda:<index>'.") from None
    module = device_module(device)  # None for the CPU, and for a device of no module (meta)
    if module is not None and hasattr(module, "is_available"):
        if not module.is_available():
            where = f"{setting} is {name!r}" if setting else f"local_device: `name` is {name!r}"
            fix = f"set {setting}=auto (or cpu)" if setting else "pass 'auto' (or 'cpu')"
            raise ValueError(f"{where} but {device.type.upper()} is not available here: {fix}.")
        if device.index is None and hasattr(module, "device_count"):
            device = torch.device(device.type, place.local_rank() % max(module.device_count(), 1))
    return device


def device_module(device: torch.device) -> Any:
    """The torch module of `device`'s type (``torch.cuda``, ``torch.xpu``, ``torch.mps``), or
    None for the CPU: what sets the device, seeds its generators, makes its streams."""
    if device.type == "cpu":
        return None
    try:
        return torch.get_device_module(device)
    except RuntimeError:
        return None


def on_accelerator(tensor: torch.Tensor) -> bool:
    """Whether `tensor` lives on an accelerator (its copies to the host are asynchronous)."""
    return tensor.device.type != "cpu"


def synchronize(device: torch.device) -> None:
    """Waits until the work queued on `device`'s current stream is done (nothing for the
    CPU): after asynchronous copies to the host, before their buffers are read."""
    module = device_module(device)
    if module is not None:
        module.current_stream(device).synchronize()


def accelerator_started() -> Any:
    """The module of the machine's accelerator when this process has started it
    (``torch.cuda`` once CUDA is initialized, ...), else None: what reads its memory, RNG and
    traces without starting it."""
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None:
        return None
    module = device_module(accelerator)
    started = getattr(module, "is_initialized", None)
    return module if module is not None and (started is None or started()) else None


def graphs_available() -> bool:
    """Whether this machine can record and replay device graphs (CUDA graphs)."""
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    module = device_module(accelerator) if accelerator is not None else None
    return module is not None and hasattr(module, "CUDAGraph")


def device_name(device: torch.device) -> str:
    """The device in words for a summary: ``CUDA (NVIDIA H200)``, ``CPU``."""
    module = device_module(device)
    name = getattr(module, "get_device_name", None)
    if name is None:
        return device.type.upper()
    return f"{device.type.upper()} ({name(device)})"


def backend_for(device: torch.device) -> str:
    """The process group's backend for `device`: the accelerator's collective library (NCCL
    for CUDA and ROCm, XCCL for XPU), gloo for the CPU."""
    if device.type == "cpu":
        return "gloo"
    return dist.Backend.default_device_backend_map.get(device.type, "gloo")


def is_distributed() -> bool:
    """Whether a process group with more than one rank exists."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


_created_group = False


class SetupTimeout(JobFailure):
    """The process group of a torchrun job could not be set up in time: a rank did not start,
    or cannot reach the others."""


def init_distributed(timeout: float = DEFAULT_TIMEOUT, device: torch.device | None = None,
                     backend: str | None = None, setting: str | None = None) -> bool:
    """Joins the ``torchrun`` job when there are several processes (``WORLD_SIZE`` > 1) and no
    process group yet. Returns whether a group with several ranks exists now. A process that
    ``srun`` started as one task of a step takes its place from Slurm's variables first
    (`cadence.core.slurm.adopt_launch_environment`).

    Collectives of the group time out after `timeout` seconds: a rank that died or stopped
    makes the others fail with `CollectiveTimeout` instead of waiting forever. The backend is
    the device's (`backend_for`: NCCL for CUDA, gloo for the CPU). Ranks other than 0 log only
    warnings.

    Args:
        timeout: seconds.
        device: this rank's device.
        backend: the process group's backend; None picks it from `device`.
        setting: where the caller's user wrote `timeout` (a Task config:
            ``"runtime.collective_timeout"``), for the error messages; None names the argument.

    Raises:
        ValueError: for a timeout that is not positive.
        SetupTimeout: when the ranks do not meet within `timeout` seconds.
        JobFailure: when Slurm's variables do not say where this process sits in its job.
    """
    if not timeout or timeout <= 0:
        raise ValueError(f"{setting or 'init_distributed: `timeout`'} (got {timeout!r}) must be "
                         "a positive number of seconds.")
    adopt_launch_environment()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and dist.is_available() and (
            not dist.is_initialized()):
        _create_group(device, timeout, backend, setting=setting)
    if is_distributed() and place.process_rank() != 0:
        cadence_logger = logging.getLogger("cadence")
        if cadence_logger.getEffectiveLevel() < logging.WARNING:
            cadence_logger.setLevel(logging.WARNING)
    return is_distributed()


def _create_group(device: torch.device | None, timeout: float, backend: str | None = None,
                  setting: str | None = None, **how: Any) -> None:
    """Creates the default process group -- the device's backend, the device set as this
    process's -- and destroys it at exit (`shutdown`). `how`: a store, rank and world size,
    where not torchrun's environment (else `_round_store`).

    Raises:
        SetupTimeout: when the rendezvous or the connections between the ranks take longer
            than `timeout` seconds (one line, naming the rank and the address).
    """
    global _created_group
    device = device or torch.device("cpu")
    backend = backend or backend_for(device)
    module = device_module(device)
    if module is not None and hasattr(module, "set_device"):
        module.set_device(device)
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
    """Destroys the process group `init_distributed` created (a no-op otherwise); the runtime
    of that group goes with it."""
    global _created_group, _current
    if _created_group and dist.is_initialized():
        import gc

        gc.collect()  # a DDP module's reducer left for the collector holds work on the group
        with contextlib.suppress(RuntimeError):  # a barrier first: a group made just before
            # (a mesh's) may still be connecting, and destroying it then aborts a rank
            if dist.get_world_size() > 1:
                dist.barrier(group=control_group())
        dist.destroy_process_group()
    _created_group = False
    _current = None
    place.set_place(None)


def ensure_process_group(device: torch.device, timeout: float = DEFAULT_TIMEOUT) -> None:
    """A process group of this process alone, when there is none (``python -m cadence`` or
    ``torchrun --nproc_per_node=1``): DDP and FSDP2 need one, and with it a run of either
    strategy continues on one process -- a resume at another world size -- exactly as on
    several (FSDP2's checkpoints stay sharded through DCP)."""
    if not dist.is_initialized():
        _create_group(device, timeout, store=dist.HashStore(), rank=0, world_size=1)


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
    collectives run on CPU tensors, so reading their result never waits for a device. Created on
    first use -- a collective call, so every rank must reach it."""
    if dist.get_backend() == "gloo":
        return dist.group.WORLD  # looked up, never kept: see `GlooGroup`
    return _control_group.get()


# ---------------------------------------------------------------------------- the runtime


@dataclass
class Runtime:
    """This process's place in the job (see the module docstring).

    Attributes:
        dims: the layout's degrees.
        device: this rank's device.
        rank: this process's global rank.
        strategy: how the data-parallel dimensions hold the model: ``none`` (each replica its
            own gradients), ``ddp`` (gradients averaged over ``dp_replicate``), ``fsdp2``
            (sharded over ``dp_shard``; HSDP with ``dp_replicate`` > 1).
    """

    dims: ParallelDims
    device: torch.device
    rank: int = 0
    strategy: str = "none"
    _mesh: Any = field(default=None, repr=False)
    _groups: dict[tuple[str, ...], Any] = field(default_factory=dict, repr=False)
    requested: tuple[Any, ...] = field(default=(), repr=False)
    """What `setup_runtime` was asked (it returns this runtime again for the same request)."""

    def __post_init__(self) -> None:
        place.set_place(place.Place(
            rank=self.rank, world_size=self.dims.world_size, local_rank=place.local_rank(),
            dp_rank=self.dims.dp_rank(self.rank), dp_size=self.dims.dp_size))

    # -------------------------------------------------------------- where this process is

    @property
    def world_size(self) -> int:
        """The job's processes."""
        return self.dims.world_size

    @property
    def is_chief(self) -> bool:
        """Whether this is rank 0: the one that writes summaries, progress and exports."""
        return self.rank == 0

    @property
    def coordinates(self) -> dict[str, int]:
        """This rank's index along each dimension."""
        return self.dims.coordinates(self.rank)

    @property
    def dp_rank(self) -> int:
        """This rank's data shard (its place among the data-parallel ranks)."""
        return self.dims.dp_rank(self.rank)

    @property
    def dp_size(self) -> int:
        """How many data shards the job reads."""
        return self.dims.dp_size

    @property
    def device_module(self) -> Any:
        """The torch module of the device's type (``torch.cuda``, ...), None for the CPU."""
        return device_module(self.device)

    @property
    def backend(self) -> str:
        """The process group's backend for this device."""
        return backend_for(self.device)

    # -------------------------------------------------------------- the mesh

    def mesh_dimensions(self) -> list[str]:
        """The mesh's dimensions: those of degree > 1, and the data-parallel one that the
        strategy wraps even in one process (FSDP2's ``dp_shard``, DDP's ``dp_replicate``: a
        group of one), outermost first."""
        kept = {"fsdp2": "dp_shard", "ddp": "dp_replicate"}.get(self.strategy)
        return [name for name, degree in self.dims.degrees.items()
                if degree > 1 or name == kept]

    @property
    def mesh(self) -> Any:
        """The `DeviceMesh` of `mesh_dimensions`, made on first use (a collective: every rank
        must ask for it at the same point), with a process group joined first where there is
        none (a group of one in a single process); None when the layout has no dimension."""
        if self._mesh is None:
            names = self.mesh_dimensions()
            if not names:
                return None
            from torch.distributed.device_mesh import init_device_mesh

            ensure_process_group(self.device)
            shape = tuple(self.dims.degrees[name] for name in names)
            with signals_to_the_main_thread():
                self._mesh = init_device_mesh(self.device.type, shape,
                                              mesh_dim_names=tuple(names))
        return self._mesh

    def mesh_of(self, *names: str) -> Any:
        """The sub-mesh of the named dimensions that the mesh has (``mesh_of("dp_replicate",
        "dp_shard")``: HSDP's 2-D mesh, or the 1-D ``dp_shard`` one), None when it has none of
        them.

        Raises:
            ValueError: for a name that is not a dimension.
        """
        unknown = [name for name in names if name not in DIMENSIONS]
        if unknown:
            raise ValueError(f"Runtime.mesh_of: {unknown} (got {names}) are not dimensions; "
                             f"the dimensions are {', '.join(DIMENSIONS)}.")
        present = [name for name in self.mesh_dimensions() if name in names]
        mesh = self.mesh
        if not present or mesh is None:
            return None
        return mesh[present[0]] if len(present) == 1 else mesh[tuple(present)]

    def group_of(self, *names: str) -> Any:
        """The process group over the named dimensions (the ranks that differ only along
        them), for a collective: None -- every rank -- when the layout has no other
        dimension; a group made on first use otherwise (a collective: every rank asks)."""
        others = [name for name, degree in self.dims.degrees.items()
                  if degree > 1 and name not in names]
        if not others:
            return None
        key = tuple(name for name in DIMENSIONS if name not in others)  # one group per partition
        if key not in self._groups:
            self._groups[key] = _group_over(self, key)
        return self._groups[key]

    @property
    def data_group(self) -> Any:
        """The group the data-parallel reductions use -- the metrics' and the loss's sums: the
        ranks that read different data and hold the same part of the model. None: every rank
        (a layout with data parallelism alone)."""
        return self.group_of("dp_replicate", "dp_shard")

    @property
    def metric_group(self) -> Any:
        """The group the metrics' and the losses' sums reduce over: the data-parallel ranks and
        the pipeline's stages -- under pipeline parallelism the loss and the metrics are
        computed on the last stage, and the other stages add zeros, so that every rank reads
        the same values. None: every rank (a layout with data parallelism alone)."""
        return self.group_of("pp", "dp_replicate", "dp_shard")

    def with_strategy(self, strategy: str) -> Runtime:
        """This runtime, holding the model as `strategy` says: itself when that is its own
        strategy; for a layout of data parallelism alone, the one laid out for it (FSDP2's
        shards, DDP's replicas), made the process's.

        Raises:
            ConfigError: for a strategy the layout cannot take (`check_layout`).
        """
        global _current
        if strategy == self.strategy:
            return self
        dims = self.dims
        if dims.tp == dims.pp == dims.cp == 1:
            dims = data_parallel_dims(self.world_size, strategy)
        check_layout(dims, strategy)
        runtime = Runtime(dims, self.device, self.rank, strategy)
        if _current is self:
            _current = runtime
        return runtime

    def describe(self) -> str:
        """The layout and this rank's place in it, in words."""
        return (f"{self.dims.describe()} on {self.device.type}, rank {self.rank} of "
                f"{self.world_size}, data shard {self.dp_rank} of {self.dp_size}")


def _group_over(runtime: Runtime, names: tuple[str, ...]) -> Any:
    """The group of this rank among the partition of the ranks by their coordinates outside
    `names` (each member differs from the others only along `names`)."""
    dims, fixed = runtime.dims, [name for name in DIMENSIONS if name not in names]
    partition: dict[tuple[int, ...], list[int]] = {}
    for rank in range(dims.world_size):
        coordinates = dims.coordinates(rank)
        partition.setdefault(tuple(coordinates[name] for name in fixed), []).append(rank)
    with signals_to_the_main_thread():
        mine, _ = dist.new_subgroups_by_enumeration(list(partition.values()))
    return mine


_current: Runtime | None = None


def setup_runtime(device: str | torch.device = "auto", *, strategy: str = "auto",
                  dp_replicate: int = 1, dp_shard: int = -1, tp: int = 1, pp: int = 1,
                  cp: int = 1, timeout: float = DEFAULT_TIMEOUT,
                  setting: str = "setup_runtime",
                  timeout_setting: str | None = None) -> Runtime:
    """Joins the job (`init_distributed`), builds this process's `Runtime` for the degrees
    given, and makes it the process's (`current_runtime`). What a Task run does from
    ``runtime.parallelism``; Orbit-style and TrainLoop programs call it themselves::

        runtime = cadence.setup_runtime(dp_shard=-1, tp=2)   # under torchrun, 4 processes
        model = cadence.prepare_model(model, "fsdp2", runtime.device, runtime=runtime)

    Args:
        device: the device name (`local_device`), or a device.
        strategy: how the data-parallel dimensions hold the model (`Runtime.strategy`);
            ``auto``: FSDP2 when the layout has more than data parallelism, or shards
            (``dp_shard`` given), else DDP with several processes, else none.
        dp_replicate: data-parallel replicas.
        dp_shard: data-parallel shards; -1: what the other degrees leave.
        tp: tensor-parallel degree.
        pp: pipeline-parallel degree.
        cp: context-parallel degree (not supported yet: refused above 1).
        timeout: seconds a collective waits (`init_distributed`).
        setting: what the messages call these arguments (a Task config:
            ``"runtime.parallelism"``).
        timeout_setting: what they call `timeout` (``"runtime.collective_timeout"``).

    Returns:
        The runtime -- the same one when asked again with the same arguments in the same job.

    Raises:
        ConfigError: for degrees that do not make the world size, or that cannot work (see
            `check_layout`).
    """
    global _current
    device = device if isinstance(device, torch.device) else local_device(device, setting)
    adopt_launch_environment()
    world, rank = _job()  # the launcher's answer, before the group exists: checked first
    requested = (device, strategy, dp_replicate, dp_shard, tp, pp, cp)
    if (_current is not None and _current.requested == requested
            and (_current.world_size, _current.rank) == (world, rank)):
        return _current  # asked again (a Trainer built in a run that set it up): the same
    dims, resolved = resolve_layout(world, strategy, dp_replicate=dp_replicate,
                                    dp_shard=dp_shard, tp=tp, pp=pp, cp=cp, setting=setting)
    init_distributed(timeout, device, setting=timeout_setting)
    _current = Runtime(dims, device, rank, resolved, requested=requested)
    return _current


def _job() -> tuple[int, int]:
    """The world size and this rank, from the process group (else the environment)."""
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size()), int(dist.get_rank())
    return int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))


def current_runtime() -> Runtime:
    """The process's `Runtime`: the one `setup_runtime` built while its job lives; else one
    where every process is a data shard (the layout of a job of one dimension), on the
    default device of this rank."""
    global _current
    world, rank = _job()
    runtime = _current
    if runtime is None or runtime.world_size != world or runtime.rank != rank:
        device = runtime.device if runtime is not None else local_device("auto")
        _current = runtime = Runtime(data_parallel_dims(world, "none"), device, rank,
                                     "ddp" if world > 1 else "none")
    return runtime
