"""Slurm on the login node: submit a run's job, ask the scheduler about it, cancel it, and reach
its node (reach_node: as a step of the job, StepSession, or over SSH, NodeSession) so that the
agent runs there as on any host.

The job script and the reading of the scheduler's answers are tui.core.slurm's; this module
runs the commands through the login node's session and writes the run directory's files.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tui.core import slurm
from tui.core.command import host_python, served_by
from tui.core.errors import AgentError, SessionError
from tui.core.profile import HostConfig, Profile
from tui.core.protocol import agent_stdin
from tui.remote.agent_archive import agent_archive
from tui.remote.interface import CommandResult, Session, Stream, one_line
from tui.remote.launcher import LaunchPlan, agent_target

AGENT_STDIN = "agent.stdin"  # the agent's launch spec (and archive) the job script reads
JOB_RECORD = "slurm.json"  # the run's job id, for whoever finds the run directory later
POLL_S = 1.0
# The processes of job sys.argv[1] on this node (SLURM_JOB_ID in their environment), the finder's
# own ancestry (the step it runs in) left out: JSON for tui.core.slurm.parse_job_procs.
_JOB_PROCS = (
    "import os,sys,json\n"
    "j=b'SLURM_JOB_ID='+sys.argv[1].encode();me=set();p=os.getpid()\n"
    "while p>1 and p not in me:\n"
    " me.add(p)\n"
    " try:p=int(open(f'/proc/{p}/stat').read().rsplit(')',1)[1].split()[1])\n"
    " except (OSError,ValueError,IndexError):break\n"
    "out=[]\n"
    "for d in os.listdir('/proc'):\n"
    " if not d.isdigit() or int(d) in me:continue\n"
    " try:\n"
    "  if j not in open(f'/proc/{d}/environ','rb').read().split(b'\\0'):continue\n"
    "  head,tail=open(f'/proc/{d}/stat').read().rsplit(')',1);f=tail.split()\n"
    "  cmd=open(f'/proc/{d}/cmdline','rb').read().replace(b'\\0',b' ')\n"
    "  out.append({'pid':int(d),'ppid':int(f[1]),'start':int(f[19]),"
    "'comm':head.split('(',1)[1],'cmd':cmd.decode('utf-8','replace').strip()})\n"
    " except (OSError,ValueError,IndexError):pass\n"
    "print(json.dumps(out))\n")
_RUN_DIR = ("import os,sys;d=os.path.abspath(os.path.expanduser(sys.argv[1]));"
            "os.makedirs(d,0o700);print(d)")
_WRITE = ("import os,sys;"
          "f=os.open(sys.argv[1],os.O_WRONLY|os.O_CREAT|os.O_EXCL,int(sys.argv[2],8));"
          "o=os.fdopen(f,'wb');o.write(sys.stdin.buffer.read());o.close()")
# written whole, then renamed into place: whoever waits for the file never reads half of it
_WRITE_WHOLE = ("import os,sys;t=sys.argv[1]+'.part';"
                "f=os.open(t,os.O_WRONLY|os.O_CREAT|os.O_EXCL,0o600);"
                "o=os.fdopen(f,'wb');o.write(sys.stdin.buffer.read());o.close();"
                "os.rename(t,sys.argv[1])")


class JobSession(Session):
    """Commands on a running job's node, however it is reached; the login node's session is
    kept beside (the scheduler is asked there). Closing it closes both."""

    is_local = False

    def __init__(self, login: Session, job_id: str, node: str) -> None:
        self.login = login
        self.job_id = job_id
        self.node = node
        self.host = f"{node} (job {job_id})"

    async def leave(self) -> Session:
        """The login node's session alone, once the job is over (its node no longer reached)."""
        return self.login


class StepSession(JobSession):
    """Commands on a job's node, each a step of the job run from the login node (`srun --jobid
    J --overlap -w NODE`: tui.core.slurm.step_argv), its stdin and stdout forwarded; no SSH to
    the node."""

    async def run(self, argv: list[str], stdin: bytes = b"",
                  timeout: float | None = None) -> CommandResult:
        return await self.login.run(slurm.step_argv(self.job_id, self.node, argv), stdin,
                                    timeout)

    async def stream(self, argv: list[str], stdin: bytes = b"") -> Stream:
        return await self.login.stream(slurm.step_argv(self.job_id, self.node, argv), stdin)

    async def close(self) -> None:
        await self.login.close()


