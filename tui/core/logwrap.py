"""The wrapper a relay writes in front of every line of a log, learnt from the log itself.

journald, docker compose, `kubectl logs --timestamps`, a cloud viewer's CSV export, a user's own
`logging` format, a log viewer's margin: each puts the same shape of text before every line it
relays, and no list of known wrappers is ever complete. So the reader learns the shape that
repeats: each line's head is cut into shape classes (a timestamp of any common form, a time, a
month and day, epoch seconds, a level word, a word, a number, a run of blanks, a punctuation
mark), and the longest run of classes that most recent lines share, ending where a wrapper
ends (after `]`, `)`, `|`, `│`, `>`, `]:`, ` -`, a timestamp or a level, then one blank; or at
a CSV field's opening quote) and holding something only a wrapper holds (a time, a level, a
bracket, a margin), is peeled from every line it fits. The engines' own line formats (vLLM's
`(Proc pid=N)` and `LEVEL MM-DD HH:MM:SS [file.py:N]`, SGLang's `[date time TP0]`, uvicorn's
`INFO:`, rich's columns) are never part of it: a line's head ends where one of them starts.

The learner sees lines in order, chosen by their index in the whole log and by the lines
before them only (every one of the first, then one in `_STEP`, and a burst of them when a line
stops fitting), so a log read in any chunks is peeled the same way: the live console and
`explain` agree. It relearns as it reads: the shape is the majority of the last `_WINDOW`
lines it saw, so a wrapper that appears, changes or stops is followed. The log's first line,
before any other can agree, is peeled only by a start of its own that holds a stamp.
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from collections.abc import Sequence

from tui.core.logline import ESC_RE, Unwrap, visible

# -- shapes -----------------------------------------------------------------------------------

# The shape classes, tried in this order at each position. A punctuation mark is its own class.
_CLASSES = {
    # ISO 8601 / RFC 3339 date, with `T` or a space before the time, fraction and zone optional
    "TS": r"\d{4}[-/]\d\d[-/]\d\d(?:[T ]\d\d:\d\d(?::\d\d)?(?:[.,]\d+)?)?"
          r"(?:Z|[+-]\d\d(?::?\d\d)?(?![\d:])| UTC\b| GMT\b)?",
    "TIME": r"\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d(?!\d)| UTC\b| GMT\b)?",
    "MDAY": r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]?\d(?!\d)",  # syslog's
    "DATE": r"\d\d[-/.]\d\d(?:[-/.]\d\d(?:\d\d)?)?(?![\d:])",  # 05/05/25, 18.03.2025
    "EPOCH": r"1\d{9}(?:\d{3})?(?:\.\d+)?(?!\d)",  # epoch seconds or milliseconds
    "LEVEL": r"(?:DEBUG|INFO|NOTICE|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE|debug|info|notice"
             r"|warning|warn|error|critical|fatal|trace)"
             r"(?![\w.-])",
    "NUM": r"\d+(?:\.\d+)*",
    "WORD": r"[A-Za-z_][\w.-]*",
    "SP": r"[ \t]+",
}
_TOKEN_RE = re.compile("|".join(f"(?P<{name}>{p})" for name, p in _CLASSES.items())
                       + r"|(?P<P>\S)")
_STAMPS = frozenset(("TS", "TIME", "EPOCH"))  # a wrapper may end with one of these
_ANCHORS = frozenset(("TS", "TIME", "MDAY", "DATE", "EPOCH", "LEVEL", "|", "│", "["))
_CLOSERS = frozenset("])|│>")
_STAMPED = frozenset(("TS", "TIME", "MDAY", "DATE", "EPOCH"))
_OPENERS, _SHUTTERS = frozenset("[("), frozenset(")]")
_AFTER_STAMP = _STAMPED | {"]", "|", "│", "-"}
_SEP = "SEP"  # the one blank that ends a wrapper (the line's own indentation stays)
_QUOTE = 'CSV"'  # a CSV field's opening quote ends the wrapper: the line is the field
_HEAD_CHARS = 200
_HEAD_TOKENS = 32

# Where an engine's own line format starts: a line's head ends there (never peeled).
_ENGINE_RE = re.compile(
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"  # vLLM's header
    r"|\(?[A-Za-z][\w-]*(?: (?:rank=\d+|TP\d+))? pid=\d+"  # vLLM's process prefix
    r"|\((?:API|Engine \(\w+\)|Worker \(\w+\))\)"
    r"|\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z][A-Z_]+\d+)+\]"  # SGLang's tag
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):  "  # uvicorn's
    r"|\[[\w./-]+\.py:\d+\] "  # the end of a vLLM header a copy cut
    r"|[\w.-]+:\d+:\d+ \[\d+\] "  # NCCL's `host:pid:tid [device] `
    r"|\[[IWEF](?:\d{4} \d\d:\d\d:\d\d\.\d+(?: +\d+)?)? ?[\w.]+:\d+\]"  # torch's C++ (c10) log
)
# rich's RichHandler columns (a time, or blanks, then the level), on a line that ends with
# `file.py:N`: its own reader (tui.core.logline) takes the message from between them
_RICH_HEAD_RE = re.compile(r"(?:\[[\d/.: -]{8,20}\]|\s{8,}) ?(?:DEBUG|INFO|WARNING|ERROR"
                           r"|CRITICAL) +\S")
_RICH_TAIL_RE = re.compile(r"\.py:\d+$")

Key = tuple[str, ...]


def head_shapes(text: str) -> list[Key]:
    """Every wrapper-shaped start of `text` (a visible line), shortest first, as class keys."""
    head = text[:_HEAD_CHARS]
    engine = _ENGINE_RE.search(head)
    if engine is not None:
        if engine.start() == 0:
            return []
        head = head[:engine.start()]
    if text[-1:].isdigit() and _RICH_TAIL_RE.search(text[-40:]):
        rich = _RICH_HEAD_RE.search(head)
        if rich is not None:  # (a blank that starts the time column may end a wrapper)
            head = head[:rich.start() + (head[rich.start()] in " \t")]
    keys: list[Key] = []
    elements: list[str] = []
    depth = quotes = 0
    anchored = ended = field = False
    tokens = list(_TOKEN_RE.finditer(head))[:_HEAD_TOKENS + 1]
    for i, m in enumerate(tokens[:_HEAD_TOKENS]):
        kind = m.lastgroup
        element = m.group() if kind == "P" else kind
        assert element is not None
        if ended:  # the blank after a shorter wrapper: one, as the shorter one ends; more is
            if len(m.group()) > 1:  # the line's own indentation: its text has begun
                return keys
            element = _SEP
        ended = False
        anchored = anchored or element in _ANCHORS
        if element in _OPENERS:
            depth += 1
        elif element in _SHUTTERS:
            depth -= 1
            if depth < 0:
                return keys
        elif element == '"':
            quotes ^= 1
        previous = elements[-1] if elements else ""
        elements.append(element)
        if not anchored or depth:
            continue
        if element == '"' and quotes and previous == "," and not field:  # a CSV export's
            elements[-1] = _QUOTE  # quoted line: what follows is the line (a wrapper in it too)
            keys.append(tuple(elements))
            field = True
            if i + 1 < len(tokens) and tokens[i + 1].lastgroup == "SP":
                return keys  # the line's own indentation
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if (quotes and not field) or nxt is None or nxt.lastgroup != "SP":
            continue
        if element == "LEVEL":  # a level ends a wrapper right after a stamp or a mark; a
            if len(nxt.group()) > 1:  # padded level column goes on to the next mark
                continue
            ends = len(elements) > 2 and elements[-3] in _AFTER_STAMP
        else:
            ends = (element in _CLOSERS or element in _STAMPS
                    or (element == ":" and previous == "]")
                    or (element == "-" and previous in ("SP", _SEP)))
        if ends:
            keys.append((*elements, _SEP))
            ended = True
    return keys


def _pattern(element: str) -> str:
    if element == _SEP:
        return "[ \t]"
    if element == _QUOTE:
        return '(?P<field>")'
    found = _CLASSES.get(element)
    return f"(?:{found})" if found is not None else re.escape(element)


class Wrapper:
    """A learnt wrapper: `split(line)` is (the wrapper's text, the line it wraps); a line it
    does not fit is ("", line). Each shorter wrapper-shaped start of the shape fits too (a
    longer shape learnt from most lines still peels what it can of the others)."""

    __slots__ = ("key", "quoted", "regex")

    def __init__(self, key: Key) -> None:
        self.key = key
        self.quoted = _QUOTE in key
        levels: list[str] = []
        piece: list[str] = []
        for element in key:
            piece.append(_pattern(element))
            if element in (_SEP, _QUOTE):
                levels.append("".join(piece))
                piece = []
        pattern = levels[-1]
        for level in reversed(levels[:-1]):
            pattern = f"{level}(?:{pattern})?"
        self.regex = re.compile(pattern)

    def split(self, line: str) -> tuple[str, str]:
        m = self.regex.match(line)
        if m is None:
            if "\x1b" not in line:
                return "", line
            line = ESC_RE.sub("", line)  # a wrapper in colour: read without it
            m = self.regex.match(line)
            if m is None:
                return "", line
        lead, rest = line[:m.end()], line[m.end():]
        if self.quoted and m.group("field"):
            if rest[-1:] == '"':
                rest = rest[:-1]
            rest = rest.replace('""', '"')
        return lead, rest

    def __repr__(self) -> str:
        return f"Wrapper({' '.join(self.key)})"


# -- learning ---------------------------------------------------------------------------------

_DENSE = 64  # the log's first lines: every one is seen
_STEP = 256  # then one line in _STEP (by its index in the log)
_WINDOW = 32  # the majority is of the last _WINDOW lines seen
_SHARE = 0.6
_MIN_LINES = 1  # the first line alone: its own wrapper-shaped start
_BURST_EVERY = 64 * _DENSE  # a wrapper that stopped fitting: _DENSE lines seen, this seldom

Segments = list[tuple[int, Unwrap | None]]  # (first line of a chunk, the split from there on)


class WrapLearner:
    """Follows one log's lines in order and says which wrapper each line carries. Which lines
    it looks at depends on the lines before them only: the log's first `_DENSE`, one in
    `_STEP`, and, when a line seen does not fit the wrapper learnt, the next `_DENSE` (at most
    once in `_BURST_EVERY` lines), so a wrapper that changes is relearnt within some lines."""

    def __init__(self) -> None:
        self.seen = 0  # the index in the log of the next line
        self.key: Key | None = None
        self.wrapper: Wrapper | None = None
        self._window: deque[list[Key]] = deque()
        self._counts: Counter[Key] = Counter()
        self._compiled: dict[Key, Wrapper] = {}
        self._dense_until = _DENSE
        self._next_burst = 0

    @property
    def split(self) -> Unwrap | None:
        """The current wrapper's split (None: no wrapper)."""
        return None if self.wrapper is None else self.wrapper.split

    def follow(self, raws: Sequence[str]) -> Segments:
        """The next lines of the log: (index into `raws`, split) where the wrapper takes effect,
        the first at 0."""
        start = self.seen
        end = self.seen = start + len(raws)
        out: Segments = [(0, self.split)]
        index = start
        while True:
            if index >= self._dense_until:
                index += (-index) % _STEP
            if index >= end:
                return out
            keys = head_shapes(visible(raws[index - start]))
            if (self.key is not None and self.key not in keys and index >= self._next_burst
                    and index >= self._dense_until):
                self._dense_until = index + 1 + _DENSE
                self._next_burst = index + _BURST_EVERY
            if self._observe(keys):
                at = index - start
                if out[-1][0] == at:
                    out.pop()
                out.append((at, self.split))
            index += 1

    def _observe(self, keys: list[Key]) -> bool:
        """One line's wrapper-shaped starts counted; True when the learnt wrapper changed."""
        window, counts = self._window, self._counts
        window.append(keys)
        counts.update(keys)
        if len(window) > _WINDOW:
            for old in window.popleft():
                counts[old] -= 1
                if not counts[old]:
                    del counts[old]
        need = max(_MIN_LINES, math.ceil(_SHARE * len(window)))
        best = self.key
        if best is not None and counts.get(best, 0) < need:
            best = None  # relearn from all that the window holds
            candidates: list[Key] = list(counts)
        else:  # only a start this line counted can have reached the share
            candidates = keys
        solo = len(window) == 1  # the log's first line alone: only a wrapper with a stamp
        for key in candidates:
            if (counts[key] >= need and not (solo and _STAMPED.isdisjoint(key))
                    and (best is None
                         or (len(key), counts[key], key) > (len(best), counts[best], best))):
                best = key
        if best == self.key:
            return False
        self.key = best
        if best is None:
            self.wrapper = None
        else:
            wrapper = self._compiled.get(best)
            if wrapper is None:
                wrapper = self._compiled[best] = Wrapper(best)
            self.wrapper = wrapper
        return True
