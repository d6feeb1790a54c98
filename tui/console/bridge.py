"""Supervisor events → console messages: the only place the console reads the supervisor.

It keeps the view state that spans events (the process tree, GPU history, the last stall, how
long the launch took, whether the link is down) and turns each batch of events into the few
messages the widgets need. No drawing here, and no SSH, parsing or process logic in widgets.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from textual.message import Message

from tui.console.messages import (
    AlertRaised,
    GpusChanged,
    HistoryShown,
    LogLines,
    LogSkipped,
    PreflightShown,
    ProcsChanged,
    RootCauseFound,
    RunChanged,
    RunReset,
    ServingChanged,
    SpecDecodeChanged,
)
from tui.core.acceptance import SpecDecodeInterval, SpecDecodeTotals
from tui.core.describe import (
    death_lines,
    gpu_verdict,
    skipped_words,
    timed_out_outcome,
    timed_out_words,
)
from tui.core.gpuview import GpuHistory
from tui.core.logwindow import Entry, entries
from tui.core.proctree import ProcTree
from tui.core.protocol import LogSkipped as Skipped
from tui.core.state import (
    CauseUpdated,
    Died,
    HelperExited,
    LinesAdded,
    Ready,
    ReadyTimedOut,
    ServingSeen,
    Stalled,
    State,
    StateChanged,
)
from tui.core.status import RunView, view_of
from tui.core.units import duration
from tui.supervise.events import (
    AgentHello,
    Fatal,
    GpusSeen,
    HistoryLoaded,
    JobEnding,
    KillDone,
    KillProgress,
    LinkLost,
    LinkRestored,
    Notice,
    PreflightDone,
    ProcEnded,
    ProcsSeen,
    RunStarted,
    SmokeDone,
    SpecDecodeSeen,
    StacksTaken,
)
from tui.supervise.history import Launch
from tui.supervise.supervisor import Supervisor

SPEC_TREND = 30  # logging intervals kept for the acceptance trend
SERVING_SERIES = ("running", "waiting", "prompt_tps", "gen_tps", "kv_usage", "prefix_hit")


def previous_text(previous: Launch | None) -> str:
    """`last launch 12-02 14:03: READY in 24m50s`, or nothing for a first launch."""
    if previous is None:
        return ""
    when = time.strftime("%m-%d %H:%M", time.localtime(previous.started))
    return f"last launch {when}: {previous.summary()}"


@dataclass
class _Batch:
    """One batch's messages so far, and which views it changed (each snapshotted once)."""

    out: list[Message] = field(default_factory=list)
    procs: bool = False
    gpus: bool = False
    run: bool = False
    spec: bool = False
    serving: bool = False


