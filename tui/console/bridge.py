"""Supervisor events → console messages: the only place the console reads the supervisor.

It keeps the view state that spans events (the process tree, GPU history, the last stall, how
long the launch took, whether the link is down) and turns each batch of events into the few
messages the widgets need. No drawing here, and no SSH, parsing or process logic in widgets.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

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
from tui.core.describe import (
    death_lines,
    duration,
    gpu_verdict,
    skipped_words,
    timed_out_outcome,
    timed_out_words,
)
from tui.core.gpuview import GpuHistory
from tui.core.logwindow import Entry, entries
from tui.core.proctree import ProcTree
from tui.core.protocol import LogSkipped as Skipped
from tui.core.specdecode import SpecDecodeInterval, SpecDecodeTotals
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
from tui.supervise.history import Launch
from tui.supervise.supervisor import (
    AgentHello,
    Fatal,
    GpusSeen,
    HistoryLoaded,
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
    Supervisor,
)

SPEC_TREND = 30  # logging intervals kept for the acceptance trend
SERVING_SERIES = ("running", "waiting", "prompt_tps", "gen_tps", "kv_usage", "prefix_hit")


def previous_text(previous: Launch | None) -> str:
    """`last launch 12-02 14:03: READY in 24m50s`, or nothing for a first launch."""
    if previous is None:
        return ""
    when = time.strftime("%m-%d %H:%M", time.localtime(previous.started))
    return f"last launch {when}: {previous.summary()}"


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
    _cause_offset: int | None = None

    def view(self) -> RunView:
        return view_of(self.sup.machine, stalled=self.stalled, ready_took=self.ready_took,
                       link=self.link, usual=self.usual)

    def translate(self, events: list[object], now: float) -> list[Message]:
        """Messages for a batch of events, in order; snapshots once per batch."""
        out: list[Message] = []
        lines: list[Entry] = []
        procs_changed = gpus_changed = run_changed = spec_changed = serving_changed = False

        def flush_lines() -> None:
            if lines:
                out.append(LogLines(tuple(lines)))
                lines.clear()

        for event in events:
            if isinstance(event, LinesAdded):
                lines.extend(entries(event.chunk))
                continue
            flush_lines()
            if isinstance(event, RunStarted):
                self.procs, self.gpus, self.gpu_note = ProcTree(), GpuHistory(), None
                self.stalled = self.ready_took = self._cause_offset = None
                self.kill_steps = []
                self.spec_interval = self.spec_totals = None
                self.spec_trend.clear()
                out.append(RunReset())
                procs_changed = gpus_changed = run_changed = True
            elif isinstance(event, ProcsSeen):
                self.procs.update(event.procs)
                procs_changed = True
            elif isinstance(event, ProcEnded):
                self.procs.ended(event.pid, self.sup.machine.name_of(event.pid, event.name),
                                 event.code, event.signal)
                procs_changed = True
            elif isinstance(event, GpusSeen):
                self.gpus.add(event.gpus)
                self.procs.gpus(event.gpus)
                gpus_changed = procs_changed = True
            elif isinstance(event, AgentHello):
                hello = event.hello
                self.gpu_note = None if hello.nvml_ok else (
                    f"{hello.nvml_error or 'no NVML on this host'}: no GPU data will come"
                    " (a CPU build, or no NVIDIA driver)")
                gpus_changed = True
            elif isinstance(event, (Died, CauseUpdated)):
                out.extend(self._death(event))
                procs_changed = run_changed = True
            elif isinstance(event, Stalled):
                self.stalled = event
                out.append(AlertRaised("stalled", "STALLED — " + event.summary(),
                                       "; ".join(s.words() for s in event.suspects)
                                       or "the server is alive but nothing moves", ring=True))
                run_changed = True
            elif isinstance(event, StacksTaken) and self.stalled is not None:
                where = "; ".join(s.summary() for s in event.stacks[:4])
                more = f" (+{len(event.stacks) - 4} more)" if len(event.stacks) > 4 else ""
                out.append(AlertRaised("stalled", "STALLED — " + self.stalled.summary(),
                                       f"stacks {event.why}: {where}{more} — d shows them all"))
            elif isinstance(event, ReadyTimedOut):
                keys = "" if event.limit.kill else " · k kills it, r restarts it"
                out.append(AlertRaised("timeout", f"TIMEOUT — {timed_out_words(event)}, still "
                                                  f"{event.state.value}",
                                       timed_out_outcome(event) + keys, ring=True))
                run_changed = True
            elif isinstance(event, Ready):
                self.ready_took = event.took
                out.append(AlertRaised("ready", f"READY — took {duration(event.took)}",
                                       f"serving on port {self.sup.served.port}",
                                       ring=True))
                run_changed = True
            elif isinstance(event, StateChanged):
                run_changed = True
                if event.previous is State.STALLED and event.state is State.LOADING:
                    self.stalled = None
                    out.append(AlertRaised("info", "moving again: the log resumed"))
            elif isinstance(event, (LinkLost, LinkRestored)):
                out.extend(self._link(event))
                run_changed = True
            elif isinstance(event, PreflightDone):
                out.append(PreflightShown(event.checks))
            elif isinstance(event, HistoryLoaded):
                self.usual = dict(event.usual)
                out.append(HistoryShown(previous_text(event.previous)))
                run_changed = True
            elif isinstance(event, SmokeDone):
                out.append(self._smoke(event))
            elif isinstance(event, ServingSeen):
                serving_changed = True
            elif isinstance(event, SpecDecodeSeen):
                self.spec_totals = event.totals
                spec_changed = True
            elif isinstance(event, KillProgress):
                step = event.step
                self.kill_steps.append(f"{step.step} {' '.join(map(str, step.pids)) or '—'}")
                out.append(AlertRaised("killing", "KILLING — " + " → ".join(self.kill_steps)))
            elif isinstance(event, KillDone):
                out.append(self._killed(event))
                self.kill_steps = []
                procs_changed = run_changed = True
            elif isinstance(event, Fatal):
                self.link = "NOT WATCHING (restart the console or press r)"
                out.append(AlertRaised("error", "ERROR — " + event.text))
                run_changed = True
            elif isinstance(event, Skipped):
                out.append(LogSkipped(event.start, event.end))
                out.append(AlertRaised("info", skipped_words(event.start, event.end)))
            elif isinstance(event, Notice):
                out.append(AlertRaised("warning" if event.level == "warning" else "info",
                                       event.text))
            elif isinstance(event, HelperExited):
                ex = event.exit
                out.append(AlertRaised("info", f"helper {ex.name} (pid {ex.pid}) exited "
                                               f"with code {ex.code}; not the server"))
            else:  # phase and progress changes, helper notes: the run view moved
                run_changed = True
        flush_lines()
        interval = self.sup.machine.spec_decode
        if interval is not None and interval is not self.spec_interval:
            self.spec_interval = interval
            self.spec_trend.append(interval.acceptance_rate)
            spec_changed = True
        serving = self.sup.machine.serving
        if serving_changed and serving.latest is not None:
            out.append(ServingChanged(serving.latest, {
                name: serving.series(name) for name in SERVING_SERIES}))
        if spec_changed:
            out.append(SpecDecodeChanged(self.spec_interval, self.spec_totals,
                                         tuple(self.spec_trend)))
        if procs_changed:
            m = self.sup.machine
            out.append(ProcsChanged(self.procs.rows(m.names(), m.procwatch.held_for(now, 0.0)),
                                    now))
        if gpus_changed:
            out.append(GpusChanged(self.gpus.rows(), self.gpu_note))
        if run_changed:
            out.append(RunChanged(self.view(), now))
        return out

    def _death(self, event: Died | CauseUpdated) -> list[Message]:
        death = event.death
        head, *rest = death_lines(death)
        out: list[Message] = [AlertRaised("dead", head, "\n".join(rest),
                                          ring=isinstance(event, Died))]
        if death.cause is not None and death.cause.offset != self._cause_offset:
            self._cause_offset = death.cause.offset
            out.append(RootCauseFound(death.cause.offset))
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
