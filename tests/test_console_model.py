"""The console's pure models, as tables: log window, process tree, GPU history, status words."""

from __future__ import annotations

import calendar
import re
from itertools import pairwise
from pathlib import Path

import pytest

from tui.core.gpuview import GpuHistory
from tui.core.logline import parse_line
from tui.core.logtime import LogClock
from tui.core.logwindow import Entry, LogWindow
from tui.core.noise import rule_from_pattern
from tui.core.phases import Phase
from tui.core.proctree import ProcTree
from tui.core.protocol import GpuInfo, GpuProc, Gpus, Health, ProcInfo, Procs
from tui.core.state import Death, LaunchMachine, Ready, Stalled, State
from tui.core.status import STARTING, RunView, status_line, timeline_rows
from tui.core.timeline import PhaseSpan

HIDE = rule_from_pattern("hide:fw", "hide", "FutureWarning", "FutureWarning")
HARMLESS = rule_from_pattern("harmless:triton", "harmless", "Triton", "Triton import")


def entries(texts: list[str], start: int = 0) -> list[Entry]:
    out, offset = [], start
    for text in texts:
        rule = HIDE if "FutureWarning" in text else HARMLESS if "Triton" in text else None
        out.append(Entry.of(parse_line(text, offset), rule))
        offset += len(text.encode()) + 1
    return out


# -- log window ---------------------------------------------------------------------------------

def test_window_filters_counts_and_caps() -> None:
    w = LogWindow(cap=5)
    w.append(entries(["a", "FutureWarning x", "Triton y", "b", "c", "d", "e"]))
    assert len(w) == 5 and w.evicted[True] == 2
    assert [e.line.plain for e in w.view(raw=True)] == ["Triton y", "b", "c", "d", "e"]
    assert [e.line.plain for e in w.view(raw=False)] == ["Triton y", "b", "c", "d", "e"]
    assert w.hidden == {"FutureWarning": 1} and w.harmless == {"Triton import": 1}
    assert w.start == entries(["a", "FutureWarning x"])[1].end  # "Triton y" starts there
    assert w.log_end == sum(len(t) + 1 for t in ["a", "FutureWarning x", "Triton y", "b",
                                                  "c", "d", "e"])


def test_window_prepends_older_pages_and_detaches_past_the_cap() -> None:
    lines = [f"line {i}" for i in range(12)]
    all_entries = entries(lines)
    w = LogWindow(cap=6)
    w.append(all_entries)
    assert [e.line.plain for e in w.view(True)] == lines[6:]
    w.prepend(all_entries[3:6])
    assert w.detached and len(w) == 6
    assert [e.line.plain for e in w.view(True)] == lines[3:9]  # the newest went
    w.append(entries(["line 12"], all_entries[-1].end))
    assert w.missed == 1 and len(w) == 6  # beside the window while scrolled back
    assert [e.line.plain for e in w.view(True)] == lines[3:9]
    w.resume()  # follow again: the newest lines, contiguous, nothing fetched
    assert not w.detached and w.missed == 0
    held = list(w.view(True))
    assert [e.line.plain for e in held] == [*lines[7:], "line 12"]
    assert all(a.end == b.line.offset for a, b in pairwise(held))


def test_window_finds_offsets_and_matches_in_the_current_view() -> None:
    w = LogWindow()
    es = entries(["alpha", "FutureWarning beta", "gamma beta"])
    w.append(es)
    assert w.find(es[2].line.offset, raw=False) == 1
    assert w.find(es[2].line.offset, raw=True) == 2
    assert w.find(10**9, raw=True) is None
    assert w.matches(re.compile("beta"), raw=False) == [1]
    assert w.matches(re.compile("beta"), raw=True) == [1, 2]
    w.clear()
    assert len(w) == 0 and w.hidden == {} and w.log_end == 0


# -- process tree -------------------------------------------------------------------------------

def proc(pid: int, ppid: int | None, name: str, alive: bool = True) -> ProcInfo:
    return ProcInfo(pid, ppid, name, name, "running" if alive else None, 5.0, 2**30, 100.0,
                    alive)


