"""The Slurm lane's cluster: munge with one key, slurmctld on this machine (the login node), and
one slurmd per lab node, each in its own network and UTS namespace (`scslurm-<node>`), so that
`hostname` on a node says its node name and the scheduler reaches it at its own address.

Everything lives under one directory (`up DIR`): slurm.conf, munge's key and socket, the state
and spool directories, the daemons' logs and pid files; `down DIR` stops the daemons and
removes the namespaces. Commands reach the cluster with SLURM_CONF=DIR/slurm.conf.

Several lanes (one per worktree) may run at once: each cluster claims a slot N (0..SLOTS-1) in
/run/specconsole-slurm (the file slot-N names its directory; a slot whose directory is gone is
free again), kept in DIR/slot, and its namespaces (`scslurm<N>-<node>`), links, subnet
(10.<230+N>) and ports (SLURMCTLD_PORT + 2N, SLURMD_PORT + 2N) are its own.

Node addresses: node i (1-based) is 10.<230+N>.i.2 in its namespace, the login node
10.<230+N>.i.1 on the other end of that veth pair; each node's default route goes back to the
login node, so every node reaches slurmctld at 10.<230+N>.1.1 and srun (on the login node) at
whichever address it connected from. Ports are this lane's own, not Slurm's defaults.

Stdlib only; needs root, ip, unshare, munged, slurmctld and slurmd. Run as a script:
`python slurmlab.py up DIR` prints `slurm lane: NAME: VALUE` lines and leaves the cluster
running (exit 1 and one line when it cannot); `python slurmlab.py down DIR`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NODES = ("node-1", "node-2", "node-3")
NS_PREFIX = "scslurm"
SLOTS = 8
SLURMCTLD_PORT = 6917  # slot 0's; slot N's is + 2N
SLURMD_PORT = 6918
CPUS = 2  # per node, as configured (SlurmdParameters=config_overrides: not the real count)
MEMORY_MB = 1000
PARTITION = "batch"
URGENT = "urgent"  # the same nodes at a higher PriorityTier: it preempts batch (REQUEUE)
MAX_TIME_MIN = 30  # the partitions' limit: a request for more is refused
SLURMD_TIMEOUT_S = 10
SLOT_DIR = Path("/run/specconsole-slurm")  # slot-N: the directory of the cluster holding N
TOOLS = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "ip", "unshare", "nsenter")


class SetupError(RuntimeError):
    """The cluster could not be set up; the message is the lane's one line."""


def net(slot: int) -> str:
    """The slot's subnet prefix: 10.<230+slot>."""
    return f"10.{230 + slot}"


def slurm_env(conf: Path) -> dict[str, str]:
    """The environment for Slurm's commands (sbatch, squeue, scontrol) against this cluster."""
    return {**os.environ, "SLURM_CONF": str(conf)}


