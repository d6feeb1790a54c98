"""The launch timeline: each phase's start and duration, the current phase's progress, the ETA.

Pure bookkeeping fed by the launch state machine; the console draws it, `wait` prints from it.
A Slurm job's wait in the queue is its first span (Phase.QUEUED), before the launch: the
timeline's launch time is the allocation's, so the queue is never part of the load's time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tui.core.phases import Phase


@dataclass(slots=True)
class PhaseSpan:
    """One phase as it happened: when it started, when it ended (None while current)."""

    phase: Phase
    start: float
    end: float | None = None
    progress: float | None = None
    shards: tuple[int, int] | None = None
    failed: bool = False
    detail: str | None = None  # the queue's reason and expected start, then where it runs

    def duration(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start


@dataclass(slots=True)
class Timeline:
    """Phases in the order they were entered, from a launch time, with an expected load time."""

    launched_at: float
    expected_load_s: float | None = None
    spans: list[PhaseSpan] = field(default_factory=list)
    finished_at: float | None = None

    @property
    def current(self) -> PhaseSpan | None:
        """The phase the server is in; none between a job's allocation and the first phase
        line (the queue is over, the server has said nothing yet)."""
        return current_of(self.spans)

    @property
    def queued(self) -> bool:
        """A job still waiting in the scheduler's queue."""
        cur = self.current
        return cur is not None and cur.phase is Phase.QUEUED

    def queue(self, detail: str, at: float) -> bool:
        """The job waits in the queue (`detail`: the scheduler's reason and expected start);
        True when this starts the queued span or changes what it says."""
        cur = self.current
        if cur is None and not self.spans:
            self.spans.append(PhaseSpan(Phase.QUEUED, at, detail=detail))
            return True
        if cur is None or cur.phase is not Phase.QUEUED or cur.detail == detail:
            return False
        cur.detail = detail
        return True

    def allocated(self, detail: str, at: float) -> None:
        """The queue is over at `at` (`detail`: where the job runs); the load's time is
        counted from here on."""
        if self.queued:
            span = self.spans[-1]
            span.end, span.detail = at, detail
        self.launched_at = at

    def enter(self, phase: Phase, at: float) -> bool:
        """Start `phase` (closing the current one); phases never go backwards. True if entered."""
        cur = self.current
        if cur is not None and phase.value <= cur.phase.value:
            return False
        if cur is not None and cur.end is None:
            cur.end = at
        self.spans.append(PhaseSpan(phase, at))
        return True

    def progress(self, progress: float | None, shards: tuple[int, int] | None) -> None:
        cur = self.current
        if cur is not None:
            if progress is not None:
                cur.progress = progress
            if shards is not None:
                cur.shards = shards
            elif progress is not None and progress >= 1.0 and cur.shards is not None:
                cur.shards = (cur.shards[1], cur.shards[1])  # "took N s": every shard is in

    def finish(self, at: float, failed: bool = False) -> None:
        """Close the timeline: ready (failed=False) or died/stopped in the current phase."""
        cur = self.current
        if cur is not None and cur.end is None:
            cur.end = at
            cur.failed = failed
        self.finished_at = at

    def elapsed(self, now: float) -> float:
        return (self.finished_at if self.finished_at is not None else now) - self.launched_at

    def eta(self, now: float) -> float | None:
        """Seconds left until the expected load time, or None when unknown or finished."""
        if self.expected_load_s is None or self.finished_at is not None or self.queued:
            return None
        return max(0.0, self.launched_at + self.expected_load_s - now)


def current_of(spans: list[PhaseSpan] | tuple[PhaseSpan, ...]) -> PhaseSpan | None:
    """The last span, unless it is a queue already over (the server has said nothing yet)."""
    if not spans:
        return None
    last = spans[-1]
    return None if last.phase is Phase.QUEUED and last.end is not None else last
