"""Slurm, the pure half: the job script a [slurm] table asks for, the commands that submit,
test, follow and cancel a job, and what the scheduler's answers say (typed records, the
pending reason and the end in words, the end combined with what the agent saw die).

Everything here turns text into records or records into text; running the commands on the
login node is tui.remote.slurm's.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from tui.core.profile import HostConfig, Profile, SlurmConfig, slurm_time_seconds

RUN_ID_ENV = "SPECCONSOLE_RUN_ID"  # the agent's rundir.ENV_KEY: every process of a run has it
JOB_SCRIPT = "job.sbatch"  # in the run directory: what was submitted, kept to read and rerun
JOB_OUTPUT = "slurm-%j.out"  # the batch script's own output (slurmstepd's CANCELLED line)
# In a several-node job's directory: the launch of the member on node {node}, written by the
# console when that member's turn comes, read (and removed) by the agent waiting on that node
LAUNCH_REQUEST = "launch-{node}.json"

# The job's states that are over (squeue no longer lists the job once it is past COMPLETING).
END_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
              "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
# The scheduler's ends that are its own doing: the processes it killed are its victims.
# REQUEUED: not a state of its own (the job is PENDING again, its Restarts counted up): the
# allocation the run had ended with a node's failure or a preemption (PreemptMode=REQUEUE); a
# preemption witnessed (the job output's slurmstepd line) is said as PREEMPTED, requeued
SCHEDULER_ENDS = ("CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                  "REQUEUED")


def sbatch_options(profile: Profile, run_dir: str) -> list[str]:
    """The job's sbatch options from [slurm], one `--name=value` word each, in the order the
    table lists them; its output goes to the run directory (JOB_OUTPUT)."""
    config = _config(profile)
    # the output appended to, not truncated, when a requeued job starts again: the first
    # allocation's end (slurmstepd's `CANCELLED ... DUE TO PREEMPTION`) stays in it
    options = [f"--job-name={config.job_name or profile.name}",
               f"--output={run_dir}/{JOB_OUTPUT}", "--open-mode=append",
               f"--nodes={config.nodes}", "--ntasks-per-node=1"]
    for key in ("partition", "account", "qos", "time", "gres", "constraint"):
        value = getattr(config, key)
        if value is not None:
            options.append(f"--{key}={value}")
    if config.gpus_per_node is not None:
        options.append(f"--gpus-per-node={config.gpus_per_node}")
    if config.cpus_per_task is not None:
        options.append(f"--cpus-per-task={config.cpus_per_task}")
    if config.mem is not None:
        options.append(f"--mem={config.mem}")
    return [*options, *config.sbatch_args]


def job_script(profile: Profile, run_id: str, run_dir: str, command: Sequence[str],
               env: Mapping[str, str] | None = None, stdin: str | None = None) -> str:
    """The batch script: #SBATCH lines (sbatch_options), `env` exported, then `command` (argv,
    quoted here: the one place it becomes shell text) run in the foreground, its stdin from
    the file `stdin`. The job lasts as long as the command: it must wait for the server. The
    run id is the server's (the agent puts RUN_ID_ENV in its environment), not the script's:
    a sweep of the run's processes must not end the job that holds them.

    A several-node job runs `command` once on every node (nodes_step_argv: the batch script
    itself runs on the first node only); there it waits for its member's launch
    (LAUNCH_REQUEST), and the job lasts as long as any node's server."""
    config = _config(profile)
    lines = ["#!/bin/bash", *(f"#SBATCH {word}" for word in sbatch_options(profile, run_dir)),
             f"# specconsole run {run_id} of profile {shlex.quote(profile.path)}"]
    if config.nodes > 1:
        lines.append(f"# one agent per node, each launching its member's server when asked "
                     f"({shlex.quote(run_dir)}/{LAUNCH_REQUEST}); each server's environment "
                     f"holds {RUN_ID_ENV}=<its member's run id>")
        command = [*nodes_step_argv(config.nodes), *command]
    else:
        lines.append(f"# the server's environment holds {RUN_ID_ENV}={shlex.quote(run_id)}")
    lines += [f"export {name}={shlex.quote(value)}" for name, value in (env or {}).items()]
    redirect = f" < {shlex.quote(stdin)}" if stdin is not None else ""
    lines.append(" ".join(shlex.quote(word) for word in command) + redirect)
    return "\n".join(lines) + "\n"


