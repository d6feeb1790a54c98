"""The supervisor's side of a job's death: a death the agent reports while the scheduler is
ending the job is told as the scheduler's from its first word (the Died event itself), and a
worker's own death while the job runs stays the worker's. The login node here is a stand-in
session that answers `scontrol show job` with the lane's real text (tests/test_slurm_core.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_slurm_core import TIMEOUT_JOB

from tui.core.profile import loads_profile
from tui.core.protocol import ProcExit
from tui.core.state import Died
from tui.remote.interface import CommandResult, Session, Stream
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


def test_the_supervisor_has_all_that_job_follow_asks_of_it(tmp_path: Path) -> None:
    """JobFollow names what it needs of its supervisor (JobSupervisor, so that slurmjob need
    not import the supervisor's module): every field and method of it is the Supervisor's."""
    sup = Supervisor(loads_profile(PROFILE, tmp_path / "job.toml"))
    needed = {*JobSupervisor.__annotations__,
              *(name for name, member in vars(JobSupervisor).items()
                if callable(member) and not name.startswith("_"))}
    assert {"job", "login", "session", "emit", "begin", "record"} <= needed
    assert sorted(name for name in needed if not hasattr(sup, name)) == []
