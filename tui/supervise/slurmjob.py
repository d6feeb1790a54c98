"""A run launched as a Slurm job, as the supervisor follows it: the job's id, node and end
(JobRun), the preflight of a job (the scheduler's own answer to sbatch --test-only), and the
following itself (JobFollow): the submission, the queue and the allocation, the running job
polled (its time left and the alert before its limit, its end and the verdict), a death in the
job told as the scheduler's doing when it is, the kill through a step then scancel, and a job
someone else submitted attached to. Its events (queued, allocated, nearing its time limit,
ended) are in tui.supervise.events.

The supervisor (supervise.supervisor) calls JobFollow where a job's run differs from a bare
run; JobFollow sets the run's fields on it (job, session, run) and speaks through its events.
What it needs of the supervisor is named here (JobSupervisor), so that this module does not
import the supervisor's. The commands are tui.remote.slurm's.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from tui.core import slurm
from tui.core.command import secret_checks, served_by
from tui.core.errors import JobNeverStarts, RunNotFound, SessionError, SpecconsoleError
from tui.core.profile import Profile, SlurmConfig
from tui.core.protocol import Check, Killed, KillStep, RunRecord
from tui.core.specconfig import speculative_checks
from tui.core.state import Death, Died, LaunchMachine
from tui.remote import launcher
from tui.remote import slurm as remote_slurm
from tui.remote.interface import Session
from tui.supervise.events import (
    JobAllocated,
    JobEnded,
    JobEnding,
    JobQueued,
    JobSubmitted,
    KillDone,
    KillProgress,
    Notice,
    RunInfo,
    SupervisorEvent,
)

JOB_POLL_S = 2.0  # how often a running job is asked after (scontrol show job)
RUN_RECORD_S = 120.0  # a job's run: from the allocation to the agent's launch in the job


@dataclass(slots=True)
class JobRun:
    """The run's job: its id, the node it runs on once allocated, its latest record."""

    job_id: str
    script: str | None = None
    node: str | None = None
    restarts: int = 0  # the job's Restarts when the run's allocation began
    queued_s: float | None = None  # from its submission to its allocation, when seen here
    job: slurm.Job | None = None
    end: slurm.SchedulerEnd | None = None
    alerted: bool = False  # the time-left alert was given
    clock: slurm.JobClock | None = None  # its time limit and end, on the supervisor's clock
    # a member of a several-node job (supervise.group): the job's directory, where the
    # member's launch is asked of the agent waiting on its node
    job_dir: str | None = None
    # another member of the job launches on this member's node after it (Ray's head and the
    # server share the first node): the agent there keeps waiting for that one's launch
    more_on_node: bool = False
    # the deaths of allocations the scheduler requeued: the run is followed past them
    requeued: list[Death] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)  # each allocation's end, for the history
    allocations: tuple[str, ...] = ()  # the nodes it ran on, across requeues (the history)
    ran_on: tuple[str, ...] = ()  # the nodes of its latest allocation, as the job ran there

    def seen(self, job: slurm.Job, now: float) -> None:
        """The job's latest record, asked at `now` (the supervisor's clock)."""
        self.job = job
        if job.nodes and not job.pending and not job.ended:
            self.ran_on = job.nodes
        self.clock = slurm.JobClock.of(job, now, datetime.now())

    def end_of(self, job: slurm.Job | None) -> slurm.SchedulerEnd | None:
        """The end of the run's allocation as `job` tells it (slurm.allocation_end); an end
        of its own when the scheduler has forgotten the job."""
        if job is None:
            return slurm.SchedulerEnd("UNKNOWN", self.job_id, self.node, None, None, None,
                                      "forgotten by the scheduler")
        return slurm.allocation_end(job, self.restarts, self.node)

    def told(self, verdict: str) -> str:
        """The history's end of the job: each allocation's, in order."""
        self.verdicts.append(verdict)
        return "; then ".join(self.verdicts)

    @property
    def output(self) -> str | None:
        """The job's output file, beside its script (slurm.JOB_OUTPUT)."""
        if self.script is None:
            return None
        return posixpath.join(posixpath.dirname(self.script),
                              slurm.JOB_OUTPUT.replace("%j", self.job_id))


