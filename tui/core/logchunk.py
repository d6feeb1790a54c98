"""A chunk of log lines as it arrived, kept as text, and the one pass that reads it.

Lines stay strings addressed by their byte offsets; a LogLine (decoded, prefix parsed) is made
for a line only when something needs it: the scanner found a word a rule cares about in it (an
error, a phase, a noise rule's needle, a traceback), or the console draws or searches it. The
reader is shared by the live machine and `explain`, so both classify the same lines the same
way however the log was chunked.
"""

from __future__ import annotations

import bisect
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tui.core.failures import CLASSES, HANG_MARKERS
from tui.core.logline import LogLine, Unwrap, parse_line, parse_lines
from tui.core.logwrap import Segments, WrapLearner
from tui.core.noise import NoiseFilter, NoiseRule
from tui.core.phases import answers_a_client, phase_needles
from tui.core.pidscan import NewPids
from tui.core.scanner import CORE_NEEDLES, Scanner, branch_literals, hyperscan, required_literal

# docker compose's `svc-1  | ` as the first thing on a line: its lines are read one by one
_COMPOSE_RE = re.compile(r"[A-Za-z0-9][\w.-]*\s+\| ")
# uvicorn's access line for an answered request: only a chunk's last one matters (serving)
_ACCESS = " HTTP/1."
# the rules that hide a Python warning's first line (its source line follows, indented)
_WARNING_HEADERS = frozenset({"future-warning", "syntax-warning-escape"})
_SOURCE_LINE = re.compile(r"  \S")
# A relay's coloured process prefix (Ray's log monitor: `ESC[36m(RayWorkerWrapper pid=N,
# ip=A)ESC[0m`, `ESC[33m(raylet)ESC[0m`; vLLM's `ESC[1;36m(Worker pid=N)ESC[0;0m`). Right after
# text on the same line it means two writers' output interleaved (the first write had not
# reached its newline): a new record starts there. After a space it is a wrapper's (a
# timestamp, a margin) and stays.
_RELAY_PREFIX_RE = re.compile(
    r"\x1b\[[\d;]*m\((?:raylet|autoscaler|[A-Za-z][\w-]*(?: [\w=]+)?? pid=\d+)"
    r"(?:, ip=[\w.:]+)?\)\x1b\[[\d;]*m")
_OFFSET, _RAW = operator.itemgetter(0), operator.itemgetter(1)


