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


class LogWindow:
    """Lines [first offset, end) of one run's log, at most `cap` of them."""

    def __init__(self, cap: int = DEFAULT_CAP) -> None:
        self.cap = cap
        self._entries: deque[Entry] = deque()
        self._shown: deque[Entry] = deque()
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

    def view(self, raw: bool) -> deque[Entry]:
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
                self._shown.append(entry)
        while len(self._entries) > self.cap:
            self._drop_oldest()
        while len(self._live) > self.cap:
            self._live.popleft()

    def _drop_oldest(self) -> None:
        old = self._entries.popleft()
        self.evicted[True] += 1
        if self._shown and self._shown[0] is old:
            self._shown.popleft()
            self.evicted[False] += 1

    def prepend(self, entries: list[Entry]) -> None:
        """An older page, just before `start`; the newest lines go if the cap is passed."""
        for entry in reversed(entries):
            self._entries.appendleft(entry)
            if entry.shown:
                self._shown.appendleft(entry)
        while len(self._entries) > self.cap:
            newest = self._entries.pop()
            if self._shown and self._shown[-1] is newest:
                self._shown.pop()
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
        for entry in entries[-self.cap:]:
            self._entries.append(entry)
            if entry.shown:
                self._shown.append(entry)
            self.log_end = max(self.log_end, entry.end)

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
        """Indices in the view of the lines whose visible text matches."""
        return [i for i, e in enumerate(self.view(raw)) if pattern.search(e.line.plain)]
