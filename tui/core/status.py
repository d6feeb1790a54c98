"""What the console says about a run, in words: the status line and the timeline's rows.

Pure formatting over a `RunView` (a snapshot of the launch machine plus the last alerts), so the
sentences are tested as tables and the widgets only draw them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tui.core.describe import timed_out_words
from tui.core.phases import Phase
from tui.core.slurm import JobClock
from tui.core.state import Death, LaunchMachine, ReadyTimedOut, Stalled, State
from tui.core.timeline import PhaseSpan, current_of
from tui.core.units import duration

OVERRUN = 1.5  # a phase this many times its usual duration is flagged
# the row before the first phase line: the interpreter starting and importing the engine
STARTING = "starting Python"
OVERRUN_MIN_S = 5.0  # ... and at least this much longer (short phases jitter)


@dataclass(frozen=True, slots=True)
class RunView:
    """A snapshot of one run for drawing: safe to hand to a widget (copies, not live objects)."""

    state: State
    spans: tuple[PhaseSpan, ...] = ()
    launched_at: float | None = None
    finished_at: float | None = None
    expected_load_s: float | None = None
    death: Death | None = None
    stalled: Stalled | None = None
    ready_took: float | None = None
    link: str | None = None  # "connection lost, retrying in 2.0s" while the link is down
    # each phase's usual duration (median of earlier successful launches of this profile+host)
    usual: Mapping[str, float] = field(default_factory=dict)
    timed_out: ReadyTimedOut | None = None  # given up on: not READY within the ready limit
    job: JobClock | None = None  # a running Slurm job's time limit and end

    @property
    def current(self) -> PhaseSpan | None:
        return current_of(self.spans)

    @property
    def queued(self) -> bool:
        """A Slurm job still in the scheduler's queue: no load to time yet."""
        cur = self.current
        return cur is not None and cur.phase is Phase.QUEUED

    def elapsed(self, now: float) -> float:
        if self.launched_at is None:
            return 0.0
        return (self.finished_at if self.finished_at is not None else now) - self.launched_at

    def eta(self, now: float) -> float | None:
        """Seconds to READY: from the usual phase durations when there is a history (the
        current phase's remainder plus every phase not reached yet), else from the profile's
        expected load time."""
        if self.launched_at is None or self.finished_at is not None or self.queued:
            return None
        if self.usual:
            entered = {span.phase.label for span in self.spans}
            left = sum(d for label, d in self.usual.items() if label not in entered)
            cur = self.current
            if cur is not None and cur.phase.label in self.usual:
                left += max(0.0, self.usual[cur.phase.label] - cur.duration(now))
            return left
        if self.expected_load_s is None:
            return None
        return self.launched_at + self.expected_load_s - now

    def overrun(self, now: float) -> str | None:
        """The current phase, when it runs 1.5x longer than usual: `loading weights: 18m00s,
        usually 11m00s`."""
        cur = self.current
        if cur is None or cur.end is not None or self.finished_at is not None:
            return None
        usual = self.usual.get(cur.phase.label)
        took = cur.duration(now)
        if usual is None or took < OVERRUN * usual or took - usual < OVERRUN_MIN_S:
            return None
        return f"{cur.phase.label}: {duration(took)}, usually {duration(usual)}"


def view_of(machine: LaunchMachine, *, stalled: Stalled | None = None,
            ready_took: float | None = None, link: str | None = None,
            usual: Mapping[str, float] | None = None, job: JobClock | None = None) -> RunView:
    tl = machine.timeline
    return RunView(machine.state,
                   tuple(replace(s) for s in tl.spans) if tl is not None else (),
                   tl.launched_at if tl is not None else None,
                   tl.finished_at if tl is not None else None,
                   machine.expected_load_s, machine.death,
                   stalled if machine.state is State.STALLED else None, ready_took, link,
                   usual or {}, machine.timed_out, job)


def timed_out_text(view: RunView) -> str:
    """`⚠ not READY after 40m00s (ready_timeout)` under the timeline, until READY after all."""
    if view.timed_out is None or view.state is State.READY:
        return ""
    return f"⚠ {timed_out_words(view.timed_out)}"


def progress_text(span: PhaseSpan) -> str:
    """`43 % (31/64 shards)`, `43 %`, `31/64 shards` or nothing."""
    parts = []
    if span.progress is not None:
        parts.append(f"{span.progress * 100:.0f} %")
    if span.shards is not None:
        shards = f"{span.shards[0]}/{span.shards[1]} shards"
        parts.append(f"({shards})" if parts else shards)
    return " ".join(parts)