class LineChunk:
    """Lines [offsets[0], end) of a log: their text, and what was decoded of them."""

    __slots__ = ("_lines", "_rules", "offsets", "phase_starts", "raws", "wrappers")

    def __init__(self, offsets: list[int], raws: list[str]) -> None:
        self.offsets, self.raws = offsets, raws
        self._lines: dict[int, LogLine] = {}
        self._rules: dict[int, NoiseRule] = {}
        self.phase_starts: set[int] = set()  # lines that moved the launch to a new phase
        # the wrapper learnt from the log (tui.core.logwrap), from each line on where it changed
        self.wrappers: Segments = [(0, None)]

    def __len__(self) -> int:
        return len(self.raws)

    def line(self, i: int) -> LogLine:
        """The decoded line (made on first use, then kept)."""
        line = self._lines.get(i)
        if line is None:
            line = self._lines[i] = parse_line(self.raws[i], self.offsets[i], self.unwrap_at(i))
        return line

    def unwrap_at(self, i: int) -> Unwrap | None:
        """The split of the wrapper line `i` carries (None: no wrapper)."""
        return self.wrappers[bisect.bisect_right(self.wrappers, i, key=_first) - 1][1]

    def decode(self, indices: Sequence[int]) -> list[LogLine]:
        """The lines at `indices` (ascending) decoded, each without its wrapper."""
        pairs = [(self.offsets[i], self.raws[i]) for i in indices]
        if len(self.wrappers) == 1:
            return parse_lines(pairs, self.wrappers[0][1])
        out: list[LogLine] = []
        bounds = [*(at for at, _ in self.wrappers[1:]), len(self.raws)]
        k = 0
        for (_, unwrap), end in zip(self.wrappers, bounds, strict=True):
            j = bisect.bisect_left(indices, end, k)
            out += parse_lines(pairs[k:j], unwrap)
            k = j
        return out

    def rule(self, i: int) -> NoiseRule | None:
        """The noise rule the line matched (None: shown as it is)."""
        return self._rules.get(i)

    def end(self, i: int) -> int:
        """The byte after the line: its newline's, or where the next record of the same
        physical line starts (split_interleaved)."""
        end = self.offsets[i] + len(self.raws[i].encode("utf-8", "replace")) + 1
        return min(end, self.offsets[i + 1]) if i + 1 < len(self.offsets) else end

    def classified(self, indices: Sequence[int], lines: Sequence[LogLine],
                   rules: Sequence[NoiseRule | None]) -> None:
        for i, line, rule in zip(indices, lines, rules, strict=True):
            self._lines[i] = line
            if rule is not None:
                self._rules[i] = rule

    @classmethod
    def of(cls, pairs: Sequence[tuple[int, str]]) -> LineChunk:
        return cls(list(map(_OFFSET, pairs)), list(map(_RAW, pairs)))  # in C, not a loop

    def split_interleaved(self, candidates: Sequence[int]) -> bool:
        """Each line of `candidates` (the lines a rule cares about, the only ones whose
        reading a join could change) that holds two writers' records becomes one line per
        record, at its byte offset; whether any did. Else a worker's `Traceback (most recent
        call last):` that Ray's raylet notice joined reads as one line, the notice's words
        as the traceback's."""
        cuts: dict[int, list[int]] = {}
        for i in candidates:
            raw = self.raws[i]
            # a relay's line has two escapes, its prefix's colour and reset, the first at 0
            if "\x1b" in raw and (raw[0] != "\x1b" or raw.count("\x1b") > 2):
                at = [m.start() for m in _RELAY_PREFIX_RE.finditer(raw)
                      if m.start() > 0 and not raw[m.start() - 1].isspace()]
                if at:
                    cuts[i] = at
        if not cuts:
            return False
        offsets: list[int] = []
        raws: list[str] = []
        for i, (offset, raw) in enumerate(zip(self.offsets, self.raws, strict=True)):
            start = 0
            for cut in [*cuts.get(i, ()), len(raw)]:
                offsets.append(offset + len(raw[:start].encode("utf-8", "replace")))
                raws.append(raw[start:cut])
                start = cut
        self.offsets, self.raws = offsets, raws
        return True


@dataclass(slots=True)
class ChunkRead:
    """One chunk read: the lines worth decoding (indices into the chunk), decoded, with their
    noise verdicts (already counted by the filter)."""

    chunk: LineChunk
    indices: list[int]
    lines: list[LogLine]
    rules: list[NoiseRule | None]
    heartbeats: int  # lines that are the hang heartbeat: no progress