def nodes_step_argv(nodes: int) -> list[str]:
    """In a several-node job's script, what runs a command once on each of its `nodes`: one
    step of one task per node, its stdin (the agent and its spec) given to every task; a task
    that ends (its node's server died) leaves the others running (--kill-on-bad-exit=0), and
    the console's own steps share the nodes with it (--overlap)."""
    return ["srun", "--overlap", f"--nodes={nodes}", f"--ntasks={nodes}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--input=all"]


def _config(profile: Profile) -> SlurmConfig:
    if profile.slurm is None:
        raise ValueError(f"{profile.key} has no [slurm] table")
    return profile.slurm


# --- commands on the login node -----------------------------------------------------------------

def submit_argv(script: str) -> list[str]:
    return ["sbatch", "--parsable", script]


def test_only_argv() -> list[str]:
    """sbatch validates the request (the script on stdin) and says when it would start,
    submitting nothing."""
    return ["sbatch", "--test-only"]


def show_job_argv(job_id: str) -> list[str]:
    return ["scontrol", "show", "job", "-o", job_id]


def queue_argv(job_id: str) -> list[str]:
    """The job's line in the queue with its expected start (squeue --start: pending jobs)."""
    return ["squeue", "--noheader", "--jobs", job_id, "--format", "%i|%T|%r|%S|%N"]


def cancel_argv(job_id: str) -> list[str]:
    return ["scancel", job_id]


def sacct_argv(job_id: str) -> list[str]:
    """The job's own line (-X: no steps) in the accounting: its state, `CANCELLED by UID`
    when someone cancelled it (the one place Slurm keeps who)."""
    return ["sacct", "-X", "--noheader", "--parsable2", f"--jobs={job_id}",
            "--format=JobID,State"]


def step_argv(job_id: str, node: str, argv: Sequence[str]) -> list[str]:
    """`argv` as a step of the running job on `node`, beside the batch step (--overlap):
    stdin and stdout are forwarded, so the agent's link needs no SSH to the node. The step
    is not killed when one task ends (--kill-on-bad-exit=0) and keeps srun's own words out
    of stdout (--quiet)."""
    return ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={node}", "--kill-on-bad-exit=0", "--quiet", "--input=all", *argv]


def node_host(login: HostConfig, address: str) -> HostConfig:
    """The [host] of a job's node reached over SSH (reach = "ssh", where pam_slurm_adopt lets a
    job's owner in): its address, through the login node as the last jump host when the login
    node is itself remote; the login's user, known_hosts, host-key strictness, keepalive,
    connect timeout, Python and directories (a cluster's shared filesystem)."""
    remote = login.target != "local"
    user = login.target.rpartition("@")[0] if remote else ""
    host = f"[{address}]" if ":" in address else address
    jumps = [login.jump, login.target] if remote else []
    return replace(login, target=f"{user}@{host}" if user else host,
                   jump=",".join(j for j in jumps if j) or None)


def parse_job_id(stdout: str) -> str:
    """sbatch --parsable prints `ID` or `ID;CLUSTER`; ValueError on anything else."""
    first = stdout.strip().split(";", 1)[0]
    if not first.isdigit():
        raise ValueError(f"sbatch printed no job id: {stdout.strip()[:200]!r}")
    return first


# --- what the scheduler says ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TestOnly:
    """sbatch --test-only's answer: when and where the job would start, or why never."""

    ok: bool
    start: str | None = None
    nodes: str | None = None
    partition: str | None = None
    error: str | None = None

    def summary(self) -> str:
        if not self.ok:
            return f"the scheduler refuses the request: {self.error}"
        where = f" on {self.nodes}" if self.nodes else ""
        part = f" in partition {self.partition}" if self.partition else ""
        return f"the scheduler would start it at {self.start}{where}{part}"


_TEST_ONLY = re.compile(r"Job \d+ to start at (\S+) using \d+ processors on nodes (\S+)"
                        r"(?: in partition (\S+))?")
_SBATCH_ERROR = re.compile(r"sbatch: error: (?:Batch job submission failed: )?(.*)")


