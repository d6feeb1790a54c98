"""A run launched as a Slurm job, as the supervisor follows it: the job's id, node and end,
and the preflight of a job (the scheduler's own answer to sbatch --test-only). Its events
(queued, allocated, nearing its time limit, ended) are in tui.supervise.events.

The supervisor (supervise.supervisor) drives it; the commands are tui.remote.slurm's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tui.core import slurm
from tui.core.command import secret_checks
from tui.core.profile import Profile
from tui.core.protocol import Check
from tui.core.specconfig import speculative_checks
from tui.remote import slurm as remote_slurm
from tui.remote.interface import Session

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


async def job_checks(session: Session, profile: Profile) -> tuple[Check, ...]:
    """The preflight of a job: the scheduler's answer to sbatch --test-only (the partition,
    the limits, the expected start) as one check, then the profile's own checks (the
    speculative config, the secrets). The node's GPUs and port are not known before the
    allocation: those checks are not made."""
    answer = await remote_slurm.test_only(session, profile)
    check = Check("slurm", answer.ok, "info" if answer.ok else "error", answer.summary())
    return (check, *speculative_checks(profile), *secret_checks(profile))
