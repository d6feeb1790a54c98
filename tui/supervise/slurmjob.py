"""A run launched as a Slurm job, as the supervisor follows it: the job's id, node and end,
and the preflight of a job (the scheduler's own answer to sbatch --test-only). Its events
(queued, allocated, nearing its time limit, ended) are in tui.supervise.events.

The supervisor (supervise.supervisor) drives it; the commands are tui.remote.slurm's.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING

from tui.core import slurm
from tui.core.command import secret_checks
from tui.core.errors import JobNeverStarts, SpecconsoleError
from tui.core.profile import Profile
from tui.core.protocol import Check
from tui.core.specconfig import speculative_checks
from tui.core.state import Death, Died
from tui.remote import slurm as remote_slurm
from tui.remote.interface import Session
from tui.supervise.events import JobAllocated, JobQueued, Notice

if TYPE_CHECKING:
    from tui.supervise.supervisor import Supervisor

JOB_POLL_S = 2.0  # how often a running job is asked after (scontrol show job)


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
    # the deaths of allocations the scheduler requeued: the run is followed past them
    requeued: list[Death] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)  # each allocation's end, for the history
    allocations: tuple[str, ...] = ()  # the nodes it ran on, across requeues (the history)

    def seen(self, job: slurm.Job, now: float) -> None:
        """The job's latest record, asked at `now` (the supervisor's clock)."""
        self.job = job
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
        return slurm.preemption_seen(end, await remote_slurm.output_tail(login, profile,
                                                                         run.output))
    if end.state == "CANCELLED":
        by = await remote_slurm.cancelled_by(login, profile, run.job_id)
        return replace(end, cancelled_by=by.who, accounting=by.accounting)
    return end


async def follow_requeue(sup: Supervisor, end: slurm.SchedulerEnd) -> None:
    """The scheduler requeued the run's job (same id, Restarts counted up) and the job script
    starts the server again on its next allocation: followed there as the first was, with a
    fresh launch machine (the queue again, `allocated on NODE`, READY) and the log resumed at
    its byte offset. A job that ends or can never start before its server runs again leaves
    the first allocation's death the run's, said with what followed (`wait` ends there)."""
    job_run, login, run = sup.job, sup.login, sup.run
    assert job_run is not None and login is not None and run is not None
    first = sup.machine
    sup.machine = sup._new_machine()
    job_run.end, job_run.node, job_run.alerted, job_run.clock = None, None, False, None
    sup.session, sup._ready_at = login, None
    requeued_at = sup.clock()

    def queued(line: slurm.Queued) -> None:
        sup._emit([JobQueued(job_run.job_id, line),
                   *sup.machine.queued(slurm.requeue_detail(end, line), sup.clock())])
        if slurm.never_starts(line.reason):
            raise JobNeverStarts(f"job {job_run.job_id} can never start as it is "
                                 f"({slurm.pending_words(line.reason)})")

    try:
        job = await remote_slurm.wait_started(login, job_run.job_id, queued)
        ended = slurm.scheduler_end(job)
        if ended is not None:
            raise SpecconsoleError(f"job {job_run.job_id} ended before it ran again: "
                                   f"{ended.words()}")
        job_run.node, job_run.restarts = job.node, job.restarts
        job_run.seen(job, sup.clock())
        allocated = JobAllocated(job, sup.clock() - requeued_at)
        sup.machine.allocated(allocated.words(), sup.clock())
        sup._emit([allocated, Notice(allocated.words())])
        had = job_run.allocations or ((end.node,) if end.node else ())
        job_run.allocations = tuple(dict.fromkeys((*had, *job.nodes)))
        sup._record(nodes=job_run.allocations)
        sup.session = remote_slurm.StepSession(login, job_run.job_id, str(job.node))
        record = await sup._job_record(run.run_id, job.restarts)
    except (JobNeverStarts, SpecconsoleError) as exc:
        cancel = isinstance(exc, JobNeverStarts)
        if cancel:
            await remote_slurm.cancel(login, job_run.job_id)
        sup.machine, sup.session = first, login
        job_run.end = replace(end, requeued=False)
        after = f"{exc}: cancelled it (scancel {job_run.job_id})" if cancel else str(exc)
        if first.death is not None:  # the run's death, now with its end
            first.death = replace(first.death, ended_by=f"{first.death.ended_by}; then {after}")
            sup._emit([Died(first.death)])
        sup._emit([Notice(f"job {job_run.job_id}: {after}", "warning")])
        return
    sup.run = replace(run, pid=int(record.pid or 0), launched_at=sup.clock())
    sup._begin(sup.clock(), resume_log=True)


async def job_checks(session: Session, profile: Profile) -> tuple[Check, ...]:
    """The preflight of a job: the scheduler's answer to sbatch --test-only (the partition,
    the limits, the expected start) as one check, then the profile's own checks (the
    speculative config, the secrets). The node's GPUs and port are not known before the
    allocation: those checks are not made."""
    answer = await remote_slurm.test_only(session, profile)
    check = Check("slurm", answer.ok, "info" if answer.ok else "error", answer.summary())
    return (check, *speculative_checks(profile), *secret_checks(profile))
