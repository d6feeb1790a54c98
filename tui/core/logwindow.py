"""The console's view of a run's log: a capped window of classified lines, filtered or raw.

However long the log, the console holds at most `cap` lines; older ones stay in the remote
file and come back a page at a time when the user scrolls past the top (`prepend`). A window
scrolled back that far is detached from the live end: the newest lines wait beside it (at most
`cap` of them), and following again (`resume`) puts them back, contiguous, with nothing fetched.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable

from tui.core.logchunk import LineChunk
from tui.core.logline import LogLine
from tui.core.noise import NoiseRule

DEFAULT_CAP = 20_000


class Entry:
    """One line of the window: a place in the chunk it arrived in (decoded when drawn)."""

    __slots__ = ("chunk", "index")

    def __init__(self, chunk: LineChunk, index: int) -> None:
        self.chunk, self.index = chunk, index

    @classmethod
    def of(cls, line: LogLine, rule: NoiseRule | None) -> Entry:
        """An entry for a line decoded elsewhere (a page read back from the host)."""
        chunk = LineChunk([line.offset], [line.raw])
        chunk.classified((0,), (line,), (rule,))
        return cls(chunk, 0)

    @property
    def line(self) -> LogLine:
        return self.chunk.line(self.index)

    @property
    def rule(self) -> NoiseRule | None:
        return self.chunk.rule(self.index)

    @property
    def offset(self) -> int:
        return self.chunk.offsets[self.index]

    @property
    def raw(self) -> str:
        return self.chunk.raws[self.index]

    @property
    def shown(self) -> bool:
        """Shown in the filtered view: not hidden by a rule (harmless lines show, dimmed)."""
        rule = self.chunk.rule(self.index)
        return rule is None or rule.kind != "hide"

    @property
    def end(self) -> int:
        return self.chunk.end(self.index)


def entries(chunk: LineChunk) -> list[Entry]:
    return [Entry(chunk, i) for i in range(len(chunk))]


# A vLLM INFO record and its process (its prefix may be coloured), and a tqdm bar's line. A run
# of INFO records of one kind of process (the route table, per-rank and per-layer repetition,
# a burst of settings) is one row of the filtered view, and so is a run of one bar's updates
# (shown at its latest). A line that moved the launch to a new phase always heads a row;
# warnings, errors, tracebacks and noise never join one.
_ESC = r"(?:\x1b\[[\d;]*m)?"
_FOLDABLE = re.compile(rf"{_ESC}\((?P<proc>[A-Za-z]+)[^()]*\){_ESC} INFO \d\d-\d\d \d\d:\d\d:\d\d"
                       r"(?:\.\d+)? \[")
_BAR = re.compile(r"(?P<bar>[^:|\x1b]{1,80}):\s+\d{1,3}%(?:\s|\|)")
_ROUTE = re.compile(r"Route: (\S+?),? Methods")
_WORDS = re.compile(r"[A-Za-z0-9]{3}")


def fold_kind(entry: Entry) -> str | None:
    """What makes lines one row: the kind of process of an INFO record no rule marks
    (`Worker` for Worker_TP3), or the bar a progress line draws; None: never folded."""
    raw = entry.raw
    found = _FOLDABLE.match(raw) or _BAR.match(raw)
    if found is None or entry.rule is not None:
        return None
    return found.group("proc") if found.re is _FOLDABLE else "bar " + found.group("bar")


class Fold:
    """Consecutive INFO records of one kind of process, shown as one row: the first, how many
    more, vLLM's route table as `API routes: N (…)`; a bar's updates at the latest. The raw
    view shows every line."""

    __slots__ = ("kind", "members")

    def __init__(self, kind: str, members: list[Entry]) -> None:
        self.kind, self.members = kind, members

    @property
    def bar(self) -> bool:
        return self.kind.startswith("bar ")

    @property
    def line(self) -> LogLine:
        """The line the row is drawn from: a bar's latest, else the first that says words (the
        banner's version row, not its art)."""
        if self.bar:
            return self.members[-1].line
        return next((e.line for e in self.members if _WORDS.search(e.line.message)),
                    self.members[0].line)

    @property
    def rule(self) -> NoiseRule | None:
        return None

    @property
    def offset(self) -> int:
        return self.members[0].offset

    @property
    def raw(self) -> str:
        return self.members[0].raw

    @property
    def end(self) -> int:
        return self.members[-1].end

    @property
    def shown(self) -> bool:
        return True

    def summary(self) -> str:
        """The row's words after the first line's prefix: its message, how many more, and
        vLLM's route table in one phrase; a bar as it stands now."""
        if self.bar:
            return self.line.message
        routes = [m.group(1) for e in self.members[1:] if (m := _ROUTE.search(e.raw))]
        table = f": API routes: {len(routes)} ({', '.join(dict.fromkeys(routes))})" \
            if len(routes) > 2 else ""
        return (f"{self.line.message}  (+{len(self.members) - 1} more INFO lines{table};"
                " f shows them)")


Row = Entry | Fold