def _eta_text(view: RunView, now: float) -> str:
    eta = view.eta(now)
    overrun = view.overrun(now)
    warn = f" · ⚠ {overrun}" if overrun else ""
    if eta is None:
        return warn
    if eta <= 0 and not view.usual:
        return f" · over the expected {duration(view.expected_load_s or 0)}{warn}"
    return f" · ETA ~{duration(max(0.0, eta))}{warn}"


def status_line(view: RunView, now: float) -> str:
    """One sentence: what is happening and since when."""
    elapsed = duration(view.elapsed(now))
    cur = view.current
    phase = cur.phase.label if cur is not None else "starting"
    text: str
    if view.state is State.DEAD and view.death is not None:
        where = f" in {view.death.phase.label}" if view.death.phase is not None else ""
        text = f"DEAD{where} · {view.death.summary()}"
    elif view.state is State.STALLED and view.stalled is not None:
        text = f"STALLED in {phase} · {view.stalled.summary()} · {elapsed}"
    elif view.state is State.READY:
        took = duration(view.ready_took) if view.ready_took is not None else elapsed
        text = f"READY · serving · took {took}"
    elif view.state is State.LOADING and cur is not None:
        progress = progress_text(cur)
        text = f"{phase}{' ' + progress if progress else ''} · {elapsed}{_eta_text(view, now)}"
    elif view.state is State.STARTING:
        text = f"starting the server · {elapsed}{_eta_text(view, now)}"
    elif view.queued and cur is not None and view.state in (State.PENDING, State.PREFLIGHT):
        text = f"{cur.detail or 'queued'} · {elapsed}"
    elif view.state is State.PREFLIGHT:
        text = "preflight checks on the host"
    elif view.state is State.KILLING:
        text = "killing the run: TERM, then KILL after the grace, then a sweep"
    elif view.state is State.STOPPED:
        text = f"stopped after {elapsed} · no server running"
    else:
        text = "connecting"
    if view.job is not None and view.state.live:
        text = f"{text} · {view.job.words(now)}"
    return f"{view.link} · {text}" if view.link else text


@dataclass(frozen=True, slots=True)
class TimelineRow:
    mark: str  # ✓ done, ▶ current, ✗ died here
    label: str
    start_s: float  # seconds after launch
    duration_s: float
    progress: float | None
    detail: str
    current: bool
    failed: bool
    usual_s: float | None = None  # this phase's usual duration, from the history
    slow: bool = False  # 1.5x its usual duration or more


def timeline_rows(view: RunView, now: float) -> list[TimelineRow]:
    """Phases in order; the current one open, the one a death happened in marked."""
    rows = []
    launched = view.launched_at or 0.0
    phases = [span for span in view.spans if span.phase is not Phase.QUEUED]
    for span in (s for s in view.spans if s.phase is Phase.QUEUED):  # a job's, before it all
        rows.append(TimelineRow("▶" if span.end is None else "✓", span.phase.label,
                                span.start - launched, span.duration(now), None,
                                span.detail or "", span.end is None, False))
    if view.launched_at is not None and not view.queued:  # process start to the first phase
        first = phases[0].start if phases else None  # line: imports
        ended = view.state in (State.DEAD, State.STOPPED)
        took = (first if first is not None else (view.finished_at or now)) - launched
        failed = first is None and view.state is State.DEAD
        current = first is None and not ended
        rows.append(TimelineRow("✗" if failed else ("▶" if current else "✓"), STARTING,
                                0.0, max(0.0, took), None, "", current, failed))
    for span in phases:
        current = span.end is None
        failed = span.failed or (view.state is State.DEAD and span is view.current
                                 and span.phase is not Phase.SERVING and view.death is not None
                                 and view.death.phase is span.phase)
        mark = "✗" if failed else ("▶" if current else "✓")
        usual = view.usual.get(span.phase.label)
        took = span.duration(now)
        slow = usual is not None and took >= OVERRUN * usual and took - usual >= OVERRUN_MIN_S
        rows.append(TimelineRow(mark, span.phase.label, span.start - launched, took,
                                span.progress, progress_text(span), current, failed, usual,
                                slow))
    if view.state is State.DEAD and view.death is not None and view.death.phase is Phase.SERVING:
        rows.append(TimelineRow("✗", Phase.SERVING.label, view.death.since_launch, 0.0, None,
                                "died while serving", False, True))
    return rows
