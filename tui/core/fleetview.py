"""The fleet's rows in words: a member's phase, its GPUs, its standing alert, and a run's state
over its members. Pure, so the fleet pane only colours what this says."""

from __future__ import annotations

from collections.abc import Iterable

from tui.core.gpuview import GpuRow
from tui.core.logline import strip_escapes
from tui.core.state import State
from tui.core.status import RunView

ALERT_WIDTH = 72  # characters of an alert kept on a fleet row
# how bad a state is, for a run of several members: its worst member speaks for it
_RANK = {State.DEAD: 7, State.STALLED: 6, State.KILLING: 5, State.PREFLIGHT: 4,
         State.STARTING: 4, State.LOADING: 4, State.PENDING: 3, State.STOPPED: 2, State.READY: 1}


def worst(states: Iterable[State]) -> State:
    """The state a run shows: its worst member's (READY only when every member is)."""
    return max(states, key=_RANK.__getitem__, default=State.PENDING)


def phase_words(view: RunView) -> str:
    """`loading weights 43 %`, `serving`, the phase a death happened in, or `—`: narrow."""
    if view.state is State.READY:
        return "serving"
    if view.state is State.DEAD and view.death is not None and view.death.phase is not None:
        return view.death.phase.label
    cur = view.current
    if cur is None:
        return "—"
    if cur.progress is not None:
        return f"{cur.phase.label} {cur.progress * 100:.0f} %"
    if cur.shards is not None:
        return f"{cur.phase.label} {cur.shards[0]}/{cur.shards[1]}"
    return cur.phase.label


def gpu_words(rows: Iterable[GpuRow]) -> str:
    """`8/8 · 1028/1128G`: devices holding a process of the host out of all, then memory used
    over total (GiB)."""
    rows = tuple(rows)
    if not rows:
        return "—"
    busy = sum(1 for r in rows if r.info.procs)
    used = sum(r.info.mem_used or 0 for r in rows) / 2**30
    total = sum(r.info.mem_total or 0 for r in rows) / 2**30
    return f"{busy}/{len(rows)} · {used:.0f}/{total:.0f}G"


def alert_words(kind: str, title: str, view: RunView) -> str:
    """The alert a row keeps, on one short plain line: a death's root cause (its headline when
    none was found); a stall, a lost link or a timeout that has since cleared (READY after all)
    says nothing any more."""
    if (kind == "stalled" and view.state is not State.STALLED) or (
            kind == "link" and view.link is None) or (
            kind == "timeout" and view.state is State.READY):
        return ""
    death = view.death
    if kind == "dead" and death is not None and death.cause is not None:
        line = death.cause.line
    else:
        line = title.splitlines()[0] if title else ""
    line = strip_escapes(line).strip()
    return line if len(line) <= ALERT_WIDTH else line[:ALERT_WIDTH - 1] + "…"
