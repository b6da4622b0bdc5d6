"""Slurm: where a process sits in a Slurm job, and how a stopped job asks to run again.

**Launch.** A process that ``srun`` started as one task of a step (``srun -n 8 cadence train``:
one task per rank) learns its place from Slurm's variables, turned once into the variables
``torchrun`` sets (`launch_environment`, `adopt_launch_environment`) before the process group
is created, so that the rest of cadence reads its place as it does under torchrun
(`cadence.core.rank`):

=====================  ==================================================================
set                    from
=====================  ==================================================================
``RANK``               ``SLURM_PROCID``
``WORLD_SIZE``         ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``)
``LOCAL_RANK``         ``SLURM_LOCALID``
``LOCAL_WORLD_SIZE``   this node's count in ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``)
``MASTER_ADDR``        the first host of ``SLURM_STEP_NODELIST`` (else
                       ``SLURM_JOB_NODELIST``), Slurm's hostlist syntax expanded
                       (`expand_hostlist`): rank 0 runs there
``MASTER_PORT``        derived from the job and step ids (`rendezvous_port`)
=====================  ==================================================================

Nothing is set where torchrun's variables are there already (``srun torchrun ...``: one
task per node, torchrun gives each worker its place), nor outside a step: the batch script
of ``sbatch -n 8`` sees ``SLURM_NTASKS=8`` but is one process (it is warned that only
``srun`` starts the tasks). ``MASTER_ADDR`` and ``MASTER_PORT`` given by the user are kept.

**The job.** `SlurmJob` is the job and step a process runs in, and its restart count
(``SLURM_RESTART_COUNT``, which Slurm sets only from the first requeue on): the run's lock and
timeline name them (`cadence.core.run_dir`, `cadence.records.timeline`).

**Preemption and time limits.** `SlurmOptions` (a Task config's ``runtime.slurm``) names the
signal that Slurm sends before the time limit (``--signal=USR1@120``), which stops, saves and
raises `cadence.Preempted` like SIGTERM (`cadence.core.preemption`); once saved, `requeue`
puts the job back in the queue (``scontrol requeue``) when Slurm lets it (the job's
``Requeue=1``: ``sbatch --requeue``, or a cluster's ``JobRequeue=1``) and the job is still
running -- a job that Slurm is cancelling, timing out or requeueing itself (``scancel``, the
time limit's SIGTERM, ``scontrol requeue``, the end of a preemption's grace time) is left to
Slurm. The next allocation resumes the run from the checkpoint. Nothing here imports torch.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from signal import Signals
from typing import Any

from cadence.core.errors import JobFailure

logger = logging.getLogger("cadence")

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
"""The variables whose presence says that torchrun (or the user) placed the process already."""
PORT_BASE = 15000
"""The lowest port `rendezvous_port` derives: ports 15000-30999, below Linux's ephemeral
ports (32768 on), so that no outgoing connection holds one."""
SLURM_ID = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
"""What a Slurm job or step id looks like (``1234``, ``1234_7``, ``1234+0``, ``batch``)."""
UNCATCHABLE = ("SIGKILL", "SIGSTOP")
SCONTROL_TIMEOUT = 30.0
"""Seconds an ``scontrol`` call may take (the controller may be busy)."""


@dataclass(frozen=True)
class SlurmOptions:
    """What a Slurm job does on the signals that end it early.

    Args:
        signal: the signal, besides SIGTERM, that stops the run with a checkpoint under Slurm:
            what ``sbatch --signal=USR1@120`` sends before the time limit (``"SIGUSR1"``; the
            ``SIG`` may be left out). None: only SIGTERM (and Ctrl-C).
        requeue: after that checkpoint, requeue the job (``scontrol requeue``) when Slurm lets
            it and the job is still running (see the module docstring).

    Raises:
        ValueError: for a signal that is not one, cannot be caught (SIGKILL, SIGSTOP) or is
            Ctrl-C's (SIGINT, which stops without a requeue).
    """

    signal: str | None = "SIGUSR1"
    requeue: bool = True

    def __post_init__(self) -> None:
        if self.signal is not None:
            object.__setattr__(self, "signal", signal_name(self.signal))
        if not isinstance(self.requeue, bool):
            raise ValueError(f"SlurmOptions: `requeue` (got {self.requeue!r}) must be True or "
                             "False.")

    @property
    def stop_signal(self) -> Signals | None:
        """The `signal` as a `signal.Signals`, or None."""
        return None if self.signal is None else Signals[self.signal]


def signal_name(name: Any) -> str:
    """The canonical name of a stop signal Slurm can send: ``"USR1"`` and ``"SIGUSR1"`` are
    ``"SIGUSR1"``; a number is not taken (their numbers differ between systems).

    >>> signal_name("USR1"), signal_name("sigterm")
    ('SIGUSR1', 'SIGTERM')

    Raises:
        ValueError: for a name that is not a signal's, one that cannot be caught, or SIGINT.
    """
    text = name.strip().upper() if isinstance(name, str) else ""
    full = text if text.startswith("SIG") else f"SIG{text}"
    known = full in Signals.__members__ and not full.startswith("SIG_")
    if not known or full in UNCATCHABLE or full == "SIGINT":
        raise ValueError(
            f"The Slurm stop signal (got {name!r}) must be the name of a signal that can be "
            "caught, other than SIGINT: e.g. 'SIGUSR1' (what sbatch --signal=USR1@120 sends), "
            "'SIGUSR2' or 'SIGTERM'; or null for SIGTERM alone.")
    return full


# ---------------------------------------------------------------------------- the job


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm job and step a process runs in.

    Attributes:
        job_id: ``SLURM_JOB_ID``; for a task of an array job, ``<array job>_<task>``
            (``SLURM_ARRAY_JOB_ID``, ``SLURM_ARRAY_TASK_ID``), the name ``scontrol`` takes for
            that task alone -- the first task's own id is also the whole array's.
        step: ``SLURM_STEP_ID`` in a step that ``srun`` started; ``"batch"`` in the batch
            script (which has no step id).
        restart: ``SLURM_RESTART_COUNT``: how many times the job was requeued (0 before the
            first requeue, where Slurm does not set it).
    """

    job_id: str
    step: str
    restart: int = 0

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> SlurmJob | None:
        """The job `env` (default: this process's environment) names, or None outside Slurm.

        >>> SlurmJob.from_environ({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"})
        SlurmJob(job_id='42', step='0', restart=0)
        >>> SlurmJob.from_environ({"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "42",
        ...                        "SLURM_ARRAY_TASK_ID": "1"}).job_id
        '42_1'
        >>> SlurmJob.from_environ({}) is None
        True
        """
        env = os.environ if env is None else env
        job_id = env.get("SLURM_JOB_ID", "").strip()
        if not SLURM_ID.match(job_id):
            return None
        array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
        if array.isdigit() and task.isdigit():
            job_id = f"{array}_{task}"
        step = env.get("SLURM_STEP_ID", "batch").strip()
        restart = env.get("SLURM_RESTART_COUNT", "0").strip()
        return cls(job_id=job_id, step=step if SLURM_ID.match(step) else "batch",
                   restart=int(restart) if restart.isdigit() and len(restart) < 10 else 0)

    def record(self) -> dict[str, Any]:
        """The job as the lock and the timeline write it: ``{"slurm_job", "slurm_step",
        "slurm_restart"}``."""
        return {"slurm_job": self.job_id, "slurm_step": self.step,
                "slurm_restart": self.restart}

    def __str__(self) -> str:
        return f"Slurm job {self.job_id} (step {self.step})"