def test_tree_orders_parents_first_and_keeps_the_dead() -> None:
    tree = ProcTree()
    tree.update(Procs(1.0, (proc(10, 1, "vllm"), proc(20, 10, "VLLM::EngineCor"),
                            proc(31, 20, "VLLM::Worker"), proc(30, 20, "VLLM::Worker"))))
    tree.gpus(Gpus(1.0, (GpuInfo(0, "H200", 5, 10, 1, (GpuProc(30, 7 * 2**30),)),)))
    tree.ended(31, "Worker_TP1", 1, None)
    rows = tree.rows({10: "APIServer", 20: "EngineCore_DP0", 30: "Worker_TP0"})
    assert [(r.depth, r.pid, r.name) for r in rows] == [
        (0, 10, "APIServer"), (1, 20, "EngineCore_DP0"), (2, 30, "Worker_TP0"),
        (2, 31, "Worker_TP1")]  # named as its end was told
    assert rows[2].gpu_mem == 7 * 2**30 and rows[2].alive
    assert not rows[3].alive and rows[3].exit == "exit 1" and rows[3].state == "dead"
    # a later snapshot that still lists it alive-false does not lose its code
    tree.update(Procs(2.0, (proc(31, 20, "VLLM::Worker", alive=False),)))
    assert tree.rows()[3].exit == "exit 1"


def test_a_forked_child_that_ended_is_its_parents_child_not_its_parent() -> None:
    """A worker's child adopted before its exec carries the worker's title (and the log's
    name for the worker's pid is no help): once its end is told as `child of …`, the pane
    says so; ended cleanly it leaves like any helper, killed it stays as news."""
    tree = ProcTree()
    tree.update(Procs(1.0, (proc(20, 1, "VLLM::EngineCor"), proc(30, 20, "VLLM::Worker"),
                            proc(50, 30, "VLLM::Worker"), proc(51, 30, "VLLM::Worker"))))
    names = {20: "EngineCore_DP0", 30: "Worker_TP0", 50: "Worker_TP0", 51: "Worker_TP0"}
    assert [r.name for r in tree.rows(names)] == ["EngineCore_DP0", "Worker_TP0",
                                                  "Worker_TP0", "Worker_TP0"]
    tree.ended(50, "child of Worker_TP0", None, None)
    tree.ended(51, "child of Worker_TP0", None, 9)
    rows = tree.rows(names)
    assert [(r.pid, r.name, r.exit) for r in rows] == [
        (20, "EngineCore_DP0", None), (30, "Worker_TP0", None),
        (51, "child of Worker_TP0", "signal 9")]


@pytest.mark.parametrize(("code", "signal", "shown"), [
    (1, None, "exit 1"), (None, 9, "signal 9"), (None, None, "exit ?"), (0, None, "exit 0")])
def test_tree_says_how_a_process_ended(code: int | None, signal: int | None,
                                       shown: str) -> None:
    tree = ProcTree()
    tree.ended(5, "Worker_TP0", code, signal)
    assert tree.rows()[0].exit == shown


# -- GPU history ---------------------------------------------------------------------------------

def gpus(used: list[int]) -> Gpus:
    return Gpus(0.0, tuple(GpuInfo(i, "H200", u, 100, 50, (GpuProc(100 + i, u),))
                           for i, u in enumerate(used)))


def test_a_gpu_flat_while_others_grow_is_lagging() -> None:
    h = GpuHistory()
    for step in range(8):
        h.add(gpus([10 * step, 10 * step, min(20, 10 * step)]))
    assert h.lagging() == {2}
    rows = h.rows()
    assert [r.lagging for r in rows] == [False, False, True]
    assert rows[0].holder == 100 and rows[0].history[-1] == 70


def test_all_flat_is_not_lagging_and_history_stays_bounded() -> None:
    h = GpuHistory(keep=16)
    for _ in range(100):
        h.add(gpus([50, 50]))
    assert h.lagging() == set()
    assert all(len(r.history) <= 16 for r in h.rows())