async def told_end(login: Session, profile: Profile, run: JobRun,
                   job: slurm.Job | None) -> slurm.SchedulerEnd | None:
    """The end of the run's allocation (JobRun.end_of) with what the cluster says beyond
    scontrol: a requeue's cause from the job's output (a preemption's slurmstepd line), who
    cancelled it from the accounting (sacct, where it runs)."""
    end = run.end_of(job)
    if end is None:
        return None
    if end.requeued and run.output is not None:
        return slurm.preemption_seen(end, await remote_slurm.output_tail(
            login, profile, run.output), run.ran_on)
    if end.state == "CANCELLED":
        by = await remote_slurm.cancelled_by(login, profile, run.job_id)
        return replace(end, cancelled_by=by.who, accounting=by.accounting)
    return end


async def job_checks(session: Session, profile: Profile) -> tuple[Check, ...]:
    """The preflight of a job: the scheduler's answer to sbatch --test-only (the partition,
    the limits, the expected start) as one check, then the profile's own checks (the
    speculative config, the secrets). The node's GPUs and port are not known before the
    allocation: those checks are not made."""
    answer = await remote_slurm.test_only(session, profile)
    check = Check("slurm", answer.ok, "info" if answer.ok else "error", answer.summary())
    return (check, *speculative_checks(profile), *secret_checks(profile))


class JobSupervisor(Protocol):
    """What JobFollow needs of its supervisor (supervise.supervisor.Supervisor): the run's
    fields it sets (job, session, run, machine), the sessions, and how the run is told (its
    events, its history row, its watch begun and stopped)."""

    profile: Profile
    environ: Mapping[str, str]
    clock: Callable[[], float]
    job: JobRun | None
    login: Session | None  # the login node's own session
    session: Session | None  # the job's node (remote slurm.reach_node), once allocated
    opener: remote_slurm.Opener  # a host's session: the node's, for reach = "ssh"
    run: RunInfo | None
    machine: LaunchMachine
    ready_at: float | None  # when the run was last READY (the supervisor's clock)
    last_kill_steps: list[KillStep]

    async def connect(self) -> Session: ...
    async def login_session(self) -> Session: ...
    async def run_preflight(self) -> tuple[Check, ...]: ...
    def new_machine(self, engine: str | None = None) -> LaunchMachine: ...
    def emit(self, events: Sequence[SupervisorEvent]) -> None: ...
    def record(self, stopped: bool = False, **fields: object) -> None: ...
    def remember_launch(self, plan: launcher.LaunchPlan, now: float) -> None: ...
    def begin(self, now: float, resume_log: bool = False) -> None: ...
    def stop_watching(self) -> None: ...
    def mark_killing(self) -> None: ...


