"""The Slurm lane's cluster: munge with one key, slurmctld on this machine (the login node), and
one slurmd per lab node, each in its own network and UTS namespace (`scslurm-<node>`), so that
`hostname` on a node says its node name and the scheduler reaches it at its own address.

Everything lives under one directory (`up DIR`): slurm.conf, munge's key and socket, the state
and spool directories, the daemons' logs and pid files; `down DIR` stops the daemons and
removes the namespaces. Commands reach the cluster with SLURM_CONF=DIR/slurm.conf.

Several lanes run side by side (one per worktree): each cluster claims a free slot S
(/run/specconsole-slurm/slot-S, kept in DIR/slot), and its namespaces (`scslurmS-<node>`),
links, addresses and ports are the slot's. Node addresses: node i (1-based) is 10.(230+S).i.2 in
its namespace, the login node 10.(230+S).i.1 on the other end of that veth pair; each node's
default route goes back to the login node, so every node reaches slurmctld at 10.(230+S).1.1
and srun (on the login node) at whichever address it connected from. Ports are the lane's own
(SLURMCTLD_PORT + 2S), not Slurm's defaults.

Stdlib only; needs root, ip, unshare, munged, slurmctld and slurmd. Run as a script:
`python slurmlab.py up DIR` prints `slurm lane: NAME: VALUE` lines and leaves the cluster
running (exit 1 and one line when it cannot); `python slurmlab.py down DIR`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NODES = ("node-1", "node-2", "node-3")
NS_PREFIX = "scslurm"  # + the slot + "-<node>"
NET = 230  # 10.(NET + slot)
SLURMCTLD_PORT = 6917  # + 2 * slot
SLURMD_PORT = 6918
SLOTS = 8  # lanes up at once on one machine
CPUS = 2  # per node, as configured (SlurmdParameters=config_overrides: not the real count)
MEMORY_MB = 8000  # per node: room for a real vLLM (CPU) job; a job without --mem gets DefMemPerCPU
PARTITION = "batch"
URGENT = "urgent"  # the same nodes at a higher PriorityTier: it preempts batch (REQUEUE)
MAX_TIME_MIN = 30  # the partitions' limit: a request for more is refused
SLURMD_TIMEOUT_S = 10
# a requeued job may start again this long after its requeue (Slurm's default: 120 s); it is
# also a step's credential's lifetime, so not less (a step launch on a loaded machine)
CRED_EXPIRE_S = 10
# how often the backfill scheduler runs (Slurm's default: 30 s): a requeued job starts within
# this of its eligibility
BACKFILL_S = 2
# Memory is a consumable the cgroups enforce (task/cgroup, cgroup.conf beside slurm.conf): a
# job over its --mem ends OUT_OF_MEMORY. A job that asks for none gets DefMemPerCPU per CPU.
DEF_MEM_PER_CPU_MB = 400
CGROUP_CONF = "ConstrainRAMSpace=yes\nConstrainSwapSpace=yes\n"  # the cgroup plugin: autodetect
# Each lane's job ids apart: a job's memory cgroup (memory/slurm_<node>/uid_0/job_<id>) is
# named by its node and id, and the lanes' nodes share names.
JOB_IDS_PER_SLOT = 100_000
CGROUP_MEMORY = "/sys/fs/cgroup/memory"  # cgroup v1's memory hierarchy, where slurmd puts jobs
# slot-S names the directory of the cluster holding slot S
SLOT_DIR = Path("/run/specconsole-slurm")
SLOT_CLAIM_S = 120.0  # a claim whose slurmctld is not up yet is taken for this long
TOOLS = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "ip", "unshare", "nsenter",
         "iptables")


class SetupError(RuntimeError):
    """The cluster could not be set up; the message is the lane's one line."""


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


def net(slot: int) -> str:
    return f"10.{NET + slot}"


