"""The console's messages: small dataclasses the bridge posts to the widgets.

Snapshots (processes, GPUs, the run view) replace an older one still in the queue
(`can_replace`), so a burst of updates costs one redraw; log lines never replace each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from tui.core.acceptance import SpecDecodeInterval, SpecDecodeTotals
from tui.core.gpuview import GpuRow
from tui.core.logwindow import Entry
from tui.core.proctree import ProcRow
from tui.core.protocol import Check
from tui.core.serving import ServingSample
from tui.core.status import RunView


@dataclass
class LogLines(Message):
    """New live lines of the run's log, in order."""

    entries: tuple[Entry, ...]


@dataclass
class LogSkipped(Message):
    """Attached to a long log: bytes [start, end) were not sent; the lines after follow."""

    start: int
    end: int


@dataclass
class RootCauseFound(Message):
    """The root cause's line, by byte offset: mark it and jump to it; the runner-up's, when
    the ranking was not sure, is marked too (key c steps between them)."""

    offset: int
    runner_up: int | None = None


@dataclass
class ProcsChanged(Message):
    rows: tuple[ProcRow, ...]
    now: float

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ProcsChanged)


@dataclass
class GpusChanged(Message):
    rows: tuple[GpuRow, ...]
    note: str | None = None  # why there are no rows: "no NVML on this host (...)"

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GpusChanged)


@dataclass
class RunChanged(Message):
    view: RunView
    now: float

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunChanged)


@dataclass
class AlertRaised(Message):
    """A banner: `kind` is dead, stalled, timeout, ending (a Slurm job's time limit near),
    ready, link, killing, stopped, error or info."""

    kind: str
    title: str
    detail: str = ""
    ring: bool = False  # a transition (DEAD, STALLED, READY): bell and tmux, once


@dataclass
class PreflightShown(Message):
    checks: tuple[Check, ...]


@dataclass
class RunReset(Message):
    """A new run begins (launch, restart, attach): panes start empty."""


@dataclass
class HistoryShown(Message):
    """How this profile's previous launch ended, in words (empty: no earlier launch)."""

    text: str


@dataclass
class ServingChanged(Message):
    """The serving readout: the newest reading and each figure over the last minutes."""

    latest: ServingSample
    series: dict[str, tuple[float, ...]]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ServingChanged)


@dataclass
class SpecDecodeChanged(Message):
    """The speculative-decoding readout: the last logging interval, the server's counters,
    and the acceptance rate of the recent intervals (the trend)."""

    interval: SpecDecodeInterval | None
    totals: SpecDecodeTotals | None
    trend: tuple[float, ...]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SpecDecodeChanged)