class NodeSession(JobSession):
    """Commands on a job's node over an SSH session of its own (reach = "ssh": the node's
    sshd lets the job's owner in, pam_slurm_adopt adopting the session into the job)."""

    def __init__(self, login: Session, job_id: str, node: str, ssh: Session) -> None:
        super().__init__(login, job_id, node)
        self.ssh = ssh

    async def run(self, argv: list[str], stdin: bytes = b"",
                  timeout: float | None = None) -> CommandResult:
        return await self.ssh.run(argv, stdin, timeout)

    async def stream(self, argv: list[str], stdin: bytes = b"") -> Stream:
        return await self.ssh.stream(argv, stdin)

    async def leave(self) -> Session:
        await self.ssh.close()
        return self.login

    async def close(self) -> None:
        try:
            await self.ssh.close()
        finally:
            await self.login.close()


Opener = Callable[[HostConfig], Awaitable[Session]]


async def node_address(session: Session, node: str) -> str:
    """Where the scheduler reaches `node` (its NodeAddr, as sinfo tells it): SSH reaches it
    there; the node's name when sinfo names no address."""
    found = await node_states(session, (node,))
    return next((n.address for n in found if n.name == node), node)


async def reach_node(login: Session, profile: Profile, job_id: str, node: str,
                     opener: Opener) -> JobSession:
    """The session on a running job's node as the profile's [slurm] reach says: a step of the
    job (the default, and an attached job's), or SSH to the node's address (`opener`, the
    [host] of tui.core.slurm.node_host: through the login node when that is remote, its host
    keys checked as any host's)."""
    if profile.slurm is None or profile.slurm.reach == "step":
        return StepSession(login, job_id, node)
    address = await node_address(login, node)
    ssh = await opener(slurm.node_host(profile.host, address))
    return NodeSession(login, job_id, node, ssh)


@dataclass(frozen=True, slots=True)
class Submitted:
    run_id: str
    run_dir: str
    job_id: str
    script: str  # the job script's path, kept in the run directory


async def _checked(session: Session, argv: list[str], stdin: bytes = b"",
                   timeout: float = 60) -> str:
    done = await session.run(argv, stdin, timeout)
    if done.returncode != 0:
        said = done.stderr_text().strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise SessionError(session.host, f"{argv[0]} failed: {one_line(said[0])}")
    return done.stdout.decode("utf-8", "replace")


def launch_spec(profile: Profile, plan: LaunchPlan) -> dict[str, object]:
    """The agent's launch spec inside the job: the bare launch's, into the run directory made
    beforehand (`prepared`), staying until the server ends (`hold`)."""
    return {"run_id": plan.run_id, "runs_dir": profile.host.runs_dir,
            "profile_key": profile.key, "argv": plan.argv, "env": plan.env,
            "redact": list(plan.secrets), "cwd": profile.host.workdir,
            "served": served_by(profile).to_wire(), "container": None,
            "prepared": True, "hold": True}


async def test_only(session: Session, profile: Profile) -> slurm.TestOnly:
    """Ask the scheduler whether the profile's job could run, and when (sbatch --test-only,
    the script on stdin: nothing is written or submitted)."""
    script = slurm.job_script(profile, "test-only", "/tmp", ["true"])
    done = await session.run(slurm.test_only_argv(), script.encode(), 60)
    if done.returncode == 127:
        return slurm.TestOnly(False, error="sbatch is not installed on the login node "
                                           f"{profile.host.target}")
    return slurm.parse_test_only(done.returncode, done.stderr_text())


async def submit(session: Session, profile: Profile, plan: LaunchPlan) -> Submitted:
    """Make the run directory on the login node, write the agent's launch spec and the job
    script into it (both kept: the script can be read and rerun), sbatch it, record the job
    id there."""
    return await _submit(session, profile, plan.run_id, lambda _: launch_spec(profile, plan))


async def submit_nodes(session: Session, profile: Profile, run_id: str,
                       wait_s: float) -> Submitted:
    """A several-node job: its directory (`run_id`, beside the members' runs) holds the job
    script, which starts the agent on every node, each waiting up to `wait_s` for its member's
    launch (request_launch) as the members join in turn."""
    return await _submit(session, profile, run_id, lambda run_dir: {
        "request": f"{run_dir}/{slurm.LAUNCH_REQUEST}", "wait_s": wait_s})