# ---------------------------------------------------------------------------- the launch


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """The host names of a Slurm hostlist (``SLURM_JOB_NODELIST``), in Slurm's order.

    >>> expand_hostlist("node[01-03,07],login")
    ['node01', 'node02', 'node03', 'node07', 'login']
    >>> expand_hostlist("rack[1-2]-n[8-9]")
    ['rack1-n8', 'rack1-n9', 'rack2-n8', 'rack2-n9']

    Raises:
        ValueError: for a list that is not in Slurm's syntax.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"A Slurm hostlist (got {text!r}) must name at least one host.")
    hosts: list[str] = []
    for entry in _entries(text.strip(), text):
        parts: list[list[str]] = []
        for piece in re.split(r"(\[[^\[\]]*\])", entry):
            if piece.startswith("["):
                parts.append(_bracket(piece[1:-1], text))
            elif piece:
                parts.append([piece])
        hosts.extend("".join(names) for names in itertools.product(*parts))
    return hosts


def _entries(text: str, whole: str) -> Iterator[str]:
    """The comma-separated entries of `text`, commas inside brackets left alone.

    Raises:
        ValueError: for nested or unbalanced brackets, or an empty entry.
    """
    depth, start = 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            break
        if char == "," and depth == 0:
            if index == start:
                raise ValueError(f"The Slurm hostlist {whole!r} has an empty entry.")
            yield text[start:index]
            start = index + 1
    if depth != 0:
        raise ValueError(f"The Slurm hostlist {whole!r} has nested or unbalanced brackets.")
    if start == len(text):
        raise ValueError(f"The Slurm hostlist {whole!r} has an empty entry.")
    yield text[start:]


def _bracket(inside: str, whole: str) -> list[str]:
    """The names of one bracket: ``01-03,07`` is 01, 02, 03, 07 (zero-padded as written).

    Raises:
        ValueError: for what is not a number or an ascending range.
    """
    names: list[str] = []
    for item in inside.split(","):
        match = _RANGE.match(item.strip())
        if match is None:
            raise ValueError(f"The Slurm hostlist {whole!r} has {item!r} in brackets: a number "
                             "or a range of numbers (01-03) was expected.")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise ValueError(f"The Slurm hostlist {whole!r} has the descending range {item!r}.")
        names.extend(str(number).zfill(len(first)) for number in range(int(first),
                                                                       int(last) + 1))
    return names


def tasks_per_node(text: str) -> list[int]:
    """The tasks on each node, from Slurm's compressed count (``SLURM_STEP_TASKS_PER_NODE``).

    >>> tasks_per_node("2(x3),1")
    [2, 2, 2, 1]

    Raises:
        ValueError: for a text that is not in Slurm's syntax.
    """
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if match is None:
            raise ValueError(f"Slurm's tasks per node (got {text!r}) must read like '2(x3),1'.")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def rendezvous_port(job_id: str, step: str) -> int:
    """The port rank 0 of a step listens on: 15000 + 16 x (job id mod 1000) + (step mod 16), so
    that two steps of a job, and the jobs that share a node, meet on different ports (jobs whose
    ids are 1000 apart on the same first node share one: set ``MASTER_PORT`` to choose).

    >>> rendezvous_port("1234", "0"), rendezvous_port("1234", "1")
    (18744, 18745)
    """
    job = int(job_id) if job_id.isdigit() else 0
    step_number = int(step) if step.isdigit() else 0
    return PORT_BASE + 16 * (job % 1000) + step_number % 16


def launch_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The torchrun variables for a process that ``srun`` started as one task of a step, from
    Slurm's (see the module docstring); ``{}`` outside a step, or where torchrun's variables are
    there already. ``MASTER_ADDR`` and ``MASTER_PORT`` are left out where `env` has them.

    >>> env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
    ...        "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "n1",
    ...        "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    >>> launch_environment(env)["RANK"], launch_environment(env)["MASTER_ADDR"]
    ('1', 'n1')

    Raises:
        JobFailure: when Slurm's variables are there but do not make sense (a rank that is
            not a number, a node list that does not parse): the job cannot start.
    """
    env = os.environ if env is None else env
    if "SLURM_STEP_ID" not in env or "SLURM_PROCID" not in env:
        return {}
    if any(name in env for name in TORCHRUN_VARIABLES):
        return {}
    try:
        return _place(env)
    except ValueError as error:
        raise JobFailure(
            f"Slurm's variables do not say where this process sits in its job ({error}). "
            "Launch it with srun from a Slurm allocation as is, or with torchrun, which sets "
            "RANK, WORLD_SIZE and LOCAL_RANK itself.") from None