def slurm_conf(workdir: Path, nodes: tuple[str, ...] = NODES, slot: int = 0) -> str:
    """slurm.conf for the lane's cluster (everything under `workdir`) in slot `slot`."""
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
AuthInfo=socket={workdir / 'munge' / 'munge.socket'},cred_expire={CRED_EXPIRE_S}
StateSaveLocation={workdir / 'state'}
SlurmdSpoolDir={workdir / 'spool'}/%n
SlurmctldPidFile={workdir / 'slurmctld.pid'}
SlurmdPidFile={workdir / 'slurmd'}-%n.pid
SlurmctldLogFile={workdir / 'slurmctld.log'}
SlurmdLogFile={workdir / 'slurmd'}-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU={DEF_MEM_PER_CPU_MB}
FirstJobId={1 + slot * JOB_IDS_PER_SLOT}
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
SchedulerParameters=bf_interval={BACKFILL_S}
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
        self.slot = _int(self.workdir / "slot")  # None until `up` claims one

    def namespace(self, node: str) -> str:
        return f"{NS_PREFIX}{self.slot}-{node}"

    @property
    def env(self) -> dict[str, str]:
        return slurm_env(self.conf)

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
        # always claimed, even in a directory that ran in a slot before: that slot may be
        # another lane's by now
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.slot = _claim(self.workdir)
        (self.workdir / "slot").write_text(str(self.slot))
        self.down(keep_slot=True)  # whatever a crashed run left in this slot
        for sub in ("state", "spool", "munge"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        for node in self.nodes:
            (self.workdir / "spool" / node).mkdir(exist_ok=True, mode=0o700)
        self.conf.write_text(slurm_conf(self.workdir, self.nodes, self.slot))
        (self.workdir / "cgroup.conf").write_text(CGROUP_CONF)
        (self.workdir / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{self.address(node)} {node}\n" for node in self.nodes))
        self._network()
        self._munged()
        self._daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for node in self.nodes:
            self.start_slurmd(node)
        self.wait_idle(timeout)
        return {"nodes": f"{len(self.nodes)} ({', '.join(self.nodes)}), one slurmd each in "
                         f"network namespaces {NS_PREFIX}{self.slot}-<node>",
                "partitions": f"{PARTITION} (PriorityTier 1), {URGENT} (PriorityTier 10, "
                              f"preempts with REQUEUE), MaxTime {MAX_TIME_MIN} min",
                "slurm": _sh("sinfo", "-V", env=self.env).stdout.strip(),
                "SLURM_CONF": str(self.conf),
                "up in": f"{time.monotonic() - started:.1f} s"}

    def _network(self) -> None:
        assert self.slot is not None
        prefix = net(self.slot)
        for i, node in enumerate(self.nodes, 1):
            ns, host_dev = self.namespace(node), self._link(i)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "link", "add", host_dev, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _sh("ip", "addr", "add", f"{prefix}.{i}.1/24", "dev", host_dev)
            _sh("ip", "link", "set", host_dev, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{prefix}.{i}.2/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "route", "add", "default", "via", f"{prefix}.{i}.1")
        _sh("iptables", *self._node_to_node("-I"))

    def _node_to_node(self, how: str) -> list[str]:
        """The iptables rule that lets the nodes reach one another through the login node (a
        several-node job's rendezvous); docker's FORWARD policy drops it otherwise."""
        links = f"{NS_PREFIX}{self.slot}n+"
        return [how, "FORWARD", "-i", links, "-o", links, "-j", "ACCEPT"]

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

    def _cgroups_gone(self) -> None:
        """The memory cgroups of this slot's jobs (task/cgroup): slurmstepd leaves a job's
        behind when a process of it outlived the job; empty by now, removed."""
        assert self.slot is not None
        first = 1 + self.slot * JOB_IDS_PER_SLOT
        for job in Path(CGROUP_MEMORY).glob("slurm_*/uid_*/job_*"):
            number = job.name.removeprefix("job_")
            if not number.isdigit() or not first <= int(number) < first + JOB_IDS_PER_SLOT:
                continue
            for step in (*job.glob("step_*/task_*"), *job.glob("step_*"), job):
                with contextlib.suppress(OSError):
                    step.rmdir()

    def down(self, keep_slot: bool = False) -> None:
        """Stop every daemon this directory's pid files name and every process in the lane's
        namespaces (the jobs' too), then delete the namespaces and their links, and give the
        slot back (unless `keep_slot`)."""
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
        while _sh("iptables", *self._node_to_node("-D"), check=False).returncode == 0:
            pass
        for pid_file in (self.workdir / "slurmctld.pid", self.munge / "munged.pid"):
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                pid = int(pid_file.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 10  # slurmctld saves its state, then exits
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
        self._cgroups_gone()
        slot = SLOT_DIR / f"slot-{self.slot}"
        with contextlib.suppress(OSError):
            if not keep_slot and Path(slot.read_text().strip()) == self.workdir:
                slot.unlink()


def _claim(workdir: Path) -> int:
    """A free slot, claimed for `workdir` (O_EXCL); a slot whose cluster is gone (its
    slurmctld dead, its claim older than SLOT_CLAIM_S) is taken over."""
    SLOT_DIR.mkdir(parents=True, exist_ok=True)
    for slot in range(SLOTS):
        path = SLOT_DIR / f"slot-{slot}"
        if path.exists() and _stale(path):
            with contextlib.suppress(OSError):
                Cluster(Path(path.read_text().strip())).down()  # a crashed lane's leftovers
            path.unlink(missing_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        os.write(fd, str(workdir).encode())
        os.close(fd)
        if Path(f"/run/netns/{NS_PREFIX}{slot}-{NODES[0]}").exists() and not _ours(slot, workdir):
            path.unlink(missing_ok=True)  # a cluster runs there unclaimed: left alone
            continue
        return slot
    raise SetupError(f"all {SLOTS} Slurm lane slots are taken ({SLOT_DIR}): wait for a lane "
                     "to end")


def _ours(slot: int, workdir: Path) -> bool:
    """Whether the slot's namespaces are a run of this directory's (a crash's leftovers)."""
    return _int(workdir / "slot") == slot


def _stale(path: Path) -> bool:
    """A slot claimed more than SLOT_CLAIM_S ago whose slurmctld is not running."""
    try:
        ctld = _int(Path(path.read_text().strip()) / "slurmctld.pid")
        young = time.time() - path.stat().st_mtime < SLOT_CLAIM_S
    except OSError:
        return False
    return not young and not (ctld is not None and _alive(ctld))


def _int(path: Path) -> int | None:
    """The first word of a file as an int (a pid file, the slot)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


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