def parse_test_only(code: int, stderr: str) -> TestOnly:
    """sbatch --test-only writes its answer on stderr: `Job N to start at T using P processors
    on nodes X in partition P`, or `sbatch: error: ...` (exit 1)."""
    for line in stderr.splitlines():
        match = _TEST_ONLY.search(line)
        if match is not None and code == 0:
            return TestOnly(True, match.group(1), match.group(2), match.group(3))
    errors = [m.group(1).strip() for m in map(_SBATCH_ERROR.search, stderr.splitlines()) if m]
    said = errors[-1] if errors else (stderr.strip().splitlines() or [f"exit code {code}"])[-1]
    return TestOnly(False, error=said)


_PAIR = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_fields(text: str) -> dict[str, str]:
    """`scontrol show ... -o`'s one line as {key: value}. A value may hold spaces (a command,
    a comment): it runs to the next ` Key=`."""
    found: dict[str, str] = {}
    marks = list(_PAIR.finditer(text.strip()))
    line = text.strip()
    for mark, after in zip(marks, [*marks[1:], None], strict=True):
        end = after.start() if after is not None else len(line)
        found.setdefault(mark.group(1), line[mark.end():end].strip())
    return found


@dataclass(frozen=True, slots=True)
class Job:
    """A job as `scontrol show job` tells it."""

    job_id: str
    name: str
    state: str  # JobState: PENDING, RUNNING, COMPLETING, TIMEOUT, ...
    reason: str  # Reason: a pending job's wait, an ended one's cause (or "None")
    nodes: tuple[str, ...]  # NodeList, expanded; () while pending
    exit_code: int | None  # ExitCode=C:S, the batch script's
    exit_signal: int | None
    time_limit_s: int | None  # None: UNLIMITED
    run_time_s: int
    start_time: datetime | None
    end_time: datetime | None  # while running: when its time limit ends it
    partition: str
    restarts: int  # requeues
    user: str
    memory: str | None = None  # the job's memory (TRES mem=, e.g. 100M): its cgroup's limit

    @property
    def ended(self) -> bool:
        return self.state in END_STATES

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")

    @property
    def node(self) -> str | None:
        return self.nodes[0] if self.nodes else None

    def time_left_s(self, now: datetime) -> float | None:
        """Seconds until the time limit ends the running job; None when it has no limit or
        is not running."""
        if self.state != "RUNNING" or self.end_time is None or self.time_limit_s is None:
            return None
        return max(0.0, (self.end_time - now).total_seconds())


def parse_job(text: str) -> Job:
    """`scontrol show job -o J`; ValueError when it names no job."""
    fields = parse_fields(text)
    if "JobId" not in fields or "JobState" not in fields:
        raise ValueError(f"not a job record: {text.strip()[:200]!r}")
    code, _, sig = fields.get("ExitCode", "").partition(":")
    nodes = fields.get("NodeList", "(null)")
    return Job(job_id=fields["JobId"], name=fields.get("JobName", ""),
               state=fields["JobState"], reason=fields.get("Reason", "None"),
               nodes=expand_nodes(nodes) if nodes not in ("(null)", "") else (),
               exit_code=int(code) if code.isdigit() else None,
               exit_signal=int(sig) if sig.isdigit() else None,
               time_limit_s=_limit(fields.get("TimeLimit", "UNLIMITED")),
               run_time_s=_limit(fields.get("RunTime", "0")) or 0,
               start_time=_when(fields.get("StartTime")), end_time=_when(fields.get("EndTime")),
               partition=fields.get("Partition", ""),
               restarts=int(fields.get("Restarts", "0") or 0),
               user=fields.get("UserId", "").split("(", 1)[0],
               memory=_tres(fields.get("TRES", ""), "mem"))


def _tres(text: str, name: str) -> str | None:
    """One resource of a TRES list (`cpu=1,mem=100M,node=1`)."""
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key == name and value:
            return value
    return None


def _limit(text: str) -> int | None:
    if text in ("UNLIMITED", "Partition_Limit", "NONE", ""):
        return None
    if text in ("0", "00:00:00"):
        return 0
    return slurm_time_seconds(text)


def _when(text: str | None) -> datetime | None:
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


_RANGE = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?")