@dataclass
class Bridge:
    """Supervisor events in, console messages out, for one Supervisor (across restarts)."""

    sup: Supervisor
    procs: ProcTree = field(default_factory=ProcTree)
    gpus: GpuHistory = field(default_factory=GpuHistory)
    gpu_note: str | None = None  # the agent said this host has no NVML
    stalled: Stalled | None = None
    ready_took: float | None = None
    link: str | None = None
    kill_steps: list[str] = field(default_factory=list)
    usual: dict[str, float] = field(default_factory=dict)
    spec_interval: SpecDecodeInterval | None = None
    spec_totals: SpecDecodeTotals | None = None
    spec_trend: deque[float] = field(default_factory=lambda: deque(maxlen=SPEC_TREND))
    _cause_marks: tuple[int | None, int | None] = (None, None)  # cause, runner-up
    _handlers: dict[type, Callable[[Any, _Batch], None]] = field(init=False, repr=False,
                                                              compare=False)

    def __post_init__(self) -> None:
        # each event type's handler, bound once; any other type only moves the run view
        self._handlers = {
            RunStarted: self._on_run_started, ProcsSeen: self._on_procs_seen,
            ProcEnded: self._on_proc_ended, GpusSeen: self._on_gpus_seen,
            AgentHello: self._on_hello, Died: self._on_death, CauseUpdated: self._on_death,
            Stalled: self._on_stalled, StacksTaken: self._on_stacks,
            ReadyTimedOut: self._on_timed_out, Ready: self._on_ready,
            StateChanged: self._on_state, LinkLost: self._on_link, LinkRestored: self._on_link,
            PreflightDone: self._on_preflight, HistoryLoaded: self._on_history,
            SmokeDone: self._on_smoke, ServingSeen: self._on_serving,
            SpecDecodeSeen: self._on_spec_decode, KillProgress: self._on_kill_progress,
            KillDone: self._on_killed, Fatal: self._on_fatal, Skipped: self._on_skipped,
            Notice: self._on_notice, HelperExited: self._on_helper_exited,
            JobEnding: self._on_job_ending,
        }

    def view(self) -> RunView:
        job = self.sup.job
        return view_of(self.sup.machine, stalled=self.stalled, ready_took=self.ready_took,
                       link=self.link, usual=self.usual,
                       job=job.clock if job is not None and job.end is None else None)

    def translate(self, events: list[object], now: float) -> list[Message]:
        """Messages for a batch of events, in order; snapshots once per batch."""
        batch = _Batch()
        lines: list[Entry] = []

        def flush_lines() -> None:
            if lines:
                batch.out.append(LogLines(tuple(lines)))
                lines.clear()

        for event in events:
            if isinstance(event, LinesAdded):
                lines.extend(entries(event.chunk))
                continue
            flush_lines()
            self._handlers.get(type(event), self._on_other)(event, batch)
        flush_lines()
        return self._snapshots(batch, now)

    def _snapshots(self, batch: _Batch, now: float) -> list[Message]:
        """The batch's messages, then one snapshot of each view the batch changed."""
        out = batch.out
        interval = self.sup.machine.spec_decode
        if interval is not None and interval is not self.spec_interval:
            self.spec_interval = interval
            self.spec_trend.append(interval.acceptance_rate)
            batch.spec = True
        serving = self.sup.machine.serving
        if batch.serving and serving.latest is not None:
            out.append(ServingChanged(serving.latest, {
                name: serving.series(name) for name in SERVING_SERIES}))
        if batch.spec:
            out.append(SpecDecodeChanged(self.spec_interval, self.spec_totals,
                                         tuple(self.spec_trend)))
        if batch.procs:
            m = self.sup.machine
            out.append(ProcsChanged(self.procs.rows(m.names(), m.procwatch.held_for(now, 0.0)),
                                    now))
        if batch.gpus:
            out.append(GpusChanged(self.gpus.rows(), self.gpu_note))
        if batch.run:
            out.append(RunChanged(self.view(), now))
        return out

    # -- one handler per event type (see _handlers) -----------------------------------------

    def _on_run_started(self, event: RunStarted, batch: _Batch) -> None:
        self.procs, self.gpus, self.gpu_note = ProcTree(), GpuHistory(), None
        self.stalled = self.ready_took = None
        self._cause_marks = (None, None)
        self.kill_steps = []
        self.spec_interval = self.spec_totals = None
        self.spec_trend.clear()
        batch.out.append(RunReset())
        batch.procs = batch.gpus = batch.run = True

    def _on_procs_seen(self, event: ProcsSeen, batch: _Batch) -> None:
        self.procs.update(event.procs)
        batch.procs = True

    def _on_proc_ended(self, event: ProcEnded, batch: _Batch) -> None:
        self.procs.ended(event.pid, event.name, event.code, event.signal)
        batch.procs = True

    def _on_gpus_seen(self, event: GpusSeen, batch: _Batch) -> None:
        self.gpus.add(event.gpus)
        self.procs.gpus(event.gpus)
        batch.gpus = batch.procs = True

    def _on_hello(self, event: AgentHello, batch: _Batch) -> None:
        hello = event.hello
        self.gpu_note = None if hello.nvml_ok else (
            f"{hello.nvml_error or 'no NVML on this host'}: no GPU data will come"
            " (a CPU build, or no NVIDIA driver)")
        batch.gpus = True

    def _on_death(self, event: Died | CauseUpdated, batch: _Batch) -> None:
        batch.out.extend(self._death(event))
        batch.procs = batch.run = True

    def _on_stalled(self, event: Stalled, batch: _Batch) -> None:
        self.stalled = event
        batch.out.append(AlertRaised("stalled", "STALLED — " + event.summary(),
                                     "; ".join(s.words() for s in event.suspects)
                                     or "the server is alive but nothing moves", ring=True))
        batch.run = True

    def _on_stacks(self, event: StacksTaken, batch: _Batch) -> None:
        if self.stalled is None:  # stacks of no stall: only the run view moved
            self._on_other(event, batch)
            return
        where = "; ".join(s.summary() for s in event.stacks[:4])
        more = f" (+{len(event.stacks) - 4} more)" if len(event.stacks) > 4 else ""
        batch.out.append(AlertRaised("stalled", "STALLED — " + self.stalled.summary(),
                                     f"stacks {event.why}: {where}{more} — d shows them all"))

    def _on_timed_out(self, event: ReadyTimedOut, batch: _Batch) -> None:
        keys = "" if event.limit.kill else " · k kills it, r restarts it"
        batch.out.append(AlertRaised("timeout", f"TIMEOUT — {timed_out_words(event)}, still "
                                                f"{event.state.value}",
                                     timed_out_outcome(event) + keys, ring=True))
        batch.run = True

    def _on_job_ending(self, event: JobEnding, batch: _Batch) -> None:
        batch.out.append(AlertRaised("ending", f"TIME LIMIT NEAR — {event.words()}",
                                     "the scheduler ends the job then, server and all: save "
                                     "what must outlive it", ring=True))
        batch.run = True

    def _on_ready(self, event: Ready, batch: _Batch) -> None:
        self.ready_took = event.took
        batch.out.append(AlertRaised("ready", f"READY — took {duration(event.took)}",
                                     f"serving on port {self.sup.served.port}", ring=True))
        batch.run = True

    def _on_state(self, event: StateChanged, batch: _Batch) -> None:
        batch.run = True
        if event.previous is State.STALLED and event.state in (State.LOADING, State.READY):
            self.stalled = None
            batch.out.append(AlertRaised("info", "moving again: " + (
                "the log resumed" if event.state is State.LOADING else "serving resumed")))

    def _on_link(self, event: LinkLost | LinkRestored, batch: _Batch) -> None:
        batch.out.extend(self._link(event))
        batch.run = True

    def _on_preflight(self, event: PreflightDone, batch: _Batch) -> None:
        batch.out.append(PreflightShown(event.checks))

    def _on_history(self, event: HistoryLoaded, batch: _Batch) -> None:
        self.usual = dict(event.usual)
        batch.out.append(HistoryShown(previous_text(event.previous)))
        batch.run = True

    def _on_smoke(self, event: SmokeDone, batch: _Batch) -> None:
        batch.out.append(self._smoke(event))

    def _on_serving(self, event: ServingSeen, batch: _Batch) -> None:
        batch.serving = True

    def _on_spec_decode(self, event: SpecDecodeSeen, batch: _Batch) -> None:
        self.spec_totals = event.totals
        batch.spec = True

    def _on_kill_progress(self, event: KillProgress, batch: _Batch) -> None:
        step = event.step
        self.kill_steps.append(f"{step.step} {' '.join(map(str, step.pids)) or '—'}")
        batch.out.append(AlertRaised("killing", "KILLING — " + " → ".join(self.kill_steps)))

    def _on_killed(self, event: KillDone, batch: _Batch) -> None:
        batch.out.append(self._killed(event))
        self.kill_steps = []
        batch.procs = batch.run = True

    def _on_fatal(self, event: Fatal, batch: _Batch) -> None:
        self.link = "NOT WATCHING (restart the console or press r)"
        batch.out.append(AlertRaised("error", "ERROR — " + event.text))
        batch.run = True

    def _on_skipped(self, event: Skipped, batch: _Batch) -> None:
        batch.out.append(LogSkipped(event.start, event.end))
        batch.out.append(AlertRaised("info", skipped_words(event.start, event.end)))

    def _on_notice(self, event: Notice, batch: _Batch) -> None:
        batch.out.append(AlertRaised("warning" if event.level == "warning" else "info",
                                     event.text))

    def _on_helper_exited(self, event: HelperExited, batch: _Batch) -> None:
        ex = event.exit
        batch.out.append(AlertRaised("info", f"helper {ex.name} (pid {ex.pid}) exited "
                                             f"with code {ex.code}; not the server"))

    def _on_other(self, event: object, batch: _Batch) -> None:
        """Phase and progress changes, helper notes: the run view moved."""
        batch.run = True

    def _death(self, event: Died | CauseUpdated) -> list[Message]:
        death = event.death
        head, *rest = death_lines(death)
        second = death.runner_up
        if second is not None and death.cause is not None:
            rest.append(f"runner-up: {second.line} (c steps between the two in the log)")
        out: list[Message] = [AlertRaised("dead", head, "\n".join(rest),
                                          ring=isinstance(event, Died))]
        marks = (death.cause.offset if death.cause is not None else None,
                 second.offset if second is not None else None)
        if death.cause is not None and marks != self._cause_marks:
            self._cause_marks = marks
            out.append(RootCauseFound(death.cause.offset, marks[1]))
        return out

    def _smoke(self, event: SmokeDone) -> AlertRaised:
        took = f" (took {duration(self.ready_took)})" if self.ready_took is not None else ""
        if not event.ok:
            return AlertRaised("warning", f"UP BUT NOT SERVING{took} — the smoke request failed",
                               event.error)
        tokens = f", {event.tokens} tokens" if event.tokens is not None else ""
        return AlertRaised("ready", f"READY{took} · serving: smoke request answered in "
                                    f"{event.seconds:.2f}s{tokens}", f"“{event.first_line}”")

    def _link(self, event: LinkLost | LinkRestored) -> list[Message]:
        if isinstance(event, LinkLost):
            self.link = f"connection lost, retrying in {event.retry_in:.1f}s"
            return [AlertRaised("link", f"CONNECTION LOST to {event.host} — retrying in "
                                        f"{event.retry_in:.1f}s", event.reason)]
        self.link = None
        return [AlertRaised("info", f"connection restored to {event.host}; "
                                    "the log resumes where it stopped")]

    def _killed(self, event: KillDone) -> AlertRaised:
        killed = event.killed
        steps = " → ".join(self.kill_steps)
        if killed.remaining:
            return AlertRaised("error", "STILL RUNNING after kill: pids "
                               + ", ".join(map(str, killed.remaining)), steps)
        released, gpu = gpu_verdict(killed)
        return AlertRaised("stopped" if released else "error",
                           f"STOPPED — no process of the run remains · {gpu}", steps)