def _place(env: Mapping[str, str]) -> dict[str, str]:
    """`launch_environment` of a step without torchrun's variables (ValueError when Slurm's do
    not parse)."""
    def number(name: str, fallback: str | None = None) -> int:
        text = env.get(name, env.get(fallback, "") if fallback else "").strip()
        if not text.isdigit():
            raise ValueError(f"{name}={text!r} is not a number")
        return int(text)

    rank = number("SLURM_PROCID")
    world = number("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    local = number("SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
    if world < 1 or rank >= world:
        raise ValueError(f"SLURM_PROCID={rank} is not a rank of {world} tasks")
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get(
        "SLURM_NODELIST", "")
    hosts = expand_hostlist(nodes)
    placed = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
              "LOCAL_WORLD_SIZE": str(_local_world(env, hosts, world))}
    if "MASTER_ADDR" not in env:
        placed["MASTER_ADDR"] = hosts[0]
    if "MASTER_PORT" not in env:
        placed["MASTER_PORT"] = str(rendezvous_port(env.get("SLURM_JOB_ID", "0"),
                                                    env["SLURM_STEP_ID"]))
    return placed


def _local_world(env: Mapping[str, str], hosts: list[str], world: int) -> int:
    """The tasks of the step on this node: its count in ``SLURM_STEP_TASKS_PER_NODE``, found
    by this node's place in the node list (else ``SLURM_NODEID``); without that count, the
    tasks spread evenly over the nodes."""
    text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not text:
        return -(-world // len(hosts))
    counts = tasks_per_node(text)
    here = env.get("SLURMD_NODENAME")
    if here in hosts:
        index = hosts.index(here)
    else:
        node_id = env.get("SLURM_NODEID", "0")
        index = int(node_id) if node_id.isdigit() else 0
    return counts[min(index, len(counts) - 1)]


def adopt_launch_environment() -> dict[str, str]:
    """Sets `launch_environment` in this process's environment (a no-op outside an ``srun``
    step, under torchrun, or when done already); returns what it set. The batch script of a
    job of several tasks is warned that it trains as one process.

    Called where a process first asks for its place: the ``cadence`` command and
    `cadence.task.run_experiment` at their start, and `cadence.engine.runtime.init_distributed`.

    Raises:
        JobFailure: as `launch_environment`.
    """
    placed = launch_environment(os.environ)
    if placed:
        os.environ.update(placed)
        logger.debug("%s: rank %s of %s (local %s of %s), rendezvous at %s:%s.",
                     SlurmJob.from_environ(), placed["RANK"], placed["WORLD_SIZE"],
                     placed["LOCAL_RANK"], placed["LOCAL_WORLD_SIZE"],
                     os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
    elif _batch_script_of_several_tasks(os.environ):
        logger.warning(
            "This Slurm job has %s tasks, but cadence runs in its batch script, outside srun: "
            "it trains as one process. Start it with `srun cadence train ...` (one task per "
            "rank) or `srun torchrun ...` (one task per node) to train as every task.",
            os.environ["SLURM_NTASKS"])
    return placed


_warned_batch = False


def _batch_script_of_several_tasks(env: Mapping[str, str]) -> bool:
    """Whether this is the batch script of a job of several tasks, seen for the first time."""
    global _warned_batch
    several = (not _warned_batch and "SLURM_JOB_ID" in env and "SLURM_STEP_ID" not in env
               and not any(name in env for name in TORCHRUN_VARIABLES)
               and env.get("SLURM_NTASKS", "1").isdigit() and int(env["SLURM_NTASKS"]) > 1)
    _warned_batch = _warned_batch or several
    return several


# ---------------------------------------------------------------------------- the requeue


def job_fields(text: str) -> dict[str, str]:
    """The ``Key=Value`` fields of ``scontrol show job -o`` (one line).

    >>> job_fields("JobId=7 JobName=wrap JobState=RUNNING Reason=None Requeue=1 Restarts=0")
    {'JobId': '7', 'JobName': 'wrap', 'JobState': 'RUNNING', 'Reason': 'None', 'Requeue': '1', \
'Restarts': '0'}
    """
    return dict(item.split("=", 1) for item in text.split() if "=" in item)


def requeue_refusal(fields: Mapping[str, str]) -> str | None:
    """Why a job whose ``scontrol show job`` says `fields` is not requeued by cadence, or None
    to requeue it.

    >>> requeue_refusal({"JobState": "RUNNING", "Requeue": "1"}) is None
    True
    >>> requeue_refusal({"JobState": "COMPLETING", "Requeue": "1"}).split(":")[0]
    'Slurm is ending it already (JobState=COMPLETING)'
    """
    if fields.get("Requeue") != "1":
        return ("it may not be requeued (Requeue=0: submit it with sbatch --requeue, or "
                "resubmit it to resume)")
    state = fields.get("JobState", "?")
    if state != "RUNNING":
        return (f"Slurm is ending it already (JobState={state}): a cancel, the time limit, or "
                "a requeue or preemption that Slurm carries out itself")
    return None


def requeue(job: SlurmJob) -> bool:
    """Requeues `job` (``scontrol requeue``) when Slurm lets it and it is still running (see
    the module docstring); returns whether the job runs again -- requeued here, or by Slurm
    itself (its restart count is above this process's: a preemption, ``scontrol requeue``).
    Never raises: a job that cannot be requeued ends as it would have, and says why in the
    log."""
    shown = _scontrol("show", "job", "-o", job.job_id)
    if shown is None:
        return False
    fields = job_fields(shown)
    restarts = fields.get("Restarts", "")
    if restarts.isdigit() and int(restarts) > job.restart:
        logger.warning("Slurm requeues %s itself (a preemption, or scontrol requeue): the next "
                       "allocation resumes the run from its checkpoint.", job)
        return True
    refusal = requeue_refusal(fields)
    if refusal is not None:
        logger.warning("Not requeueing %s: %s. Resubmit the job to resume the run from its "
                       "checkpoint.", job, refusal)
        return False
    if _scontrol("requeue", job.job_id) is None:
        return False
    logger.warning("Requeued %s: the next allocation resumes the run from its checkpoint.",
                   job)
    return True


def _scontrol(*args: str) -> str | None:
    """The output of ``scontrol ARGS``, or None (with a warning) when it failed."""
    command = ["scontrol", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=SCONTROL_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        logger.warning("Could not requeue the Slurm job: `%s` failed (%s). Resubmit the job to "
                       "resume the run from its checkpoint.", " ".join(command), error)
        return None
    if done.returncode != 0:
        why = " ".join((done.stderr or done.stdout or "").split())[:300]
        logger.warning("Could not requeue the Slurm job: `%s` exited with %d (%s). Resubmit "
                       "the job to resume the run from its checkpoint.", " ".join(command),
                       done.returncode, why or "no message")
        return None
    return done.stdout
