"""A real single-node Slurm cluster for the tests: Debian's ``slurm-wlm`` and ``munge``, no
systemd, no cgroups (the recipe of ``shared/reference/slurm.md``, 3b).

Everything of one cluster lives in its own folder: the munge key, socket and daemon, the
config (``SLURM_CONF``), the controller's state, the spool, the logs, the pid files, and two
free ports. Nothing under ``/etc`` or ``/run`` is touched, so two clusters (two pytest workers)
run side by side, and `LocalSlurm.down` stops exactly the three daemons `LocalSlurm.up`
started, by the pids they wrote.

Differences from the reference's config, each for the tests' time: a requeued job waits out
the credential's lifetime (``cred_expire``, 10 s here, 120 s by default) unless told to start
now (`LocalSlurm.start_now`), and a preempted job has no grace time (``GraceTime=0``, Slurm's
default, instead of the reference's 15 s): it is signalled and requeued at once.

Standard library only: ``.ci/run`` runs ``python3 tests/slurm_cluster.py install`` before the
test environment exists. ``python3 tests/slurm_cluster.py up DIR`` / ``down DIR`` bring a
cluster up and down by hand (then ``export SLURM_CONF=DIR/slurm.conf``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("slurmctld", "slurmd", "munged")
NODE = "localhost"
INSTALL_LOCK = Path("/tmp/cadence-slurm-install.lock")
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                    "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID")


def missing_programs() -> list[str]:
    """The programs of a cluster that are not installed."""
    needed = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol",
              "squeue", "scancel", "sinfo")
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    return [name for name in needed if shutil.which(name, path=search) is None]


def install() -> str | None:
    """Installs the packages with apt where they are missing and this process may (root, apt);
    returns why no cluster can run here, or None. One install at a time on a machine."""
    missing = missing_programs()
    if os.geteuid() != 0:
        return ("Slurm's daemons run as root here, and this process is not root" if not missing
                else f"Slurm is not installed ({', '.join(missing)} missing) and this process "
                "is not root, so it cannot install it with apt")
    if not missing:
        return None
    if shutil.which("apt-get") is None:
        return "Slurm is not installed and there is no apt-get to install it with"
    INSTALL_LOCK.touch(exist_ok=True)
    with open(INSTALL_LOCK) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not missing_programs():
            return None
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        command = ["apt-get", "install", "-y", "-q", *PACKAGES]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:  # a fresh machine has no package lists yet
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True,
                           timeout=600)
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=600)
        if done.returncode != 0:
            tail = " ".join(done.stderr.split()[-40:])
            return f"`{' '.join(command)}` failed ({done.returncode}): {tail}"
    missing = missing_programs()
    return f"Slurm's programs are still missing after apt: {missing}" if missing else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalSlurm:
    """One cluster in `root` (a short path: munge's socket lives there).

    Attributes:
        root: the cluster's folder.
        env: the environment its commands need (``SLURM_CONF``).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        # Nothing of a job this process may itself run in (a CI runner's own Slurm step, a
        # torchrun) leaks into the cluster's jobs.
        inherited = {name: value for name, value in os.environ.items()
                     if not name.startswith(("SLURM_", "SLURMD_", "SBATCH_", "SRUN_"))
                     and name not in LAUNCH_VARIABLES}
        self.env = {**inherited, "SLURM_CONF": str(self.conf)}
        self.started: dict[str, int] = {}
        """The daemons this object started, by name: their pids."""

    # ------------------------------------------------------------------ up and down

    def up(self, timeout: float = 30.0) -> None:
        """Starts munged, slurmctld and slurmd, and waits for the node to be idle.

        Raises:
            RuntimeError: naming the daemon that did not come up, with its log's end.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munged wants every directory above its socket searchable
        self._start_munge()
        for name in ("state", "spool", "log"):
            (self.root / name).mkdir(exist_ok=True)
        self.conf.write_text(self._config())
        self._run_daemon("slurmctld", ["slurmctld", "-f", str(self.conf)])
        self._run_daemon("slurmd", ["slurmd", "-f", str(self.conf), "-N", NODE])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-n", NODE, "-o", "%T", check=False).stdout
            if state.strip().splitlines()[:1] == ["idle"]:
                return
            time.sleep(0.2)
        raise RuntimeError(f"The Slurm node did not become idle in {timeout:g} s: "
                           f"{self.log('slurmd')[-2000:]} {self.log('slurmctld')[-2000:]}")

    def _start_munge(self) -> None:
        folder = self.root / "munge"
        folder.mkdir(exist_ok=True)
        key = folder / "munge.key"
        if not key.exists():
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True,
                           capture_output=True)
        shutil.chown(folder, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        folder.chmod(0o755)
        key.chmod(0o400)
        self._run_daemon("munged", [
            "runuser", "-u", "munge", "--", "munged", f"--socket={folder / 'socket'}",
            f"--key-file={key}", f"--pid-file={folder / 'munged.pid'}",
            f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}"])

    def _run_daemon(self, name: str, command: list[str]) -> None:
        """Runs a daemon that forks into the background and writes its pid file."""
        done = subprocess.run(command, env=self.env, capture_output=True, text=True,
                              timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{name} did not start ({done.returncode}): {done.stderr} "
                               f"{self.log(name)[-2000:]}")
        pid_file = self._pid_file(name)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                self.started[name] = int(pid_file.read_text())
                return
            time.sleep(0.05)
        raise RuntimeError(f"{name} wrote no pid file ({pid_file}): {self.log(name)[-2000:]}")

    def _pid_file(self, name: str) -> Path:
        return self.root / ("munge/munged.pid" if name == "munged" else f"{name}.pid")

    def log(self, name: str) -> str:
        """A daemon's log so far ('' when there is none)."""
        path = self.root / ("munge/munged.log" if name == "munged" else f"log/{name}.log")
        with contextlib.suppress(OSError):
            return path.read_text(errors="replace")
        return ""

    def _config(self) -> str:
        cpus = os.cpu_count() or 1
        socket_path = self.root / "munge" / "socket"
        return f"""\
ClusterName=cadence
SlurmctldHost={NODE}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={socket_path},cred_expire=10
CredType=cred/munge
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
ReturnToService=2
StateSaveLocation={self.root / 'state'}
SlurmdSpoolDir={self.root / 'spool'}
SlurmctldPidFile={self._pid_file('slurmctld')}
SlurmdPidFile={self._pid_file('slurmd')}
SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}
SlurmdLogFile={self.root / 'log' / 'slurmd.log'}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
JobRequeue=1
KillWait=10
MinJobAge=600
InactiveLimit=0
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} Sockets=1 CoresPerSocket={cpus} \
ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 \
PreemptMode=REQUEUE GraceTime=0
PartitionName=high Nodes={NODE} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
"""

    def down(self) -> None:
        """Cancels the cluster's jobs, then stops the daemons `up` started (SIGTERM, then
        SIGKILL after 10 s), by the pids they wrote; removes nothing else."""
        if "slurmctld" in self.started:
            jobs = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and self.run(
                        "squeue", "-h", check=False).stdout.strip():
                    time.sleep(0.5)
        for group in (("slurmd", "slurmctld"), ("munged",)):  # munge serves the others
            stopping = [(name, self.started.pop(name)) for name in group if name in self.started]
            for _, pid in stopping:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            for _, pid in stopping:
                while time.monotonic() < deadline and _alive(pid):
                    time.sleep(0.1)
                if _alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    # ------------------------------------------------------------------ using it

    def run(self, *command: str, check: bool = True,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster."""
        return subprocess.run(command, env=self.env, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def sbatch(self, *args: str, env: dict[str, str] | None = None) -> str:
        """Submits a job (``sbatch --parsable ARGS``); returns its id."""
        done = subprocess.run(["sbatch", "--parsable", *args], env={**self.env, **(env or {})},
                              capture_output=True, text=True, check=True, timeout=60)
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """The fields of ``scontrol show job -o JOB``."""
        text = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(item.split("=", 1) for item in text.split() if "=" in item)

    def wait_for(self, job_id: str, *states: str, timeout: float = 120.0,
                 restarts: int | None = None) -> dict[str, str]:
        """Waits until the job is in one of `states` (and has been requeued `restarts` times);
        returns its fields.

        Raises:
            TimeoutError: naming the state it stayed in.
        """
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in states and (
                    restarts is None or fields.get("Restarts") == str(restarts)):
                return fields
            time.sleep(0.2)
        raise TimeoutError(f"Slurm job {job_id} is not {'/'.join(states)} after {timeout:g} s: "
                           f"JobState={fields.get('JobState')} Reason={fields.get('Reason')} "
                           f"Restarts={fields.get('Restarts')}")

    def start_now(self, job_id: str, restarts: int, timeout: float = 60.0) -> None:
        """Once the job is pending again after its `restarts`-th requeue, lets it start at
        once instead of after ``cred_expire`` (a scheduler setting; reference 5b, fix B)."""
        self.wait_for(job_id, "PENDING", restarts=restarts, timeout=timeout)
        self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str]) -> int:
    """``install``, ``up DIR`` or ``down DIR``."""
    if argv[:1] == ["install"]:
        reason = install()
        if reason:
            print(f"slurm_cluster: {reason}", file=sys.stderr)
            return 1
        return 0
    if len(argv) == 2 and argv[0] in ("up", "down"):
        cluster = LocalSlurm(argv[1])
        if argv[0] == "up":
            cluster.up()
            print(f"export SLURM_CONF={cluster.conf}")
        else:
            for name in DAEMONS:
                with contextlib.suppress(OSError, ValueError):
                    cluster.started[name] = int(cluster._pid_file(name).read_text())
            cluster.down()
        return 0
    print("usage: slurm_cluster.py install | up DIR | down DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