def expand_nodes(text: str) -> tuple[str, ...]:
    """Slurm's host list (`node-[1-3,7],gpu7`) as names."""
    names: list[str] = []
    for match in _RANGE.finditer(text.replace(" ", "")):
        stem, ranges = match.group(1).lstrip(","), match.group(2)
        if not stem:
            continue
        if ranges is None:
            names.append(stem)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{stem}{number:0{width}d}")
    return tuple(names)


@dataclass(frozen=True, slots=True)
class Queued:
    """A job's line in squeue (queue_argv): its state, reason and expected start."""

    job_id: str
    state: str
    reason: str
    start: str | None  # squeue --start's estimate; None when the scheduler has none
    nodes: str


def parse_queue(text: str) -> Queued | None:
    """queue_argv's one line, or None when the job is no longer in the queue."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5 and parts[0]:
            start = parts[3] if parts[3] not in ("N/A", "", "Unknown") else None
            return Queued(parts[0], parts[1], parts[2], start, parts[4])
    return None


# A pending job's reason (squeue's %r, scontrol's Reason), in words.
_PENDING = {
    "None": "the scheduler has not looked at it yet",
    "Priority": "jobs of higher priority are ahead of it",
    "Resources": "waiting for nodes to free up",
    "Dependency": "waiting for the jobs it depends on",
    "DependencyNeverSatisfied": "its dependency can never be satisfied",
    "BeginTime": "its begin time has not come",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "ReqNodeNotAvail": "a node it needs is not available (down, drained or reserved)",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "PartitionTimeLimit": "its time limit is over the partition's",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionConfig": "it asks for what the partition cannot give",
    "QOSMaxJobsPerUserLimit": "the QOS's limit on jobs per user is reached",
    "QOSMaxGRESPerUser": "the QOS's limit on GPUs per user is reached",
    "QOSGrpGRES": "the QOS's group GPU limit is reached",
    "AssocMaxJobsLimit": "the account's limit on jobs is reached",
    "AssocGrpGRES": "the account's GPU limit is reached",
    "Reservation": "waiting for its reservation",
    "Licenses": "waiting for licenses",
    "launch failed requeued held": "its launch failed; it is held after requeue",
}
# Reasons after which the job cannot start by itself: the user must act.
_NEVER = ("DependencyNeverSatisfied", "JobHeldUser", "JobHeldAdmin", "PartitionTimeLimit",
          "PartitionNodeLimit", "PartitionConfig", "PartitionDown", "PartitionInactive",
          "launch failed requeued held", "BadConstraints", "InvalidAccount", "InvalidQOS")


def pending_words(reason: str) -> str:
    """A pending job's reason in words, the scheduler's own word kept: `Resources: waiting
    for nodes to free up`."""
    words = _PENDING.get(reason)
    if words is None and reason.startswith(("QOS", "Assoc")):
        words = "a limit of its QOS or account is reached"
    return f"{reason}: {words}" if words else reason


def never_starts(reason: str) -> bool:
    """The job waits on something that will not change without someone acting (held, an
    impossible dependency, a request over the partition's limits)."""
    return reason in _NEVER


def queued_summary(queued: Queued) -> str:
    """The queued phase's line: `queued (Resources: waiting ...), expected start 16:20:01`."""
    start = f", expected start {queued.start}" if queued.start else ""
    never = "; it cannot start until someone acts" if never_starts(queued.reason) else ""
    return f"queued ({pending_words(queued.reason)}){start}{never}"


def queue_detail(queued: Queued) -> str:
    """The queued phase's words on the timeline: `job 494583 · Resources: waiting for nodes to
    free up · expected start 2026-12-07T16:20:01`."""
    start = f" · expected start {queued.start}" if queued.start else ""
    never = " · it cannot start until someone acts" if never_starts(queued.reason) else ""
    return f"job {queued.job_id} · {pending_words(queued.reason)}{start}{never}"


def allocated_summary(job: Job) -> str:
    """`allocated on node-07 (+3)`."""
    if not job.nodes:
        return "allocated"
    more = f" (+{len(job.nodes) - 1})" if len(job.nodes) > 1 else ""
    return f"allocated on {job.nodes[0]}{more}"


def job_words(job: Job, now: datetime) -> str:
    """A job in `status`: `job 494583 RUNNING on node-07, 12 min of 4 h left`."""
    where = f" on {allocated_summary(job).removeprefix('allocated on ')}" if job.nodes else ""
    left = job.time_left_s(now)
    limit = (f", {time_left_words(left, job.time_limit_s)}"
             if left is not None and job.time_limit_s else "")
    return f"job {job.job_id} {job.state}{where}{limit}"


def time_left_words(left_s: float, limit_s: float) -> str:
    """`12 min of 4 h left`."""
    return f"{duration_words(left_s)} of {duration_words(limit_s)} left"


@dataclass(frozen=True, slots=True)
class JobClock:
    """A running job's time, for a header that ticks: its time limit and when it ends, on
    the console's clock (seconds since the epoch)."""

    job_id: str
    node: str | None
    limit_s: int
    ends_at: float

    @staticmethod
    def of(job: Job, now: float, wall: datetime) -> JobClock | None:
        """The clock of `job` as asked at `wall` (the scheduler's local time) = `now`; None
        when it has no time limit or is not running."""
        left = job.time_left_s(wall)
        if left is None or not job.time_limit_s:
            return None
        return JobClock(job.job_id, job.node, job.time_limit_s, now + left)

    def words(self, now: float) -> str:
        """`job 494583 on node-07 · 12 min of 4 h left`."""
        where = f" on {self.node}" if self.node else ""
        left = max(0.0, self.ends_at - now)
        return f"job {self.job_id}{where} · {time_left_words(left, self.limit_s)}"


def duration_words(seconds: float) -> str:
    """`4 h`, `1 h 30 min`, `58 s`: a time limit or an interval for a sentence."""
    seconds = round(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "",
             f"{minutes} min" if minutes else "",
             f"{secs} s" if secs and not days and not hours else ""]
    return " ".join(p for p in parts if p) or "0 s"


def node_states_argv(nodes: Sequence[str]) -> list[str]:
    """Each of `nodes` with its state and address: `node-2|down*|10.230.2.2`."""
    return ["sinfo", "--noheader", "--Node", f"--nodes={','.join(nodes)}", "--format=%N|%t|%o"]


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as sinfo tells it: its name, short state (idle, alloc, mix, down*, ...), and the
    address the other nodes reach it at (NodeAddr)."""

    name: str
    state: str
    address: str

    @property
    def lost(self) -> bool:
        """Not answering the scheduler (`*`), or down, drained, failing."""
        return self.state.endswith("*") or self.state.rstrip("*~#!%$@^-") in (
            "down", "drain", "drng", "fail", "failg")


def parse_node_states(text: str) -> tuple[NodeState, ...]:
    """node_states_argv's lines, each node once (sinfo lists a node per partition)."""
    found: dict[str, NodeState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0]:
            found.setdefault(parts[0], NodeState(parts[0], parts[1], parts[2] or parts[0]))
    return tuple(found.values())


def step_failed_words(job_id: str, node: str, process: str, holding: Sequence[str]) -> str:
    """A several-node job whose step died on one node while the job runs on: which node, and
    that the others are still holding their GPUs until someone ends the job."""
    others = ", ".join(holding)
    verb = "holds its" if len(holding) == 1 else "hold their"
    return (f"{process} died on {node}; job {job_id} is still running: {others} still {verb} "
            f"GPUs until the job ends (specconsole kill, or scancel {job_id}, releases them)")


@dataclass(frozen=True, slots=True)
class SchedulerEnd:
    """How the scheduler says the job ended."""

    state: str
    job_id: str
    node: str | None
    time_limit_s: int | None
    exit_code: int | None
    exit_signal: int | None
    reason: str
    nodes: tuple[str, ...] = ()  # all of the job's, when it had several
    requeued: bool = False  # the job is back in the queue: its script runs again
    cancelled_by: str | None = None  # `user alice (uid 1234)`, as the accounting says
    accounting: bool | None = None  # False: the cluster keeps none (sacct says so)
    memory: str | None = None  # the job's memory limit (OUT_OF_MEMORY)

    @property
    def schedulers_doing(self) -> bool:
        """The scheduler ended it (time limit, scancel, preemption, a node's failure): what
        died with it are its victims, not a crash."""
        return self.state in SCHEDULER_ENDS

    def words(self, ready_for_s: float | None = None) -> str:
        """The end in words: `TIMEOUT: the job's 1 min time limit ended it, 58 s after READY`."""
        after = f", {duration_words(ready_for_s)} after READY" if ready_for_s is not None else ""
        on = f" on {self.node}" if self.node else ""
        of = f" (of the job's {', '.join(self.nodes)})" if len(self.nodes) > 1 else ""
        if self.state == "TIMEOUT":
            limit = (f"{duration_words(self.time_limit_s)} " if self.time_limit_s else "")
            return f"TIMEOUT: the job's {limit}time limit ended it{after}"
        if self.state == "CANCELLED":
            by = f" by {self.cancelled_by}" if self.cancelled_by else ""
            unknown = ("; this cluster keeps no accounting to say by whom"
                       if self.accounting is False else "")
            return f"CANCELLED: job {self.job_id} was cancelled{by} (scancel){after}{unknown}"
        if self.state == "NODE_FAIL":
            return f"NODE_FAIL: the scheduler lost node {self.node or '?'}{of}{after}"
        if self.state == "PREEMPTED" and self.requeued:
            served = (f" after {duration_words(ready_for_s)} of serving"
                      if ready_for_s is not None else " before READY")
            return (f"PREEMPTED: preempted by a higher-priority job{on}{served}; requeued "
                    f"(job {self.job_id} back in the queue)")
        if self.state == "PREEMPTED":
            return f"PREEMPTED: a job of a higher priority took its node{on}{after}"
        if self.state == "OUT_OF_MEMORY":
            limit = f" ({self.memory})" if self.memory else ""
            return (f"OUT_OF_MEMORY: the job's memory limit{limit} was reached{on}: the "
                    f"kernel's cgroup OOM killer ended its processes{after}")
        if self.state == "REQUEUED":
            return (f"REQUEUED: the scheduler took job {self.job_id} off {self.node or '?'} and "
                    f"put it back in the queue (a node's failure or a preemption){after}")
        if self.state == "BOOT_FAIL":
            return f"BOOT_FAIL: node {self.node or '?'} failed to boot for the job"
        if self.state == "DEADLINE":
            return f"DEADLINE: the job's deadline passed{after}"
        if self.state == "FAILED":
            how = (f"signal {self.exit_signal}" if self.exit_signal
                   else f"exit code {self.exit_code}")
            return f"FAILED: the job's script ended with {how}{on}{after}"
        return f"COMPLETED: the job's script ended with exit code 0{after}"


def scheduler_end(job: Job) -> SchedulerEnd | None:
    """The job's end as the scheduler tells it, or None while it is not over."""
    if not job.ended:
        return None
    return SchedulerEnd(job.state, job.job_id, job.node, job.time_limit_s, job.exit_code,
                        job.exit_signal, job.reason, job.nodes, memory=job.memory)


def allocation_end(job: Job, restarts: int, node: str | None) -> SchedulerEnd | None:
    """The end of the allocation a run had on `node` (the job's Restarts were `restarts`
    then): the job's end, or its requeue (Restarts counted up: back in the queue, or already
    running again elsewhere), else None."""
    end = scheduler_end(job)
    if end is not None or (job.restarts <= restarts and not job.pending):
        return end
    return SchedulerEnd("REQUEUED", job.job_id, node, job.time_limit_s, None, None, job.reason,
                        job.nodes, requeued=True)


_STEPD_CANCEL = re.compile(r"\*\*\* JOB (\d+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO (.+?))? \*\*\*")


def preemption_seen(end: SchedulerEnd, output: str, nodes: Sequence[str] = ()) -> SchedulerEnd:
    """A requeue told as what it was: the job output's last slurmstepd line for the job says
    `*** JOB J ON NODE CANCELLED AT T DUE TO PREEMPTION ***` for the node the run had, or one of
    the `nodes` of its allocation (the line is the batch step's, on a several-node job's first
    node) (the lane's Slurm 22.05 writes it when the scheduler preempts the job); else it stays
    REQUEUED (a node's failure writes no such line)."""
    said = [m for m in _STEPD_CANCEL.finditer(output) if m.group(1) == end.job_id]
    if end.requeued and said and said[-1].group(2) in (end.node, *nodes) \
            and said[-1].group(4) == "PREEMPTION":
        return replace(end, state="PREEMPTED")
    return end


def requeue_detail(end: SchedulerEnd, queued: Queued) -> str:
    """The queued phase's words after a requeue: `preempted (requeued): job 494583 back in the
    queue (BeginTime: ...)`."""
    what = "preempted (requeued)" if end.state == "PREEMPTED" else "requeued"
    start = f" · expected start {queued.start}" if queued.start else ""
    return (f"{what}: job {queued.job_id} back in the queue "
            f"({pending_words(queued.reason)}){start}")


@dataclass(frozen=True, slots=True)
class Accounted:
    """The job's line in the accounting (sacct_argv): its state and who cancelled it."""

    state: str
    by_uid: int | None  # `CANCELLED by 1234`


_SACCT_STATE = re.compile(r"^([A-Z_]+)(?: by (\d+))?$")


def parse_sacct(text: str, job_id: str) -> Accounted | None:
    """sacct_argv's answer: `494583|CANCELLED by 1234` (sacct prints a cancelled job's state
    as `"%s by %u"` with the requester's uid: SchedMD/slurm src/sacct/print.c, PRINT_STATE);
    None when the job has no line."""
    for line in text.splitlines():
        jid, _, state = line.strip().partition("|")
        match = _SACCT_STATE.match(state.strip())
        if jid == job_id and match is not None:
            uid = match.group(2)
            return Accounted(match.group(1), int(uid) if uid is not None else None)
    return None


def no_accounting(stderr: str) -> bool:
    """sacct on a cluster that keeps no accounting (AccountingStorageType=
    accounting_storage/none): `Slurm accounting storage is disabled`, exit 1."""
    return "accounting storage is disabled" in stderr


@dataclass(frozen=True, slots=True)
class JobProc:
    """A process of a job on its node (its environment holds SLURM_JOB_ID): to find the server
    in a job someone else submitted."""

    pid: int
    ppid: int
    start: int  # clock ticks after boot (/proc/PID/stat)
    comm: str
    cmd: str


# What a job script runs around its server: shells, Slurm's own tools, waiting.
_AROUND_SERVER = frozenset({"bash", "sh", "dash", "zsh", "ksh", "srun", "slurmstepd", "sleep",
                            "timeout", "tee", "env", "wait", "time"})


def job_server(procs: Sequence[JobProc]) -> JobProc | None:
    """The server's top process among a job's: the oldest of the processes that are neither a
    shell nor Slurm's tool and whose parent is none of those (the script's `vllm serve`, not
    its engine core or workers, whatever the script or srun around it)."""
    served = [p for p in procs if p.comm not in _AROUND_SERVER]
    pids = {p.pid for p in served}
    return min((p for p in served if p.ppid not in pids), key=lambda p: (p.start, p.pid),
               default=None)


def parse_job_procs(text: str) -> tuple[JobProc, ...]:
    """The node's answer to tui.remote.slurm's finder: JSON, a list of objects."""
    try:
        rows = json.loads(text)
        return tuple(JobProc(int(r["pid"]), int(r["ppid"]), int(r["start"]), str(r["comm"]),
                             str(r["cmd"])) for r in rows)
    except (ValueError, KeyError, TypeError):
        return ()


@dataclass(frozen=True, slots=True)
class FirstDeath:
    """What the agent saw die first: the process's name, and when (seconds, the agent's
    clock) against the scheduler's end time on the same clock."""

    process: str
    at: float


def end_verdict(end: SchedulerEnd, death: FirstDeath | None, ended_at: float | None,
                ready_for_s: float | None = None, margin_s: float = 2.0) -> str:
    """The run's verdict when its job is over: the scheduler's end, and a death the agent saw
    before the scheduler acted is the death's (a worker's own crash stays the worker's; the
    job failing after it is its consequence), except under the job's memory limit, whose
    OOM killer acts while the job runs (OUT_OF_MEMORY). A death at or after a time limit, a
    scancel, a preemption or a node's failure (within `margin_s` of `ended_at`) is the
    scheduler's doing, never a crash."""
    said = end.words(ready_for_s)
    if death is None:
        return said
    if end.state == "OUT_OF_MEMORY":  # the kernel killed it at the job's limit, whenever
        return f"{said}; {death.process} was killed by it"
    before = ended_at is not None and death.at < ended_at - margin_s
    if end.schedulers_doing and not before:
        return f"{said}; {death.process} was ended by it"
    if end.schedulers_doing:
        return f"{death.process} died first; then {said}"
    return f"{death.process} died; the job then ended ({said})"