def fold_rows(entries: Iterable[Entry], rows: deque[Row] | None = None,
              kind: str | None = None) -> tuple[deque[Row], str | None]:
    """The filtered view's rows for shown entries appended after `rows` (whose last row is of
    fold kind `kind`): a line joins the row before it when it is of the same kind and moved
    the launch to no new phase."""
    out: deque[Row] = deque() if rows is None else rows
    for entry in entries:
        mine = fold_kind(entry)
        if mine is not None and mine == kind and out \
                and entry.index not in entry.chunk.phase_starts:
            last = out[-1]
            if isinstance(last, Fold):
                last.members.append(entry)
            else:
                out[-1] = Fold(mine, [last, entry])
        else:
            out.append(entry)
        kind = mine
    return out, kind


class LogWindow:
    """Lines [first offset, end) of one run's log, at most `cap` of them."""

    def __init__(self, cap: int = DEFAULT_CAP) -> None:
        self.cap = cap
        self._entries: deque[Entry] = deque()
        self._shown: deque[Row] = deque()  # the filtered view: alike lines folded in a row
        self._fold: str | None = None  # the fold kind of the filtered view's last row
        self.hidden: dict[str, int] = {}  # label → lines hidden, over the whole run
        self.harmless: dict[str, int] = {}
        self.detached = False  # scrolled back past the cap: not following the live end
        self.missed = 0  # live lines that arrived while detached
        self._live: deque[Entry] = deque()  # while detached: the newest lines, contiguous
        self.log_end = 0  # the end of the log as far as the live stream has reached
        self.evicted = {True: 0, False: 0}  # lines dropped from the front, by view (raw?)
        self.skipped = 0  # bytes of the log not streamed on attach (read back by page)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def start(self) -> int:
        """Byte offset of the oldest line held (what is before it is in the remote file)."""
        return self._entries[0].offset if self._entries else self.log_end

    def view(self, raw: bool) -> deque[Entry] | deque[Row]:
        return self._entries if raw else self._shown

    def append(self, entries: Iterable[Entry]) -> None:
        """Live lines: into the window, or beside it while it is detached."""
        for entry in entries:
            rule = entry.rule
            if rule is not None:
                counts = self.hidden if rule.kind == "hide" else self.harmless
                counts[rule.label] = counts.get(rule.label, 0) + 1
            self.log_end = max(self.log_end, entry.end)
            if self.detached:
                self.missed += 1
                self._live.append(entry)
                continue
            self._entries.append(entry)
            if entry.shown:
                self._fold = fold_rows((entry,), self._shown, self._fold)[1]
        while len(self._entries) > self.cap:
            self._drop_oldest()
        while len(self._live) > self.cap:
            self._live.popleft()

    def _drop_oldest(self) -> None:
        old = self._entries.popleft()
        self.evicted[True] += 1
        front = self._shown[0] if self._shown else None
        if front is old:
            self._shown.popleft()
            self.evicted[False] += 1
        elif isinstance(front, Fold) and front.members[0] is old:
            front.members.pop(0)
            if len(front.members) == 1:
                self._shown[0] = front.members[0]

    def prepend(self, entries: list[Entry]) -> None:
        """An older page, just before `start`; the newest lines go if the cap is passed."""
        self._entries.extendleft(reversed(entries))
        rows, _ = fold_rows(e for e in entries if e.shown)
        self._shown.extendleft(reversed(rows))
        while len(self._entries) > self.cap:
            newest = self._entries.pop()
            last = self._shown[-1] if self._shown else None
            if last is newest:
                self._shown.pop()
            elif isinstance(last, Fold) and last.members[-1] is newest:
                last.members.pop()
                if len(last.members) == 1:
                    self._shown[-1] = last.members[0]
            self._live.appendleft(newest)  # kept beside the window, for resume
            self.detached = True
        while len(self._live) > self.cap:
            self._live.popleft()

    def resume(self) -> None:
        """Follow again: the newest `cap` lines, the ones that waited beside the window
        included, contiguous up to the live end."""
        if self.detached:
            self.reset([*self._entries, *self._live][-self.cap:])

    def reset(self, entries: list[Entry]) -> None:
        """Re-anchor at the live end with the log's last page (counts are kept)."""
        self._entries.clear()
        self._shown.clear()
        self._live.clear()
        self.detached = False
        self.missed = 0
        kept = entries[-self.cap:]
        self._entries.extend(kept)
        self._fold = fold_rows((e for e in kept if e.shown), self._shown)[1]
        if kept:
            self.log_end = max(self.log_end, kept[-1].end)

    def skip(self, start: int, end: int) -> None:
        """The live stream jumps from `start` to `end` (a long log's middle, not sent): what
        is held goes, so the window stays contiguous; scrolling up reads the middle back."""
        self.reset([])
        self.skipped += max(0, end - start)
        self.log_end = max(self.log_end, end)

    def clear(self) -> None:
        """A new run: nothing held, nothing counted."""
        self.reset([])
        self.hidden.clear()
        self.harmless.clear()
        self.log_end = self.skipped = 0

    def find(self, offset: int, raw: bool) -> int | None:
        """Index in the view of the line at byte `offset` (or the first after it)."""
        for index, entry in enumerate(self.view(raw)):
            if entry.offset >= offset:
                return index
        return None

    def matches(self, pattern: re.Pattern[str], raw: bool) -> list[int]:
        """Indices in the view of the lines whose visible text matches (a folded row: any
        of its lines)."""
        return [i for i, e in enumerate(self.view(raw))
                if any(pattern.search(m.line.plain)
                       for m in (e.members if isinstance(e, Fold) else (e,)))]