class ChunkReader:
    """Finds and decodes the lines of a chunk that any rule cares about."""

    def __init__(self, engine: str, noise: NoiseFilter, backend: str | None = None) -> None:
        self.noise = noise
        self.engine = engine
        self.wraps = WrapLearner()  # the log's wrapper, learnt as its lines arrive
        # process prefixes seen (their pid), over the whole log: a process first seen in a
        # chunk gets its line decoded (its name from the prefix), even when nothing else in
        # the line matters
        self.pids = NewPids(backend or ("hyperscan" if hyperscan is not None else "re"))
        needles = set(CORE_NEEDLES) | (set(phase_needles(engine)) - {_ACCESS})
        # what a raw stderr line or a WARNING may state, and the hang markers: their words
        # (an ERROR record is found by its level)
        for kind in (*(c for c in CLASSES if c.raw or c.warning), *HANG_MARKERS):
            needles.update(branch_literals(kind.pattern) or ())
        self.everything = False  # a rule no literal guards: every line must be asked
        for rule in noise.rules:
            needle = rule.needle or required_literal(rule.pattern)
            if needle:
                needles.add(needle)
            elif rule.id != "blank":  # blank lines: the scanner's own pattern finds them
                self.everything = True
        self.scanner = Scanner(needles, backend)
        self._source_rule = next((r for r in noise.rules if r.id == "warnings-warn-source"),
                                 None)

    def read(self, pairs: Sequence[tuple[int, str]], open_traceback: bool) -> ChunkRead:
        """`open_traceback`: the tracker is inside a traceback, whose next lines (source lines
        hold no needle) must all be read."""
        return self.read_chunk(LineChunk.of(pairs), open_traceback)

    def read_page(self, chunk: LineChunk) -> LineChunk:
        """Lines read back from the log (scrolled to): classified alike, counted nowhere, and
        no process seen for the first time (the live stream saw them in order)."""
        return self.read_chunk(chunk, False, page=True).chunk

    def read_chunk(self, chunk: LineChunk, open_traceback: bool, *,
                   page: bool = False) -> ChunkRead:
        scan = self.scanner.scan(chunk.raws)
        if chunk.split_interleaved(scan.lines):
            scan = self.scanner.scan(chunk.raws)
        raws = chunk.raws
        chunk.wrappers = [(0, self.wraps.split)] if page else self.wraps.follow(raws)
        if self.everything or open_traceback or (raws and _COMPOSE_RE.match(raws[0])):
            indices = list(range(len(raws)))
        else:
            indices = scan.lines
            if scan.first_traceback is not None:  # every line after it may continue it
                first = scan.first_traceback
                indices = [i for i in indices if i < first] + list(range(first, len(raws)))
            text = "\n".join(raws)
            extra = set() if page else {
                i for i in (_last_answered(text, self.engine, chunk),
                            *self._first_of_new_pids(text))
                if i is not None}
            if extra - set(indices):
                indices = sorted({*indices, *extra})
        lines = chunk.decode(indices)
        rules = self.noise.match_all(lines)
        if self._source_rule is not None:
            indices, lines, rules = self._warning_sources(chunk, indices, lines, rules)
        if not page:
            self.noise.count_all(rules)
        chunk.classified(indices, lines, rules)
        return ChunkRead(chunk, indices, lines, rules, scan.heartbeats)

    def _warning_sources(self, chunk: LineChunk, indices: list[int], lines: list[LogLine],
                         rules: list[NoiseRule | None],
                         ) -> tuple[list[int], list[LogLine], list[NoiseRule | None]]:
        """A Python warning is two lines: `file:line: FutureWarning: ...` and, indented by
        two spaces, the source line that warned. When a rule hides the first, the second goes
        with it (it holds no word a rule could find)."""
        raws, rule = chunk.raws, self._source_rule
        assert rule is not None
        follow = [i + 1 for i, r in zip(indices, rules, strict=True)
                  if r is not None and r.id in _WARNING_HEADERS and i + 1 < len(raws)
                  and _SOURCE_LINE.match(raws[i + 1])]
        if not follow:
            return indices, lines, rules
        at = {i: k for k, i in enumerate(indices)}
        fresh = [i for i in follow if i not in at]
        for i in follow:
            if i in at and rules[at[i]] is None:
                rules[at[i]] = rule
        if not fresh:
            return indices, lines, rules
        found = dict(zip(indices, zip(lines, rules, strict=True), strict=True))
        for i, line in zip(fresh, chunk.decode(fresh), strict=True):
            found[i] = (line, rule)
        order = sorted(found)
        return order, [found[i][0] for i in order], [found[i][1] for i in order]


    def _first_of_new_pids(self, text: str) -> list[int]:
        """The first line of each process prefix this log shows for the first time (`text`:
        the chunk's lines joined)."""
        new = self.pids.find(text)
        if not new:
            return []
        firsts = (re.search(rf" pid={pid}\b", text) for pid in new)
        return sorted(text.count("\n", 0, m.start()) for m in firsts if m is not None)


def _first(segment: tuple[int, object]) -> int:
    return segment[0]


def _last_answered(text: str, engine: str, chunk: LineChunk) -> int | None:
    """The index of the chunk's last uvicorn line (`text`: the chunk's lines joined) for a
    client's POST the server answered (it serves): one is enough, and a 5xx after it (what a
    server with a dead engine answers) must not hide it. Found with str.rfind, not per line;
    a line is asked without its wrapper (a CSV export doubles the quotes)."""
    unwrap = chunk.wrappers[0][1]  # one wrapper for the whole chunk, nearly always
    at = text.rfind('"POST ')
    while at >= 0:
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        line = text[start:end if end >= 0 else len(text)]
        if len(chunk.wrappers) > 1:
            unwrap = chunk.unwrap_at(text.count("\n", 0, start))
        if answers_a_client(line if unwrap is None else unwrap(line)[1], engine):
            return text.count("\n", 0, start)
        at = text.rfind('"POST ', 0, start)
    return None
