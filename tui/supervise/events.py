"""What a Supervisor emits: its events (beside the launch machine's DomainEvents) and the
records they carry, for the console's bridge, `specconsole wait` and the tests to consume."""

from __future__ import annotations

from dataclasses import dataclass

from tui.core import slurm
from tui.core.acceptance import SpecDecodeTotals
from tui.core.protocol import Check, Gpus, Hello, Killed, KillStep, LogSkipped, Procs, Served
from tui.core.stacks import ProcessStacks
from tui.core.state import DomainEvent
from tui.supervise.history import Launch


@dataclass(frozen=True, slots=True)
class RunInfo:
    run_id: str
    run_dir: str
    pid: int
    launched_at: float
    attached: bool
    served: Served | None = None  # None: a run from before launch.json recorded it
    # launched by others (`specconsole attach`): whose it is, said before any kill
    owner: str | None = None
    # the container's image pulled first: `pid` is then the agent's monitor, which pulls it
    pulling: str | None = None


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the user should read that is not a state change."""

    text: str
    level: str = "info"


@dataclass(frozen=True, slots=True)
class Fatal:
    """Watching cannot go on (the agent refused, the run dir vanished, a bug): say why."""

    text: str


@dataclass(frozen=True, slots=True)
class PreflightDone:
    checks: tuple[Check, ...]


@dataclass(frozen=True, slots=True)
class RunStarted:
    run: RunInfo


@dataclass(frozen=True, slots=True)
class LinkLost:
    host: str
    reason: str
    retry_in: float


@dataclass(frozen=True, slots=True)
class LinkRestored:
    host: str


@dataclass(frozen=True, slots=True)
class AgentHello:
    hello: Hello


@dataclass(frozen=True, slots=True)
class ProcsSeen:
    procs: Procs


@dataclass(frozen=True, slots=True)
class GpusSeen:
    gpus: Gpus


@dataclass(frozen=True, slots=True)
class ProcEnded:
    """A process of the run ended (any of them, helpers too), as the run tells it
    (LaunchMachine.ended_as: vLLM's name, a forked child as its parent's child)."""

    pid: int
    name: str
    code: int | None
    signal: int | None


@dataclass(frozen=True, slots=True)
class HistoryLoaded:
    """The profile's previous launch on this host, and each phase's usual duration."""

    previous: Launch | None
    usual: dict[str, float]


@dataclass(frozen=True, slots=True)
class SmokeDone:
    """The smoke request after READY: answered (latency, tokens, first line) or not."""

    ok: bool
    seconds: float
    tokens: int | None
    first_line: str
    error: str = ""


@dataclass(frozen=True, slots=True)
class SpecDecodeSeen:
    """The server's speculative-decoding counters (/metrics, totals since start)."""

    totals: SpecDecodeTotals
    time: float


@dataclass(frozen=True, slots=True)
class StacksTaken:
    """py-spy's stacks of every process of the run (`why`: "on request", "on stall"), saved
    on the host at `path`."""

    stacks: tuple[ProcessStacks, ...]
    path: str
    why: str
    at: float


@dataclass(frozen=True, slots=True)
class KillProgress:
    step: KillStep


@dataclass(frozen=True, slots=True)
class KillDone:
    killed: Killed


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    job_id: str
    script: str


@dataclass(frozen=True, slots=True)
class JobQueued:
    """The job waits in the queue: the scheduler's reason and expected start (never a stall,
    never part of the load's time)."""

    job_id: str
    queued: slurm.Queued

    def words(self) -> str:
        return f"job {self.job_id} {slurm.queued_summary(self.queued)}"


@dataclass(frozen=True, slots=True)
class JobAllocated:
    job: slurm.Job
    waited_s: float  # from the submission to the allocation

    def words(self) -> str:
        return f"job {self.job.job_id} {slurm.allocated_summary(self.job)}"


@dataclass(frozen=True, slots=True)
class JobEnding:
    """The job's time limit is near (the profile's [slurm].alert_before)."""

    job_id: str
    left_s: float

    def words(self) -> str:
        return (f"job {self.job_id} has {slurm.duration_words(self.left_s)} left before its "
                "time limit ends it")


@dataclass(frozen=True, slots=True)
class JobEnded:
    end: slurm.SchedulerEnd
    verdict: str  # the scheduler's end combined with what the agent saw die first


SupervisorEvent = (DomainEvent | Notice | Fatal | PreflightDone | RunStarted | LinkLost
                   | LinkRestored | AgentHello | ProcsSeen | GpusSeen | ProcEnded | KillProgress
                   | KillDone | HistoryLoaded | SmokeDone | SpecDecodeSeen | StacksTaken
                   | LogSkipped | JobSubmitted | JobQueued | JobAllocated | JobEnding
                   | JobEnded)