# -- status line and timeline rows --------------------------------------------------------------

T0 = 1000.0


def view(state: State, spans: tuple[PhaseSpan, ...] = (), **kw: object) -> RunView:
    return RunView(state, spans, T0, kw.pop("finished_at", None), 1500.0, **kw)  # type: ignore[arg-type]


LOADING = (PhaseSpan(Phase.CONFIG, T0 + 5, T0 + 60),
           PhaseSpan(Phase.WEIGHTS, T0 + 60, None, 0.43, (31, 72)))
DEATH = Death(77, "Worker_TP0", 1, None, T0 + 23, 23.0, Phase.CONFIG, None)


@pytest.mark.parametrize(("v", "now", "expected"), [
    (view(State.LOADING, LOADING), T0 + 724,
     "loading weights 43 % (31/72 shards) · 12m04s · ETA ~12m56s"),
    (view(State.LOADING, LOADING), T0 + 1600,
     "loading weights 43 % (31/72 shards) · 26m40s · over the expected 25m00s"),
    (view(State.STARTING), T0 + 3, "starting the server · 3.0s · ETA ~24m57s"),
    (view(State.READY, LOADING, finished_at=T0 + 1490, ready_took=1490.0), T0 + 2000,
     "READY · serving · took 24m50s"),
    (view(State.DEAD, LOADING[:1], death=DEATH, finished_at=T0 + 23), T0 + 99,
     "DEAD in reading config · Worker_TP0 (pid 77) died, exit code 1, 23.0s after launch"),
    (view(State.STALLED, LOADING, stalled=Stalled(612.0, (0, 1), T0 + 700)), T0 + 700,
     "STALLED in loading weights · no log line for 612s, GPU memory and utilisation frozen on "
     "0, 1 · 11m40s"),
    (view(State.LOADING, LOADING, link="connection lost, retrying in 2.0s"), T0 + 724,
     "connection lost, retrying in 2.0s · loading weights 43 % (31/72 shards) · 12m04s · "
     "ETA ~12m56s"),
    (view(State.STOPPED, LOADING, finished_at=T0 + 90), T0 + 999,
     "stopped after 1m30s · no server running"),
])
def test_status_line_in_words(v: RunView, now: float, expected: str) -> None:
    assert status_line(v, now) == expected


def test_timeline_rows_mark_the_current_and_the_failed_phase() -> None:
    rows = timeline_rows(view(State.LOADING, LOADING), T0 + 100)
    # the first row is the time before the first phase line (the interpreter's start-up,
    # the engine's imports), so that the rows add up to the elapsed time
    assert [(r.mark, r.label, r.start_s, r.duration_s) for r in rows] == [
        ("✓", STARTING, 0.0, 5.0), ("✓", "reading config", 5.0, 55.0),
        ("▶", "loading weights", 60.0, 40.0)]
    assert sum(r.duration_s for r in rows) == 100.0
    assert rows[2].detail == "43 % (31/72 shards)" and rows[2].current
    failed = (PhaseSpan(Phase.CONFIG, T0 + 5, T0 + 23, failed=True),)
    dead = timeline_rows(view(State.DEAD, failed, death=DEATH), T0 + 30)
    assert dead[1].mark == "✗" and dead[1].failed and not dead[0].failed
    # nothing logged yet: the start-up is the current row; dead before a line: it failed
    (first,) = timeline_rows(view(State.STARTING, ()), T0 + 12)
    assert (first.mark, first.label, first.duration_s, first.current) == (
        "▶", STARTING, 12.0, True)
    (gone,) = timeline_rows(view(State.DEAD, (), death=DEATH, finished_at=T0 + 3), T0 + 30)
    assert (gone.mark, gone.duration_s, gone.failed) == ("✗", 3.0, True)
    serving = Death(77, "EngineCore_DP0", None, 9, T0 + 2000, 2000.0, Phase.SERVING, None)
    done = (PhaseSpan(Phase.READY_LOG, T0 + 1400, T0 + 1490),)
    rows = timeline_rows(view(State.DEAD, done, death=serving), T0 + 2001)
    assert rows[-1].label == "serving" and rows[-1].failed