def _sh(*argv: str, check: bool = True, env: dict[str, str] | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    if check and done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise SetupError(f"{' '.join(argv)} failed (exit {done.returncode}): {said[0]}")
    return done


def slurm_conf(workdir: Path, slot: int, nodes: tuple[str, ...] = NODES) -> str:
    """slurm.conf for the lane's cluster in `slot` (everything under `workdir`)."""
    login = socket.gethostname().split(".")[0]
    node_lines = "\n".join(
        f"NodeName={node} NodeAddr={net(slot)}.{i}.2 NodeHostname={node} CPUs={CPUS} "
        f"RealMemory={MEMORY_MB} State=UNKNOWN" for i, node in enumerate(nodes, 1))
    names = ",".join(nodes)
    return f"""\
ClusterName=specconsole
SlurmctldHost={login}({net(slot)}.1.1)
SlurmctldPort={SLURMCTLD_PORT + 2 * slot}
SlurmdPort={SLURMD_PORT + 2 * slot}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={workdir / 'munge' / 'munge.socket'}
StateSaveLocation={workdir / 'state'}
SlurmdSpoolDir={workdir / 'spool'}/%n
SlurmctldPidFile={workdir / 'slurmctld.pid'}
SlurmdPidFile={workdir / 'slurmd'}-%n.pid
SlurmctldLogFile={workdir / 'slurmctld.log'}
SlurmdLogFile={workdir / 'slurmd'}-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_S}
SlurmctldTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=5
OverTimeLimit=0
MinJobAge=600
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
EnforcePartLimits=ALL
{node_lines}
PartitionName={PARTITION} Nodes={names} Default=YES MaxTime={MAX_TIME_MIN} State=UP PriorityTier=1
PartitionName={URGENT} Nodes={names} MaxTime={MAX_TIME_MIN} State=UP PriorityTier=10
"""


class Cluster:
    """The lane's cluster under `workdir`."""

    def __init__(self, workdir: Path, nodes: tuple[str, ...] = NODES) -> None:
        self.workdir = workdir.resolve()
        self.nodes = nodes
        self.conf = self.workdir / "slurm.conf"
        self.munge = self.workdir / "munge"
        self.slot: int | None = None  # claimed by up(), or read back from DIR/slot
        with contextlib.suppress(OSError, ValueError):
            self.slot = int((self.workdir / "slot").read_text())

    @property
    def env(self) -> dict[str, str]:
        return slurm_env(self.conf)

    def namespace(self, node: str) -> str:
        return f"{NS_PREFIX}{self.slot}-{node}"

    def address(self, node: str) -> str:
        """The node's address (its NodeAddr)."""
        return f"{net(self._slot)}.{self.nodes.index(node) + 1}.2"

    @property
    def _slot(self) -> int:
        if self.slot is None:
            raise SetupError(f"no cluster was set up in {self.workdir} (no slot file)")
        return self.slot

    def _link(self, index: int) -> str:
        """The login node's end of node `index`'s veth pair."""
        return f"{NS_PREFIX}{self.slot}n{index}"

    def _claim(self) -> None:
        """Take a free slot (its file names this directory); one whose directory is gone is
        free again (a crashed lane's)."""
        SLOT_DIR.mkdir(parents=True, exist_ok=True)
        with (SLOT_DIR / "claim.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for slot in range(SLOTS):
                path = SLOT_DIR / f"slot-{slot}"
                with contextlib.suppress(OSError):
                    holder = Path(path.read_text().strip())
                    if holder != self.workdir and holder.exists():
                        continue
                path.write_text(str(self.workdir))
                (self.workdir / "slot").write_text(str(slot))
                self.slot = slot
                return
        raise SetupError(f"all {SLOTS} Slurm lane slots in {SLOT_DIR} are taken")

    # -- up --------------------------------------------------------------------------------

    def up(self, timeout: float = 60) -> dict[str, str]:
        """Build the namespaces, start munged, slurmctld and each slurmd, and wait until sinfo
        says every node is idle; the figures to print. SetupError when it cannot."""
        missing = [t for t in TOOLS if not _which(t)]
        if missing:
            raise SetupError(f"missing {', '.join(missing)} (python3 -m tui.bootstrap slurm "
                             "installs slurm-wlm and munge)")
        if os.geteuid() != 0:
            raise SetupError("the slurm lane needs root (network namespaces, slurmd)")
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._claim()
        self.down(release=False)  # whatever a crashed run in this slot left
        for sub in ("state", "spool", "munge"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        for node in self.nodes:
            (self.workdir / "spool" / node).mkdir(exist_ok=True, mode=0o700)
        self.conf.write_text(slurm_conf(self.workdir, self._slot, self.nodes))
        (self.workdir / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{self.address(node)} {node}\n" for node in self.nodes))
        self._network()
        self._munged()
        self._daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for node in self.nodes:
            self.start_slurmd(node)
        self.wait_idle(timeout)
        return {"nodes": f"{len(self.nodes)} ({', '.join(self.nodes)}), one slurmd each in "
                         f"network namespaces {self.namespace('<node>')}",
                "partitions": f"{PARTITION} (PriorityTier 1), {URGENT} (PriorityTier 10, "
                              f"preempts with REQUEUE), MaxTime {MAX_TIME_MIN} min",
                "slurm": _sh("sinfo", "-V", env=self.env).stdout.strip(),
                "SLURM_CONF": str(self.conf),
                "up in": f"{time.monotonic() - started:.1f} s"}

    def _network(self) -> None:
        prefix = net(self._slot)
        for i, node in enumerate(self.nodes, 1):
            ns, host_dev = self.namespace(node), self._link(i)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "link", "add", host_dev, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _sh("ip", "addr", "add", f"{prefix}.{i}.1/24", "dev", host_dev)
            _sh("ip", "link", "set", host_dev, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "route", "add", "default", "via", f"{prefix}.{i}.1")

    def _munged(self) -> None:
        key = self.munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m = self.munge
        _sh("munged", "--force", f"--socket={m / 'munge.socket'}", f"--key-file={key}",
            f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
            f"--seed-file={m / 'munged.seed'}")

    def _daemon(self, name: str, argv: list[str]) -> None:
        log = self.workdir / f"{name}.out"
        with log.open("ab") as out:
            subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                             env=self.env, start_new_session=True)

    def start_slurmd(self, node: str) -> None:
        """slurmd for `node` in its namespace, with the node's name as its hostname, and an
        /etc/hosts of the cluster's (a mount namespace of its own, its jobs' too): the node's
        name resolves as on a real cluster (gloo, torch.distributed and Ray ask for it; a DNS
        lookup from the namespace would wait out its timeouts). nsenter, not `ip netns exec`:
        that mounts a sysfs of its own, without /sys/fs/cgroup, and slurmd 22.05 will not
        start without its cgroup plugin's mount."""
        conf, hosts = self.conf, self.workdir / "hosts"
        self._daemon(f"slurmd-{node}", [
            "nsenter", f"--net=/run/netns/{self.namespace(node)}", "unshare", "--uts", "--mount",
            "sh", "-c", f"hostname {node} && mount --bind {hosts} /etc/hosts && "
                        f"exec slurmd -D -f {conf} -N {node}"])

    def slurmd_pid(self, node: str) -> int | None:
        path = self.workdir / f"slurmd-{node}.pid"
        with contextlib.suppress(OSError, ValueError):
            pid = int(path.read_text().split()[0])
            if _alive(pid):
                return pid
        return None

    def kill_slurmd(self, node: str) -> None:
        pid = self.slurmd_pid(node)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def states(self) -> dict[str, str]:
        """Each node's state as sinfo prints it (idle, alloc, down*, ...)."""
        done = _sh("sinfo", "-h", "-N", "-o", "%N %t", env=self.env, check=False)
        found: dict[str, str] = {}
        for line in done.stdout.splitlines():
            name, _, state = line.partition(" ")
            found[name] = state.strip()
        return found

    def wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.states()
            if all(states.get(n) == "idle" for n in self.nodes):
                return
            time.sleep(0.5)
        said = ", ".join(f"{n} {states.get(n, 'absent')}" for n in self.nodes)
        tail = _tail(self.workdir / "slurmctld.log")
        raise SetupError(f"the nodes are not idle after {timeout:g} s ({said}); "
                         f"slurmctld.log: {tail}")

    # -- down ------------------------------------------------------------------------------

    def down(self, release: bool = True) -> None:
        """Stop every daemon this directory's pid files name and every process in the lane's
        namespaces (the jobs' too), then delete the namespaces and their links; `release`
        the slot."""
        if self.slot is None:
            return
        for i, node in enumerate(self.nodes, 1):
            ns = self.namespace(node)
            if Path(f"/run/netns/{ns}").exists():
                pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                _sh("ip", "netns", "del", ns, check=False)
            _sh("ip", "link", "del", self._link(i), check=False)
        for pid_file in (self.workdir / "slurmctld.pid", self.munge / "munged.pid"):
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                pid = int(pid_file.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 10  # slurmctld saves its state, then exits
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
        slot_file = SLOT_DIR / f"slot-{self.slot}"
        with contextlib.suppress(OSError):
            if release and Path(slot_file.read_text().strip()) == self.workdir:
                slot_file.unlink()


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _which(tool: str) -> bool:
    return any(os.access(Path(d) / tool, os.X_OK)
               for d in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin"] if d)


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if "error" in ln]
        return lines[-1] if lines else "no error logged"
    return "absent"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        print("usage: slurmlab.py up|down DIR", file=sys.stderr)
        return 2
    cluster = Cluster(Path(argv[1]))
    if argv[0] == "down":
        cluster.down()
        return 0
    try:
        figures = cluster.up()
    except (SetupError, OSError, subprocess.SubprocessError) as exc:
        cluster.down()
        print(f"slurm lane setup: {exc}", file=sys.stderr)
        return 1
    for name, value in figures.items():
        print(f"slurm lane: {name}: {value}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