class JobFollow:
    """The Slurm half of a Supervisor: what its run does differently as a job."""

    def __init__(self, sup: JobSupervisor) -> None:
        self.sup = sup

    async def reach(self, login: Session, job_id: str, node: str) -> remote_slurm.JobSession:
        """The session on the job's node, as the profile's reach says (remote
        slurm.reach_node: a step of the job, or SSH through the login node)."""
        return await remote_slurm.reach_node(login, self.sup.profile, job_id, node,
                                             self.sup.opener)

    async def reach_or_cancel(self, login: Session, job_id: str, node: str
                              ) -> remote_slurm.JobSession:
        """reach(), for a job this launch submitted: a node that cannot be reached (reach =
        "ssh": its key unknown or changed, the login refused) cancels the job, said in one
        line, never a job left running unwatched."""
        sup = self.sup
        try:
            return await self.reach(login, job_id, node)
        except SessionError as exc:
            ended = await remote_slurm.cancel(login, job_id)
            if sup.job is not None:
                sup.job.end = slurm.SchedulerEnd(ended.state if ended else "CANCELLED", job_id,
                                                 node, None, None, None, str(exc))
            raise SessionError(node, f"job {job_id}'s node could not be reached, so the job "
                                     f"was cancelled (scancel {job_id}): {exc}") from None

    async def launch_job(self, skip_preflight: bool) -> RunInfo:
        """A [slurm] profile: the scheduler's preflight (sbatch --test-only), the job script
        written into the run directory and submitted from the login node, the queue followed
        (JobQueued: the scheduler's reason, never a stall) until the job runs; then the agent
        reaches its node as a step of the job, and the run is watched as any other. A member
        of a several-node job already running: its launch asked of its node's agent."""
        sup = self.sup
        if sup.job is not None and sup.job.job_dir is not None:
            return await self.launch_member()
        login = await sup.login_session()
        if not skip_preflight and sup.profile.preflight.enabled:
            await sup.run_preflight()
        plan = launcher.plan_launch(sup.profile, sup.environ, sup.clock())
        _, job = await self.submit_job(remote_slurm.submit(login, sup.profile, plan))
        sup.session = await self.reach_or_cancel(login, job.job_id, str(job.node))
        return await self.started(plan)

    async def launch_member(self) -> RunInfo:
        """A member of a several-node job (its JobRun set by supervise.group once the job has
        its nodes): its run directory made and its launch written for the agent waiting on
        its node (remote slurm.request_launch), then followed as a job's run."""
        sup = self.sup
        assert sup.job is not None and sup.job.job_dir is not None and sup.job.node is not None
        login = await sup.login_session()
        plan = launcher.plan_launch(sup.profile, sup.environ, sup.clock())
        await remote_slurm.request_launch(login, sup.profile, plan, sup.job.job_dir,
                                          sup.job.job_id, sup.job.node, sup.job.more_on_node)
        sup.session = await self.reach_or_cancel(login, sup.job.job_id, sup.job.node)
        return await self.started(plan)

    def on_queued(self, job_id: str, detail: Callable[[slurm.Queued], str]
                  ) -> Callable[[slurm.Queued], None]:
        """What each change of the job's queue line does: the queue is the timeline's phase
        (`detail`: its words; its PhaseChanged says the reason), and a reason that cannot change
        by itself ends the wait (JobNeverStarts)."""
        sup = self.sup

        def queued(line: slurm.Queued) -> None:
            sup.emit([JobQueued(job_id, line),
                      *sup.machine.queued(detail(line), sup.clock())])
            if slurm.never_starts(line.reason):
                raise JobNeverStarts(f"job {job_id} can never start as it is "
                                     f"({slurm.pending_words(line.reason)})")
        return queued

    async def submit_job(self, submitting: Awaitable[remote_slurm.Submitted]
                         ) -> tuple[remote_slurm.Submitted, slurm.Job]:
        """Submit (`submitting`: the sbatch of a job script) and follow the job through the
        queue to its allocation: the submission, the queued phase, the allocation on this
        supervisor's events; the job as it started running."""
        sup = self.sup
        login = await sup.login_session()
        submitted_at = sup.clock()
        sub = await submitting
        sup.job = JobRun(sub.job_id, sub.script)
        sup.emit([JobSubmitted(sub.job_id, sub.script),
                  Notice(f"submitted job {sub.job_id} ({sub.script})")])
        try:
            job = await remote_slurm.wait_started(
                login, sub.job_id, self.on_queued(sub.job_id, slurm.queue_detail))
        except JobNeverStarts as exc:
            ended = await remote_slurm.cancel(login, sub.job_id)
            sup.job.end = slurm.SchedulerEnd(ended.state if ended else "CANCELLED",
                                             sub.job_id, None, None, None, None, str(exc))
            raise JobNeverStarts(f"{exc}: cancelled it (scancel {sub.job_id}); see "
                                 f"{sub.script}") from None
        end = slurm.scheduler_end(job)
        if end is not None:
            sup.job.end = end
            raise SpecconsoleError(f"job {sub.job_id} ended before it ran: {end.words()}")
        sup.job.node, sup.job.restarts = job.node, job.restarts
        sup.job.seen(job, sup.clock())
        allocated = JobAllocated(job, sup.clock() - submitted_at)
        sup.job.queued_s = allocated.waited_s
        sup.machine.allocated(allocated.words(), sup.clock())
        sup.emit([allocated, Notice(allocated.words())])
        return sub, job

    async def started(self, plan: launcher.LaunchPlan) -> RunInfo:
        """The run, once the agent in the job has launched its server on the node: watched."""
        sup = self.sup
        record = await self.job_record(plan.run_id)
        now = sup.clock()
        sup.run = RunInfo(record.run_id, record.run_dir, int(record.pid or 0), now,
                          attached=False, served=served_by(sup.profile))
        sup.remember_launch(plan, now)
        sup.begin(now)
        return sup.run

    async def job_record(self, run_id: str, restart: int = 0) -> RunRecord:
        """The run as the agent on the job's node sees it, once the job script's agent has
        launched the server there (in the job's allocation after `restart` requeues)."""
        sup = self.sup
        assert sup.job is not None and sup.login is not None
        deadline = sup.clock() + RUN_RECORD_S
        while True:
            for record in await launcher.list_runs(await sup.connect(), sup.profile):
                if (record.run_id == run_id and record.pid is not None
                        and record.restart >= restart):
                    return record
            job = await remote_slurm.show_job(sup.login, sup.job.job_id)
            end = slurm.scheduler_end(job) if job is not None else None
            if job is None or end is not None:
                words = end.words() if end is not None else "forgotten by the scheduler"
                raise SpecconsoleError(f"job {sup.job.job_id} ended before its server "
                                       f"started: {words} (see {sup.job.script} and its "
                                       "slurm-*.out beside it)")
            if sup.clock() > deadline:
                raise SpecconsoleError(f"job {sup.job.job_id} runs on {sup.job.node} but its "
                                       f"server was not started within {RUN_RECORD_S:.0f} s "
                                       "(see the slurm-*.out in the run directory)")
            await asyncio.sleep(0.5)

    async def find_job(self, record: RunRecord) -> JobRun:
        """The job of a run found on the login node (its run directory's record): the
        session reaches its node as a step while it runs; a run that was never a job, or a
        job the scheduler has forgotten, is said in one line."""
        sup = self.sup
        login = await sup.login_session()
        job_id = await remote_slurm.job_of(login, sup.profile, record.run_dir)
        if job_id is None:
            raise RunNotFound(f"run {record.run_id} of {sup.profile.key} records no Slurm job "
                              f"({record.run_dir})")
        job = await remote_slurm.show_job(login, job_id)
        node = await remote_slurm.node_of(login, sup.profile, record.run_dir)  # several nodes
        found = JobRun(job_id, f"{record.run_dir}/{slurm.JOB_SCRIPT}",
                       node or (job.node if job is not None else None),
                       job.restarts if job is not None else 0)
        if job is not None:
            found.seen(job, sup.clock())
        found.end = found.end_of(job)
        if found.end is None and job is not None and job.state != "RUNNING":
            found.end = slurm.SchedulerEnd(job.state, job_id, job.node, None, None, None,
                                           job.reason)
        sup.job = found
        if found.end is None and found.node is not None:
            sup.session = await self.reach(login, job_id, found.node)
        return found

    async def attach_job(self, job_id: str) -> str:
        """A running job someone else submitted (`attach --slurm-job J`): the session reaches
        its node as a step of it, and its server's top process there is the pid attached to
        (remote slurm.job_server); the job is followed as a launched one's (its time, its
        end). Whose it is, for the confirmation before a kill: `job J of user U on NODE: `."""
        sup = self.sup
        assert sup.profile.attach is not None
        login = await sup.login_session()
        job = await remote_slurm.show_job(login, job_id)
        if job is None:
            raise RunNotFound(f"no job {job_id} in the scheduler (ended and forgotten, or never)")
        if job.state != "RUNNING" or job.node is None:
            why = f" ({slurm.pending_words(job.reason)})" if job.pending else ""
            raise RunNotFound(f"job {job_id} is {job.state}{why}: no server runs in it to "
                              "attach to")
        sup.job = JobRun(job_id, None, job.node, job.restarts)
        sup.job.seen(job, sup.clock())
        sup.session = await self.reach(login, job_id, job.node)
        found = await remote_slurm.job_server(sup.session, sup.profile, job_id)
        if found is None:
            raise RunNotFound(f"job {job_id} on {job.node} runs no process but its script's "
                              "shell: no server to attach to")
        sup.profile = replace(sup.profile, attach=replace(sup.profile.attach, pid=found.pid))
        return f"job {job_id} of user {job.user or '?'} on {job.node}: "

    async def job_loop(self) -> None:
        """Ask the scheduler after the running job: the time left (one alert at the
        profile's alert_before), and its end (job_over)."""
        sup = self.sup
        assert sup.job is not None
        # an attached job (`attach --slurm-job`) has no [slurm] table: the default alert time
        alert_before = (sup.profile.slurm or SlurmConfig()).alert_before
        while sup.job.end is None:
            await asyncio.sleep(JOB_POLL_S)
            try:
                job = await remote_slurm.show_job(await sup.login_session(), sup.job.job_id)
            except SpecconsoleError:
                continue  # the login node's link: the watch loop says so
            if sup.job.end_of(job) is not None:
                await self.job_over(job)
                return
            assert job is not None
            sup.job.seen(job, sup.clock())
            left = job.time_left_s(datetime.now())
            if (left is not None and left <= alert_before
                    and not sup.job.alerted):
                sup.job.alerted = True
                sup.emit([JobEnding(job.job_id, left)])  # the bell, tmux, on_ending, wait

    async def job_gone(self) -> bool:
        """The watch of a job's run ended: True when the job is over (its steps end with it,
        so this is its end, told by job_over, not a lost link)."""
        sup = self.sup
        assert sup.job is not None
        try:
            job = await remote_slurm.show_job(await sup.login_session(), sup.job.job_id)
        except SpecconsoleError:
            return False
        if sup.job.end_of(job) is None:
            return False
        await self.job_over(job)
        return True

    async def job_over(self, job: slurm.Job | None) -> None:
        """The job has ended: its node is no longer reachable (the watch stops), and the
        scheduler's end is the verdict where it ended the run itself (a time limit, scancel,
        a preemption, a node's failure): a death then is its doing, never a crash."""
        sup = self.sup
        assert sup.job is not None
        if sup.job.end is not None:
            return
        taken = sup.job.end = sup.job.end_of(job)  # taken: a second caller returns above
        if taken is None:
            return
        end = await self.told(job, taken)
        sup.job.end, sup.job.job = end, job or sup.job.job
        sup.stop_watching()
        if isinstance(sup.session, remote_slurm.JobSession):
            sup.session = await sup.session.leave()  # its node is no longer reached
        now = sup.clock()
        ready_for = now - sup.ready_at if sup.ready_at is not None else None
        death = sup.machine.death
        ended_at = (job.end_time.timestamp() if job is not None and job.end_time is not None
                    and job.ended else now)
        if end.schedulers_doing and (death is None or death.at >= ended_at - 2.0):
            events = sup.machine.ended_by_scheduler(end.words(ready_for), now)
            if end.requeued and sup.machine.death is not None:
                sup.job.requeued.append(sup.machine.death)  # followed past it
            sup.emit(events)
            death = sup.machine.death
        first = (slurm.FirstDeath(death.process, death.at)
                 if death is not None and death.ended_by is None else None)
        verdict = slurm.end_verdict(end, first, ended_at, ready_for)
        sup.emit([JobEnded(end, verdict), Notice(f"job {sup.job.job_id}: {verdict}")])
        if end.requeued and sup.job.script is not None and sup.job.job_dir is None:
            await self.follow_requeue(end)  # its script starts the server again

    async def follow_requeue(self, end: slurm.SchedulerEnd) -> None:
        """The scheduler requeued the run's job (same id, Restarts counted up) and the job script
        starts the server again on its next allocation: followed there as the first was, with a
        fresh launch machine (the queue again, `allocated on NODE`, READY) and the log resumed at
        its byte offset. A job that ends or can never start before its server runs again leaves
        the first allocation's death the run's, said with what followed (`wait` ends there)."""
        sup = self.sup
        job_run, login, run = sup.job, sup.login, sup.run
        assert job_run is not None and login is not None and run is not None
        first = sup.machine
        sup.machine = sup.new_machine()
        job_run.end, job_run.node, job_run.alerted, job_run.clock = None, None, False, None
        sup.session, sup.ready_at = login, None
        try:
            job = await self.requeued_job(end, sup.clock())
            sup.session = await self.reach_or_cancel(login, job_run.job_id, str(job.node))
            record = await self.job_record(run.run_id, job.restarts)
        except (JobNeverStarts, SpecconsoleError) as exc:
            cancel = isinstance(exc, JobNeverStarts)
            if cancel:
                await remote_slurm.cancel(login, job_run.job_id)
            sup.machine, sup.session = first, login
            job_run.end = replace(end, requeued=False)
            after = f"{exc}: cancelled it (scancel {job_run.job_id})" if cancel else str(exc)
            if first.death is not None:  # the run's death, now with its end
                first.death = replace(first.death, ended_by=f"{first.death.ended_by}; then {after}")
                sup.emit([Died(first.death)])
            sup.emit([Notice(f"job {job_run.job_id}: {after}", "warning")])
            return
        sup.run = replace(run, pid=int(record.pid or 0), launched_at=sup.clock())
        sup.begin(sup.clock(), resume_log=True)

    async def requeued_job(self, end: slurm.SchedulerEnd, requeued_at: float) -> slurm.Job:
        """The requeued job followed through the queue to its next allocation: the queue
        again (the requeue's words), `allocated on NODE`, the nodes it has run on kept for the
        history; the job as it runs again. SpecconsoleError when it ends first, JobNeverStarts
        when it never can."""
        sup = self.sup
        job_run, login = sup.job, await sup.login_session()
        assert job_run is not None
        job = await remote_slurm.wait_started(login, job_run.job_id, self.on_queued(
            job_run.job_id, lambda line: slurm.requeue_detail(end, line)))
        ended = slurm.scheduler_end(job)
        if ended is not None:
            raise SpecconsoleError(f"job {job_run.job_id} ended before it ran again: "
                                   f"{ended.words()}")
        job_run.node, job_run.restarts = job.node, job.restarts
        job_run.seen(job, sup.clock())
        allocated = JobAllocated(job, sup.clock() - requeued_at)
        sup.machine.allocated(allocated.words(), sup.clock())
        sup.emit([allocated, Notice(allocated.words())])
        had = job_run.allocations or ((end.node,) if end.node else ())
        job_run.allocations = tuple(dict.fromkeys((*had, *job.nodes)))
        sup.record(nodes=job_run.allocations)
        return job

    async def died_in_job(self, events: Sequence[SupervisorEvent]) -> None:
        """A death in a job's run: the scheduler is asked first whether it ended the job (its
        state then is already TIMEOUT, CANCELLED, ...), so that the death is told as its doing
        from the start."""
        sup = self.sup
        assert sup.job is not None
        with contextlib.suppress(SpecconsoleError, asyncio.TimeoutError):
            login = await sup.login_session()
            job = await asyncio.wait_for(remote_slurm.show_job(login, sup.job.job_id), 5.0)
            ended = sup.job.end_of(job)
            end = (await asyncio.wait_for(self.told(job, ended), 5.0)
                   if ended is not None else None)
            death = sup.machine.death
            if end is not None and end.schedulers_doing and death is not None:
                ready_for = (death.at - sup.ready_at) if sup.ready_at is not None else None
                sup.machine.death = replace(death, ended_by=end.words(ready_for))
                if end.requeued:
                    sup.job.requeued.append(sup.machine.death)  # followed past it
                events = [Died(sup.machine.death) if isinstance(e, Died) else e
                          for e in events]
        sup.emit(events)

    async def told(self, job: slurm.Job | None, end: slurm.SchedulerEnd) -> slurm.SchedulerEnd:
        """The allocation's `end` with what the cluster says beyond scontrol (told_end: a
        requeue's cause, who cancelled) and, of several nodes, the one it lost (named); the
        scontrol's end where the login node cannot say more."""
        sup = self.sup
        assert sup.job is not None
        with contextlib.suppress(SpecconsoleError, OSError):
            end = await told_end(await sup.login_session(), sup.profile, sup.job, job) or end
        return await self.named(end)

    async def named(self, end: slurm.SchedulerEnd) -> slurm.SchedulerEnd:
        """A several-node job lost to a node's failure: the node the scheduler lost (sinfo:
        not responding, or down), not the job's first."""
        if end.state != "NODE_FAIL" or len(end.nodes) < 2:
            return end
        with contextlib.suppress(SpecconsoleError):
            states = await remote_slurm.node_states(await self.sup.login_session(), end.nodes)
            lost = [n.name for n in states if n.lost]
            if lost:
                return replace(end, node=", ".join(lost))
        return end

    async def kill_job(self, grace: float, cancel: bool = True) -> Killed:
        """A job's run: the agent on its node kills and verifies as on any host (no process of
        the run left, GPU memory released), then scancel, verified by the job leaving the
        queue (`cancel`; a several-node job's members are cancelled together once each is
        killed: supervise.group). A job already over is refused in one line: its node can no
        longer be reached as a step of it, so nothing could be verified there."""
        sup = self.sup
        assert sup.job is not None and sup.run is not None
        job_id = sup.job.job_id
        if sup.job.script is None:  # attached (`attach --slurm-job`), the kill confirmed
            return await self.cancel_attached()
        if sup.job.end is not None:
            await remote_slurm.cancel(await sup.login_session(), job_id)
            raise SpecconsoleError(
                f"job {job_id} is over ({sup.job.end.state}): nothing to kill through it, "
                f"and its node {sup.job.node or '?'} cannot be reached as a step of it to "
                "check for leftovers of the run")
        sup.mark_killing()
        await remote_slurm.hold_for_kill(await sup.login_session(), sup.profile,
                                         sup.run.run_dir)
        steps, killed = await launcher.kill(
            await sup.connect(), sup.profile, sup.run.run_dir, grace,
            on_step=lambda step: sup.emit([KillProgress(step)]))
        sup.last_kill_steps = steps
        if cancel:
            await self.cancel_job()
        sup.emit([KillDone(killed), *sup.machine.stopped(sup.clock())])
        return killed

    async def cancel_attached(self) -> Killed:
        """Someone else's job, the kill confirmed: its server's end would end the owner's
        script and so the job, and any step reporting a kill with it, so the job is ended by
        the scheduler's own kill (scancel) and verified by the scheduler: the job has left the
        queue only once its node's slurmd saw every process of it end. Its node is no longer
        reachable after that: GPU memory is not read (unknown)."""
        sup = self.sup
        assert sup.job is not None
        sup.mark_killing()
        step = KillStep("scancel", (), time.time())
        sup.emit([KillProgress(step)])
        await self.cancel_job()
        sup.last_kill_steps = [step]
        killed = Killed((), None, (), time.time())
        sup.emit([KillDone(killed), *sup.machine.stopped(sup.clock())])
        return killed

    async def cancel_job(self) -> slurm.Job | None:
        """scancel the job and wait until it has left the queue; then it is over here."""
        sup = self.sup
        assert sup.job is not None
        job_id = sup.job.job_id
        job = await remote_slurm.cancel(await sup.login_session(), job_id)
        sup.emit([Notice(f"job {job_id} has left the queue ("
                         f"{job.state if job is not None else 'forgotten'})")])
        await self.job_over(job)
        return job