# -- the log's own clock (attach replays phases at the times they happened) ----------------------

def test_log_clock_anchors_the_zone_on_the_launch() -> None:
    launched = calendar.timegm((2026, 9, 30, 12, 2, 10, 0, 0, 0))  # 14:02:10 at UTC+2
    clock = LogClock(launched)
    first = "(APIServer pid=1) INFO 09-30 14:02:11 [api_server.py:1896] vLLM API server"
    assert clock.time_of(first) == launched + 1
    assert clock.time_of("(Worker_TP0 pid=3) INFO 09-30 14:27:01 [x.py:1] y") == launched + 1491
    assert clock.time_of("Loading safetensors checkpoint shards: 3%") is None
    assert LogClock(launched).time_of("INFO 02-30 10:00:00 [x.py:1] no such day") is None


def _with_offsets(text: str) -> list[tuple[int, str]]:
    """The log's lines with their byte offsets, as the agent sends them."""
    offset, fed = 0, []
    for raw in text.splitlines():
        fed.append((offset, raw))
        offset += len(raw.encode()) + 1
    return fed


def test_attach_replays_phases_at_the_times_they_were_logged() -> None:
    lines = (Path(__file__).parent / "fixtures" / "vllm-startup-ready.log").read_text()
    launched = calendar.timegm((2026, 9, 30, 14, 2, 10, 0, 0, 0))  # the host logs in UTC
    machine = LaunchMachine()
    attach_at = launched + 3600.0  # an hour later, the console attaches
    machine.started(1, launched, attach_at)
    machine.feed_lines(_with_offsets(lines), attach_at)
    spans = machine.timeline.spans
    assert [s.phase for s in spans][:3] == [Phase.LAUNCH, Phase.CONFIG, Phase.WEIGHTS]
    assert all(launched <= s.start < attach_at for s in spans)
    weights = next(s for s in spans if s.phase is Phase.WEIGHTS)
    assert weights.duration(attach_at) > 10  # not zero: it took its real time
    live = LaunchMachine()
    live.started(1, launched, launched + 1)
    live.feed_lines([(0, lines.splitlines()[0])], launched + 1.5)
    assert live.timeline.spans[0].start == launched + 1.5  # a live line counts from now


def test_attach_to_a_server_ready_long_ago_reports_its_real_load_time() -> None:
    lines = (Path(__file__).parent / "fixtures" / "vllm-startup-ready.log").read_text()
    launched = calendar.timegm((2026, 9, 30, 14, 2, 10, 0, 0, 0))
    attach_at = launched + 3 * 86400.0  # three days of serving later
    machine = LaunchMachine()
    machine.started(1, launched, attach_at)
    machine.feed_lines(_with_offsets(lines), attach_at)
    machine.feed_health(Health(True, "/health", 200, attach_at), attach_at)
    ready = next(e for e in machine.feed_health(Health(True, "/v1/models", 200, attach_at),
                                                 attach_at) if isinstance(e, Ready))
    assert 150 < ready.took < 200  # the log's "Application startup complete", not 3 days
    assert machine.state is State.READY


def test_helpers_that_ended_cleanly_leave_the_tree_failures_and_server_stay() -> None:
    tree = ProcTree()
    tree.update(Procs(1.0, (proc(10, 1, "vllm"), proc(20, 10, "VLLM::EngineCor"),
                            proc(40, 10, "cc1plus"), proc(41, 10, "python3"),
                            proc(42, 20, "VLLM::Worker"))))
    tree.ended(40, "cc1plus", 0, None)  # a compiler finished: gone
    tree.ended(41, "python3", 1, None)  # a helper failed: news, stays
    tree.ended(42, "Worker_TP0", 0, None)  # a worker exiting 0 is a death: stays
    rows = tree.rows({10: "APIServer", 20: "EngineCore_DP0", 42: "Worker_TP0"})
    assert [r.pid for r in rows] == [10, 20, 42, 41]
