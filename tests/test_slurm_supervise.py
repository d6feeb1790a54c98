"""The supervisor's side of a job's death: a death the agent reports while the scheduler is
ending the job is told as the scheduler's from its first word (the Died event itself), and a
worker's own death while the job runs stays the worker's. The login node here is a stand-in
session that answers `scontrol show job` with the lane's real text (tests/test_slurm_core.py).
Then how the job's node is reached, as the profile's [slurm] reach says."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_slurm_core import NODE_2, TIMEOUT_JOB

from tui.core.profile import HostConfig, loads_profile
from tui.core.protocol import ProcExit
from tui.core.state import Died
from tui.remote import slurm as remote_slurm
from tui.remote.interface import CommandResult, Session, Stream
from tui.supervise.events import KillDone, RunInfo
from tui.supervise.slurmjob import JobRun, JobSupervisor
from tui.supervise.supervisor import Supervisor

PROFILE = ('[host]\ntarget = "local"\n[server]\nengine = "vllm"\nmodel = "/m"\n'
           '[slurm]\npartition = "batch"\ntime = "1"\n')


class LoginNode(Session):
    """Answers `scontrol show job -o 19` with `answer` (and sinfo's node states with `nodes`);
    nothing else is asked of it."""

    host = "login"
    is_local = True

    def __init__(self, answer: str, nodes: str = "") -> None:
        self.answer = answer
        self.nodes = nodes
        self.asked: list[list[str]] = []

    async def run(self, argv: list[str], stdin: bytes = b"",
                  timeout: float | None = None) -> CommandResult:
        self.asked.append(argv)
        if argv[0] == "sinfo" and self.nodes:
            return CommandResult(0, self.nodes.encode(), b"")
        assert argv[:3] == ["scontrol", "show", "job"], argv
        return CommandResult(0, self.answer.encode(), b"")

    async def stream(self, argv: list[str], stdin: bytes = b"") -> Stream:
        raise AssertionError(f"not streamed here: {argv}")

    async def close(self) -> None:
        pass


async def _death_in_job(state: str, tmp_path: Path, login: LoginNode | None = None
                        ) -> tuple[Died, LoginNode]:
    sup = Supervisor(loads_profile(PROFILE, tmp_path / "job.toml"))
    login = login or LoginNode(TIMEOUT_JOB.replace("JobState=TIMEOUT", f"JobState={state}"))
    sup.login = sup.session = login
    sup.job = JobRun("19", node="node-1")
    events = sup.subscribe()
    sup.machine.started(100, sup.clock(), sup.clock())
    sup._dispatch(ProcExit(100, "APIServer", None, 15, sup.clock(), True))
    while not isinstance(event := await asyncio.wait_for(events.get(), 5), Died):
        pass
    return event, login


async def test_a_death_while_the_scheduler_ends_the_job_is_its_doing_from_the_start(
        tmp_path: Path) -> None:
    died, login = await _death_in_job("TIMEOUT", tmp_path)
    assert login.asked == [["scontrol", "show", "job", "-o", "19"]]
    assert died.death.ended_by is not None
    assert died.death.ended_by.startswith("TIMEOUT: the job's 1 min time limit ended it")


async def test_a_death_while_the_job_runs_stays_the_processs(tmp_path: Path) -> None:
    died, _ = await _death_in_job("RUNNING", tmp_path)
    assert died.death.ended_by is None
    assert died.death.summary().startswith("APIServer (pid 100) died, signal 15")


async def test_node_fail_of_a_two_node_job_names_the_node_the_scheduler_lost(
        tmp_path: Path) -> None:
    """The member on the first node sees its server end as the scheduler ends the job for the
    second node's failure: the words name node-2 (sinfo: not responding), not the job's first."""
    job = (TIMEOUT_JOB.replace("JobState=TIMEOUT Reason=TimeLimit", "JobState=NODE_FAIL "
                               "Reason=NodeDown").replace("NodeList=node-1", "NodeList=node-[1-2]")
           .replace("NumNodes=1", "NumNodes=2"))
    login = LoginNode(job, "node-1|alloc|10.230.1.2\nnode-2|down*|10.230.2.2\n")
    died, _ = await _death_in_job("NODE_FAIL", tmp_path, login)
    assert died.death.ended_by == ("NODE_FAIL: the scheduler lost node node-2 (of the job's "
                                   "node-1, node-2)")
    assert login.asked[1][:3] == ["sinfo", "--noheader", "--Node"]


class Scheduler(Session):
    """A login node whose scheduler cancels job 19: scancel answers, then scontrol shows it
    CANCELLED (the lane's real record) and squeue no longer lists it."""

    host = "login"
    is_local = True

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    async def run(self, argv: list[str], stdin: bytes = b"",
                  timeout: float | None = None) -> CommandResult:
        self.asked.append(argv)
        if argv[0] == "scontrol":
            return CommandResult(0, TIMEOUT_JOB.replace("JobState=TIMEOUT Reason=TimeLimit",
                                                        "JobState=CANCELLED Reason=None")
                                 .encode(), b"")
        assert argv[0] in ("scancel", "squeue", "sacct"), argv
        return CommandResult(0, b"", b"")

    async def stream(self, argv: list[str], stdin: bytes = b"") -> Stream:
        raise AssertionError(f"not streamed here: {argv}")

    async def close(self) -> None:
        pass


async def test_killing_someone_elses_job_is_the_schedulers_kill_never_a_step(
        tmp_path: Path) -> None:
    """An attached job (`attach --slurm-job`, no script of ours), the kill confirmed: scancel,
    then the job followed out of the queue; nothing is run on its node (a step's kill would end
    the owner's script, and the step reporting it, before it was verified)."""
    sup = Supervisor(loads_profile(PROFILE, tmp_path / "job.toml"))
    login = Scheduler()
    sup.login = login
    sup.session = remote_slurm.StepSession(login, "19", "node-1")
    sup.job = JobRun("19", script=None, node="node-1")
    sup.run = RunInfo("attached-job19", str(tmp_path), 4242, sup.clock(), attached=True,
                      owner="job 19 of user alice on node-1: ")
    events = sup.subscribe()
    killed = await sup.kill(2.0)
    assert killed.remaining == () and killed.gpu_released is None
    assert login.asked[0] == ["scancel", "19"], login.asked
    assert not any(argv[0] == "srun" for argv in login.asked), "nothing run on the node"
    assert [s.step for s in sup.last_kill_steps] == ["scancel"]
    seen = []
    while not events.empty():
        seen.append(events.get_nowait())
    assert any(isinstance(e, KillDone) for e in seen)
    assert sup.job.end is not None and sup.job.end.state == "CANCELLED"


def test_the_supervisor_has_all_that_job_follow_asks_of_it(tmp_path: Path) -> None:
    """JobFollow names what it needs of its supervisor (JobSupervisor, so that slurmjob need
    not import the supervisor's module): every field and method of it is the Supervisor's."""
    sup = Supervisor(loads_profile(PROFILE, tmp_path / "job.toml"))
    needed = {*JobSupervisor.__annotations__,
              *(name for name, member in vars(JobSupervisor).items()
                if callable(member) and not name.startswith("_"))}
    assert {"job", "login", "session", "emit", "begin", "record"} <= needed
    assert sorted(name for name in needed if not hasattr(sup, name)) == []


class Recorder(Session):
    """A session that answers every command with `answer` and records what it was asked and
    whether it was closed."""

    is_local = False

    def __init__(self, host: str, answer: str = "") -> None:
        self.host = host
        self.answer = answer
        self.asked: list[list[str]] = []
        self.closed = False

    async def run(self, argv: list[str], stdin: bytes = b"",
                  timeout: float | None = None) -> CommandResult:
        self.asked.append(argv)
        return CommandResult(0, self.answer.encode(), b"")

    async def stream(self, argv: list[str], stdin: bytes = b"") -> Stream:
        raise AssertionError(f"not streamed here: {argv}")

    async def close(self) -> None:
        self.closed = True


async def test_reach_ssh_opens_the_nodes_address_through_the_login_node(tmp_path: Path) -> None:
    profile = loads_profile(PROFILE.replace('target = "local"', 'target = "login1"')
                            + 'reach = "ssh"\n', tmp_path / "job.toml")
    login = Recorder("login1", NODE_2)
    opened: list[HostConfig] = []
    node = Recorder("10.231.2.2", "from the node")

    async def opener(host: HostConfig) -> Session:
        opened.append(host)
        return node

    reached = await remote_slurm.reach_node(login, profile, "19", "node-2", opener)
    assert login.asked == [["sinfo", "--noheader", "--Node", "--nodes=node-2",
                             "--format=%N|%t|%o"]]
    assert [(h.target, h.jump) for h in opened] == [("10.231.2.2", "login1")]
    assert reached.host == "node-2 (job 19)"
    done = await reached.run(["python3", "-c", "pass"])
    assert done.stdout == b"from the node" and node.asked == [["python3", "-c", "pass"]]
    assert await reached.leave() is login and node.closed and not login.closed
    await reached.close()
    assert login.closed


async def test_reach_step_is_the_default_and_asks_nothing_first(tmp_path: Path) -> None:
    login = Recorder("login")

    async def opener(host: HostConfig) -> Session:
        raise AssertionError(f"no SSH to the node for a step: {host}")

    reached = await remote_slurm.reach_node(
        login, loads_profile(PROFILE, tmp_path / "job.toml"), "19", "node-2", opener)
    assert login.asked == []
    await reached.run(["true"])
    assert login.asked[0][:2] == ["srun", "--jobid=19"] and login.asked[0][-1] == "true"
    assert await reached.leave() is login and not login.closed


@pytest.mark.parametrize("term_first", [False, True], ids=["in the hold", "before the exit"])
def test_the_kill_hold_ends_at_the_schedulers_sigterm(tmp_path: Path, term_first: bool) -> None:
    """The job script's launch, its server over and a kill's hold under way (kill.hold), ends
    at scancel's SIGTERM, also when the SIGTERM came before it had read the server's end (the
    scancel right after the verified kill): where the scheduler tracks processes by their
    parents it would otherwise outlive its job (the lane saw it, orphaned, for the hold's 3
    minutes)."""
    (tmp_path / "kill.hold").touch()
    if not term_first:
        (tmp_path / "exit.json").write_text('{"code": 0}')
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tui.agent.launch import _hold; "
         "print('holding', flush=True); sys.exit(_hold(sys.argv[1], {}))", str(tmp_path)],
        stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"holding\n"
        time.sleep(0.3)
        assert holder.poll() is None, "the hold ended with kill.hold still there"
        holder.send_signal(signal.SIGTERM)
        if term_first:
            time.sleep(0.3)
            assert holder.poll() is None, "the hold ended before the server's end"
            (tmp_path / "exit.json").write_text('{"code": 0}')
        assert holder.wait(3) == 0
    finally:
        holder.kill()
        holder.wait()