async def _submit(session: Session, profile: Profile, run_id: str,
                  spec_of: Callable[[str], dict[str, object]]) -> Submitted:
    python = host_python(profile)
    runs_dir = profile.host.runs_dir.rstrip("/")
    run_dir = (await _checked(session, [python, "-c", _RUN_DIR, f"{runs_dir}/{run_id}"])).strip()
    target = agent_target(profile)
    stdin_path = f"{run_dir}/{AGENT_STDIN}"
    # the archive and the spec (the server's environment, secrets too) readable by the user only
    await _checked(session, [python, "-c", _WRITE, stdin_path, "600"],
                   agent_stdin(agent_archive().data, spec_of(run_dir)))
    script = slurm.job_script(profile, run_id, run_dir, target.argv("launch"), stdin=stdin_path)
    script_path = f"{run_dir}/{slurm.JOB_SCRIPT}"
    await _checked(session, [python, "-c", _WRITE, script_path, "700"], script.encode())
    try:
        job_id = slurm.parse_job_id(await _checked(session, slurm.submit_argv(script_path)))
    except ValueError as exc:
        raise SessionError(session.host, str(exc)) from None
    await _checked(session, [python, "-c", _WRITE, f"{run_dir}/{JOB_RECORD}", "600"],
                   json.dumps({"job_id": job_id, "script": script_path}).encode())
    return Submitted(run_id, run_dir, job_id, script_path)


async def request_launch(session: Session, profile: Profile, plan: LaunchPlan, job_dir: str,
                         job_id: str, node: str, more_on_node: bool = False) -> str:
    """A member of a several-node job: its run directory made on the login node (the job
    recorded in it, with its node), then its launch spec handed to the agent waiting on `node`
    (slurm.LAUNCH_REQUEST in the job's directory), saying whether another member's launch
    will follow on that node (`more_on_node`); the run directory."""
    python = host_python(profile)
    runs_dir = profile.host.runs_dir.rstrip("/")
    run_dir = (await _checked(session, [python, "-c", _RUN_DIR,
                                        f"{runs_dir}/{plan.run_id}"])).strip()
    await _checked(session, [python, "-c", _WRITE, f"{run_dir}/{JOB_RECORD}", "600"],
                   json.dumps({"job_id": job_id, "script": f"{job_dir}/{slurm.JOB_SCRIPT}",
                               "node": node}).encode())
    request = f"{job_dir}/{slurm.LAUNCH_REQUEST.format(node=node)}"
    await _checked(session, [python, "-c", _WRITE_WHOLE, request], json.dumps(
        {**launch_spec(profile, plan), "more_on_node": more_on_node}).encode())
    return run_dir


async def node_states(session: Session, nodes: Sequence[str]) -> tuple[slurm.NodeState, ...]:
    """The nodes' states and addresses, as sinfo tells them."""
    return slurm.parse_node_states(await _checked(session, slurm.node_states_argv(nodes)))


async def job_of(session: Session, profile: Profile, run_dir: str) -> str | None:
    """The job id recorded in a run directory (JOB_RECORD), or None when there is none."""
    job_id = (await _job_record(session, profile, run_dir)).get("job_id")
    return str(job_id) if job_id else None


async def node_of(session: Session, profile: Profile, run_dir: str) -> str | None:
    """The node recorded in a several-node job's member's run directory, or None."""
    node = (await _job_record(session, profile, run_dir)).get("node")
    return str(node) if node else None


async def _job_record(session: Session, profile: Profile, run_dir: str) -> dict[str, object]:
    done = await session.run([host_python(profile), "-c",
                              "import sys;sys.stdout.write(open(sys.argv[1]).read())",
                              f"{run_dir}/{JOB_RECORD}"], timeout=30)
    if done.returncode != 0:
        return {}
    try:
        found = json.loads(done.stdout.decode("utf-8", "replace"))
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


async def job_server(step: Session, profile: Profile, job_id: str) -> slurm.JobProc | None:
    """The server's top process in a running job someone else submitted, found on its node
    through `step` (a StepSession: its environment holds SLURM_JOB_ID; tui.core.slurm.job_server
    chooses); None when the job runs none."""
    found = await _checked(step, [host_python(profile), "-c", _JOB_PROCS, job_id])
    return slurm.job_server(slurm.parse_job_procs(found))


