"""One pass over a chunk of log lines that finds the few any rule cares about.

Nearly every line of a busy log (uvicorn's access lines, request records) matches no noise
rule, names no phase, reports no error: the core must not spend Python work on each. Every rule
is guarded by a literal its lines must contain (a noise rule's needle, a phase rule's, the words
of a failure class, a log level), so one multi-pattern search over the chunk's joined text,
made once per chunk, names the lines that need decoding; the rest stay text.

The search engine is chosen by measurement (README, Performance): Hyperscan where its wheel
exists (x86-64 Linux), else one alternation of the needles in `re`: the same lines either way,
which a test keeps true.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

try:  # optional, native: the `re` path below does the same, slower
    import hyperscan
except ImportError:  # pragma: no cover - depends on the platform's wheels
    hyperscan = None

# Words a line must hold to matter beyond noise and phases: log levels a cause is logged at,
# tracebacks, what a symptom says (tui.core.rootcause), the failure classes a record or a raw
# stderr line may state (tui.core.failures), hang markers (tui.core.diagnosis). A WARNING
# matters only when it says one of these (an import failure, a symptom): its level is no needle.
# An orderly shutdown's own words (uvicorn's) matter too: the `stopped` outcome.
CORE_NEEDLES = (
    "ERROR", "CRITICAL", "Traceback", 'File "', "rror", "xception", "Exit", "Interrupt",
    "ailed", "died", "xited", "ncountered", "EngineDead", "sigquit", "root cause", "not running",
    "errored", "stopped", "dead", "other ranks", "inspected", "exit code", "core proc",
    "exit status", "[shutdown]", "NCCL", "nccl", "CUDA", "cuda", "out of memory", "OOM", "Errno",
    "No space left", "quota", "already in use", "attempting to bind", "HIP", "ACL", "aclnn",
    "kernel image", "illegal memory", "device-side", "block found", "atchdog", "Timeout(ms)",
    "core engine proc", "Unable to load", "import", "undefined symbol", "Process ", "hit an",
    "Shutting down", "Finished server process", "what():",
    # native crashes (tui.core.failures native_crash): signal handlers, glibc, faulthandler
    "Caught signal", "***", "corrupt", "free(", "malloc(", "most recent call first",
)
# Lines a serving server writes all the time (stats, spec-decode readouts, batches): of these
# only a chunk's first (the phase it enters) and last (the state now) are decoded.
SERVING_NEEDLES = ("Avg prompt throughput", "SpecDecoding metrics", "Decode batch")
TRACEBACK_NEEDLES = ("Traceback", 'File "')
HEARTBEAT = "block found"
# A line whose message may be blank: it ends (blanks and CRs aside) with what ends a prefix, a
# header, a wrapper or an escape (`)`, `]`, `|`, `:`, a timestamp's `Z` or digit, an escape's
# `m`; syslog's `#015` ends in a digit), or holds nothing. It finds more than the blank ones
# (decoding tells): never fewer. The `re` path asks the same of each line's last character.
_BLANK_ENDS = frozenset("Z:)]|m0123456789")
# Hyperscan asks it as the two bytes that end such a line: a closer before the newline (a class
# of frequent characters anchored on `$` costs Hyperscan more than all the needles together),
# or a blank or CR before it, or an empty line, which are then asked of the line itself; the
# chunk's first and last lines are asked in Python (no newline before or after them).
_BLANK_CLOSED = rb"[Z:)\]|m0-9]\n"
_BLANK_OPEN = rb"[ \t\r\n]\n"
_PLAIN, _TRACEBACK, _HEARTBEAT, _SERVING_BASE = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class Scan:
    """What one pass over a chunk found: the lines to decode (in order), the first line of a
    traceback (every line after it may continue it), how many heartbeat lines."""

    lines: list[int]
    first_traceback: int | None
    heartbeats: int


def _parser():  # the regex parser: Python >= 3.11 names it re._parser
    try:
        import re._parser as parser
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_parse as parser  # type: ignore[no-redef]
    return parser


def _longest_run(items: object, parser: object) -> str:
    best, run = "", []
    for op, arg in items:  # type: ignore[attr-defined]
        if op is parser.LITERAL:  # type: ignore[attr-defined]
            run.append(chr(arg))
            continue
        best, run = max(best, "".join(run), key=len), []
    return max(best, "".join(run), key=len)


def required_literal(pattern: re.Pattern[str]) -> str:
    """A literal every match of `pattern` contains (its longest run of plain characters at
    the top level), or "" when none can be told (an alternation, a class, ignore-case)."""
    found = branch_literals(pattern)
    return found[0] if found is not None and len(found) == 1 else ""


def branch_literals(pattern: re.Pattern[str]) -> list[str] | None:
    """One literal per top-level alternative of `pattern` that every match of it contains,
    or None when some alternative has none of 3 characters or more (or ignore-case)."""
    if pattern.flags & re.IGNORECASE:
        return None
    parser = _parser()
    try:
        items = list(parser.parse(pattern.pattern, pattern.flags))
    except Exception:  # any parse trouble: no needle, the rule runs on every line
        return None
    branches = [items]  # an alternation inside a sequence only breaks the sequence's runs
    if len(items) == 1 and items[0][0] is parser.BRANCH:
        branches = [list(b) for b in items[0][1][1]]
    out = [_longest_run(b, parser) for b in branches]
    return out if all(len(x) >= 3 for x in out) else None

class Scanner:
    """Which lines of a chunk hold any of `needles` (or have a blank message)."""

    def __init__(self, needles: Iterable[str], backend: str | None = None) -> None:
        self.needles = tuple(sorted({n for n in needles if n} | set(SERVING_NEEDLES)))
        # a serving needle is a kind of its own: its first and last lines are kept apart
        self._kind = [_SERVING_BASE + SERVING_NEEDLES.index(n) if n in SERVING_NEEDLES
                      else _TRACEBACK if n in TRACEBACK_NEEDLES
                      else _HEARTBEAT if n == HEARTBEAT else _PLAIN
                      for n in self.needles] + [_PLAIN]  # the blank-message pattern
        self.backend = backend or ("hyperscan" if hyperscan is not None else "re")
        if self.backend == "hyperscan":
            if hyperscan is None:
                raise ValueError("the hyperscan backend needs the hyperscan package")
            self._db, self._scratch, self._hs_kind, self._serving = _compiled(self.needles)
            self._closed, self._open = len(self._hs_kind) - 2, len(self._hs_kind) - 1
        elif self.backend != "re":
            raise ValueError(f"unknown scanner backend {backend!r}")

    def lines(self, raws: Sequence[str]) -> list[int]:
        return self.scan(raws).lines

    def scan(self, raws: Sequence[str]) -> Scan:
        if not raws:
            return Scan([], None, 0)
        hits = self._hyperscan(raws) if self.backend == "hyperscan" else self._re_hits(raws)
        return self._sorted(hits)

    def _sorted(self, hits: list[tuple[int, int]]) -> Scan:
        """(line, needle kind) pairs, in line order, to a Scan: a serving line only as the
        chunk's first or last of them."""
        plain: set[int] = set()
        serving: dict[int, tuple[int, int]] = {}  # per needle: its first and last line
        first_tb: int | None = None
        beats: set[int] = set()
        for line, kind in hits:
            if kind >= _SERVING_BASE:
                first, last = serving.get(kind, (line, line))
                serving[kind] = (min(first, line), max(last, line))
                continue
            plain.add(line)
            if kind == _TRACEBACK and (first_tb is None or line < first_tb):
                first_tb = line
            elif kind == _HEARTBEAT:
                beats.add(line)
        for first, last in serving.values():
            plain.update((first, last))
        return Scan(sorted(plain), first_tb, len(beats))

    def _re_hits(self, raws: Sequence[str]) -> list[tuple[int, int]]:
        """Without Hyperscan: each needle found with str.find over the chunk (a C loop per
        needle beats one alternation of them in `re`), the blank pattern with `re`."""
        text = "\n".join(raws)
        starts = _starts(raws)
        line_of = bisect.bisect_right
        hits: list[tuple[int, int]] = []
        for needle, kind in zip(self.needles, self._kind, strict=False):
            at = text.find(needle)
            while at >= 0:
                line = line_of(starts, at) - 1
                hits.append((line, kind))
                # the rest of this line needs no second look for the same needle
                nxt = starts[line + 1] if line + 1 < len(starts) else len(text)
                at = text.find(needle, nxt)
        ends = _BLANK_ENDS  # the blank pattern's closers, asked of each line's last character
        hits += [(i, _PLAIN) for i, raw in enumerate(raws)
                 if not (tail := raw.rstrip(" \t\r")) or tail[-1] in ends]
        hits.sort()
        return hits

    def _hyperscan(self, raws: Sequence[str]) -> list[tuple[int, int]]:
        data = "\n".join(raws).encode("utf-8", "replace")
        found: list[tuple[int, int]] = []

        def hit(id_: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
            found.append((end, id_))

        self._db.scan(data, match_event_handler=hit, scratch=self._scratch)
        for id_ in {i for _, i in found if i in self._serving}:
            needle = self._serving[id_]
            found.append((data.rfind(needle) + len(needle), id_))
        # a match ending at byte `end` is on the line that as many newlines precede (the blank
        # pattern's end is after the newline it ends on)
        found.sort()
        kind = self._hs_kind
        closed, open_ = self._closed, self._open
        out: list[tuple[int, int]] = []
        line = at = 0
        for end, id_ in found:
            if id_ >= closed:
                end -= 1
                if id_ == open_ and not _blank_end(data[data.rfind(b"\n", 0, end) + 1:end]):
                    continue
            line += data.count(b"\n", at, end)
            at = end
            out.append((line, kind[id_]))
        if data[:1] == b"\n":  # an empty first line
            out.insert(0, (0, _PLAIN))
        last = data.rfind(b"\n") + 1
        if _blank_end(data[last:]):
            out.append((line + data.count(b"\n", at, last), _PLAIN))
        return out

_DATABASES: dict[tuple[str, ...], tuple[Any, Any, list[int], dict[int, bytes]]] = {}


def _compiled(needles: tuple[str, ...]) -> tuple[Any, Any, list[int], dict[int, bytes]]:
    """The Hyperscan database for a needle set (compiled once per process: every launch and
    restart reads with the same rules), its scratch, the kind of each pattern id, and the
    serving needles by id. The needles of one kind are one pattern that matches from the
    needle to the end of its line, so a line is reported once however many it holds (each
    report is a Python call); a serving needle reports its first line only (its last is found
    from the end)."""
    found = _DATABASES.get(needles)
    if found is not None:
        return found
    groups: dict[int, list[str]] = {}
    serving: dict[int, bytes] = {}
    expressions: list[bytes] = []
    flags: list[int] = []
    kinds: list[int] = []
    for needle in needles:
        kind = (_SERVING_BASE + SERVING_NEEDLES.index(needle) if needle in SERVING_NEEDLES
                else _TRACEBACK if needle in TRACEBACK_NEEDLES
                else _HEARTBEAT if needle == HEARTBEAT else _PLAIN)
        if kind >= _SERVING_BASE:
            serving[len(expressions)] = needle.encode()
            expressions.append(re.escape(needle).encode())
            flags.append(hyperscan.HS_FLAG_SINGLEMATCH)
            kinds.append(kind)
        else:
            groups.setdefault(kind, []).append(needle)
    for kind, members in groups.items():
        alternation = "|".join(re.escape(n) for n in members)
        expressions.append(f"(?:{alternation})[^\\n]*$".encode())
        flags.append(hyperscan.HS_FLAG_MULTILINE)
        kinds.append(kind)
    expressions += [_BLANK_CLOSED, _BLANK_OPEN]  # the last two ids (see Scanner._hyperscan)
    flags += [0, 0]
    kinds += [_PLAIN, _PLAIN]
    db = hyperscan.Database()
    db.compile(expressions=expressions, ids=list(range(len(expressions))),
               elements=len(expressions), flags=flags)
    found = _DATABASES[needles] = (db, hyperscan.Scratch(db), kinds, serving)
    return found


_BLANK_END_BYTES = frozenset(c.encode() for c in _BLANK_ENDS)


def _blank_end(line: bytes) -> bool:
    """The blank pattern asked of one line: blanks and CRs aside, empty or ending in a closer."""
    tail = line.rstrip(b" \t\r")
    return not tail or tail[-1:] in _BLANK_END_BYTES


def _starts(raws: Sequence[str]) -> list[int]:
    """Where each line starts in "\\n".join(raws) (str positions)."""
    out, at = [], 0
    for raw in raws:
        out.append(at)
        at += len(raw) + 1
    return out