async def hold_for_kill(session: Session, profile: Profile, run_dir: str) -> None:
    """Keep the job after its server ends while the console kills and verifies through a step
    of it (the agent's launch.KILL_HOLD); scancel ends it after."""
    await _checked(session, [host_python(profile), "-c",
                             "import sys;open(sys.argv[1],'a').close()", f"{run_dir}/kill.hold"])


async def show_job(session: Session, job_id: str) -> slurm.Job | None:
    """The job as scontrol tells it; None once the scheduler has forgotten it (MinJobAge)."""
    done = await session.run(slurm.show_job_argv(job_id), timeout=30)
    if done.returncode != 0:
        if "Invalid job id" in done.stderr_text():
            return None
        raise SessionError(session.host, f"scontrol show job {job_id} failed: "
                                         f"{one_line(done.stderr_text().strip())}")
    return slurm.parse_job(done.stdout.decode("utf-8", "replace"))


async def output_tail(session: Session, profile: Profile, path: str,
                      size: int = 64 << 10) -> str:
    """The last `size` bytes of the job's output file (slurmstepd's lines end it); "" when it
    cannot be read."""
    done = await session.run([host_python(profile), "-c", _TAIL, path, str(size)], timeout=30)
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else ""


_TAIL = ("import os,sys;f=open(sys.argv[1],'rb');f.seek(0,2);n=f.tell();"
         "f.seek(max(0,n-int(sys.argv[2])));sys.stdout.buffer.write(f.read())")
_USER = "import pwd,sys;print(pwd.getpwuid(int(sys.argv[1])).pw_name)"


@dataclass(frozen=True, slots=True)
class CancelledBy:
    """Who cancelled a job, as far as the cluster keeps it: `user alice (uid 1234)`, or None;
    `accounting` False when the cluster keeps no accounting at all."""

    who: str | None
    accounting: bool


async def cancelled_by(session: Session, profile: Profile, job_id: str) -> CancelledBy:
    """sacct's word on who cancelled the job (`CANCELLED by UID`), the uid named by the login
    node's user database; scontrol never says who."""
    done = await session.run(slurm.sacct_argv(job_id), timeout=30)
    if done.returncode != 0:
        return CancelledBy(None, not slurm.no_accounting(done.stderr_text()))
    line = slurm.parse_sacct(done.stdout.decode("utf-8", "replace"), job_id)
    if line is None or line.by_uid is None:
        return CancelledBy(None, True)
    name = await session.run([host_python(profile), "-c", _USER, str(line.by_uid)], timeout=30)
    user = name.stdout.decode("utf-8", "replace").strip() if name.returncode == 0 else ""
    who = f"user {user} (uid {line.by_uid})" if user else f"uid {line.by_uid}"
    return CancelledBy(who, True)


async def queued(session: Session, job_id: str) -> slurm.Queued | None:
    done = await session.run(slurm.queue_argv(job_id), timeout=30)
    return slurm.parse_queue(done.stdout.decode("utf-8", "replace"))


async def wait_started(session: Session, job_id: str,
                       on_queued: Callable[[slurm.Queued], None]) -> slurm.Job:
    """Follow the job until it runs on a node or ends; each change of its queue line (state,
    reason, expected start) is told to `on_queued`."""
    last: slurm.Queued | None = None
    while True:
        job = await show_job(session, job_id)
        if job is None:
            raise AgentError(session.host, f"job {job_id} vanished from the scheduler")
        if job.ended or (job.state == "RUNNING" and job.node is not None):
            return job
        if job.pending:
            line = await queued(session, job_id)
            if line is not None and line != last:
                on_queued(line)
                last = line
        await asyncio.sleep(POLL_S)


async def cancel(session: Session, job_id: str, timeout: float = 60) -> slurm.Job | None:
    """scancel, then wait until the job has left the queue (ended, not completing); the job as
    it ended, or None once forgotten. SessionError when it is still listed after `timeout`."""
    done = await session.run(slurm.cancel_argv(job_id), timeout=60)
    said = one_line(done.stderr_text().strip())
    if done.returncode != 0 and "already completing or completed" not in said:
        raise SessionError(session.host, f"scancel {job_id} failed: {said}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        job = await show_job(session, job_id)
        line = await queued(session, job_id)
        if (job is None or job.ended) and line is None:
            return job
        if loop.time() > deadline:
            state = job.state if job is not None else line.state if line else "?"
            raise SessionError(session.host, f"job {job_id} is still listed ({state}) "
                                             f"{timeout:g} s after scancel")
        await asyncio.sleep(0.5)
