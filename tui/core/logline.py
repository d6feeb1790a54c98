"""One server log line, decoded: escapes gone, wrappers peeled, process prefix and header split off.

vLLM writes `[(<Proc> pid=<N>) ]<LEVEL> <MM-DD> <HH:MM:SS> [<file>.py:<line>] <message>`, but real
logs arrive wrapped (docker compose, CI and container timestamps, syslog's `#033` escapes, another
supervisor's logger), with nested prefixes, colour, and tqdm bars redrawn with `\\r`. Every later
stage (noise, phases, root cause) matches on `message`, so this is where the variety ends.

This runs on every line of a log that can reach millions of lines: the common shapes take cheap
string checks and one precompiled regex each; the rare ones pay for themselves.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, make_dataclass

# -- escapes ----------------------------------------------------------------------------------

# Two passes because one alternation of every form is tried at every character (slow): sequences
# that start with ESC have a literal first character the regex engine scans for quickly.
_ESC_FORMS = (
    r"\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC: window title, OSC 52 clipboard, links
    r"|[PX^_][^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS / SOS / PM / APC strings
    r"|\[[0-?]*[ -/]*[@-~]?"  # CSI: cursor moves, screen clear, SGR
    r"|[ -/]*[0-~]?"  # any other ESC sequence, or a lone ESC
)
ESC_RE = re.compile(r"\x1b(?:" + _ESC_FORMS + ")")
_ESC_BUT_SGR_RE = re.compile(r"\x1b(?!\[[0-9;:]*m)(?:" + _ESC_FORMS + ")")
_C1_FORMS = (
    r"\x9d[^\x07\x9c]*[\x07\x9c]?"  # 8-bit OSC
    r"|[\x90\x98\x9e\x9f][^\x9c]*\x9c?"  # 8-bit string controls
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
)
_CONTROL_RE = re.compile(_C1_FORMS + r"|[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # tab survives
_CONTROL_BUT_ESC_RE = re.compile(_C1_FORMS + r"|[\x00-\x08\x0a-\x1a\x1c-\x1f\x7f-\x9f]")
# rsyslog writes control characters as `#ooo` (octal): `#033` is ESC, `#015` CR.
_SYSLOG_RE = re.compile(r"#(0[0-3][0-7]|177)")


def _decode_syslog(s: str) -> str:
    return _SYSLOG_RE.sub(lambda m: chr(int(m.group(1), 8)), s)


def _strip(s: str) -> str:
    if "\x1b" in s:
        s = ESC_RE.sub("", s)
        if s.isprintable():
            return s
    return _CONTROL_RE.sub("", s)


def _keep_sgr(s: str) -> str:
    if "\x1b" in s:
        s = _ESC_BUT_SGR_RE.sub("", s)
    return _CONTROL_BUT_ESC_RE.sub("", s)


def _last_segment(segs: list[str]) -> tuple[int, str]:
    """Index and text of the last segment with something visible in it ((0, "") if none)."""
    for index in range(len(segs) - 1, -1, -1):
        seg = segs[index]
        if (seg if seg.isprintable() else _strip(seg)).strip():
            return index, seg
    return 0, ""


def visible(s: str) -> str:
    """The text of a raw line as a reader sees its start: syslog's `#ooo` decoded, every
    escape and control character removed (a `\\r` redraw's segments kept, run together)."""
    if "#" in s and ("#0" in s or "#177" in s):
        s = _decode_syslog(s)
    return s if s.isprintable() else _strip(s)


def strip_escapes(s: str) -> str:
    """Plain text: every ANSI/OSC/CSI sequence and control character except tab removed.

    A `\\r` redraw (tqdm) keeps its last non-blank segment, as a terminal would show it.
    """
    if s.isprintable():
        return s
    if "\r" in s:
        s = _last_segment(s.split("\r"))[1]
    return _strip(s)


def keep_colours(s: str) -> str:
    """Safe to render: SGR colour sequences kept, every other escape and control removed.

    A `\\r` redraw keeps its last non-blank segment, like strip_escapes.
    """
    if s.isprintable():
        return s
    if "\r" in s:
        s = _last_segment(s.split("\r"))[1]
    return _keep_sgr(s)


# A learnt wrapper's split of a line: (the wrapper's text, the line it wraps) (tui.core.logwrap)
Unwrap = Callable[[str], tuple[str, str]]

# -- the line ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogLine:
    """A decoded line. `proc`/`pid` name the innermost process prefix (the real origin).

    `plain` is the visible text (escapes removed, wrappers kept); `message` is what the process
    logged, without wrappers, prefix, level, timestamp or source location.
    """

    offset: int
    raw: str
    plain: str
    proc: str | None
    pid: int | None
    level: str | None
    message: str


def unfrozen_twin(cls: type) -> type:
    """A twin of the frozen, slotted dataclass `cls`: same slots, a plain __init__. A frozen
    __init__ pays object.__setattr__ per field (about 3x a plain one), and a log makes one
    object per line: built as the twin, then given `cls` as its class, it is frozen from then on.
    """
    return make_dataclass(f"_{cls.__name__}Building", [(f.name, f.type) for f in fields(cls)],
                          slots=True)


_Building = unfrozen_twin(LogLine)


# Outer wrappers, peeled in any order: docker compose `svc-1  | ` (or a bare `  | ` in a CI
# paste), CI `[2024-09-05T00:38:34Z] `, RFC3339 (container runtimes) and Kubernetes' CRI
# `stdout F `, torch.distributed.run's `[rank0]: `, a supervisor's logger
# `07:28:59 [INFO] [job] [INFERENCE LOG] `, a syslog header `Sep  5 00:38:34 host vllm[123]: `.
_WRAPPER_RE = re.compile(
    r"[A-Za-z0-9][\w.-]*\s+\|(?: |$)|\s+\|(?: |$)"
    r"|\[(?:\d{4}-\d\d-\d\d[T ])?\d\d:\d\d:\d\d[\d:.]*(?:Z|[+-]\d\d:?\d\d)?\] "
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? "
    r"|(?:stdout|stderr) [FP] "
    r"|\[(?:rank|default)\d+\]: ?"
    r"|\d\d:\d\d:\d\d(?:[.,]\d+)? \[[A-Z]+\](?: \[[^\]]*\])* "
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w./-]+(?:\[\d+\])?: "
    # a Python logging format's `%(name)s %(levelname)s` (`uvicorn.error INFO:`, a wrapper's
    # `1 kserve INFO`): the logger's name before the level
    r"|(?:\d+ )?[a-z_]\w*(?:\.\w+)* (?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)[: ])"
)
# rich's RichHandler (a tool that launches the server and relays its output): a time column
# (blank when the second repeats), a level column, the message, and `file.py:N` at the right
# margin. The server's own line is the message.
_RICH_RE = re.compile(
    r"(?:\[[\d/.: -]{8,20}\]|\s{8,}) ?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +(\S.*?)"
    r" +[\w.-]+\.py:\d+$")
_MONTH_INITIALS = frozenset("JFMASOND")

# `(Name pid=N) `, `(VllmWorker rank=0 pid=N)`, `(VllmWorker TP2 pid=N)`,
# `(RayWorkerWrapper pid=N, ip=10.0.0.1)`; the `(` may have been lost in a copy.
# A fork's `(Engine (DP0))` / `(Worker (TP1))` / `(API)` shape is accepted too.
_PREFIX_RE = re.compile(
    r"\(?(?:([A-Za-z][\w-]*(?: (?:rank=\d+|TP\d+))?) pid=(\d+)(?:, ip=[^)\s]*)?"
    r"|(API|Engine \(\w+\)|Worker \(\w+\)))\)(?: |$)?"
)
# Embedded prefix: a tqdm bar left without newline shares the physical line with a record.
_EMBEDDED_PREFIX_RE = re.compile(
    r"\(([A-Za-z][\w-]*(?: (?:rank=\d+|TP\d+))?) pid=(\d+)(?:, ip=[^)\s]*)?\)(?: |$)"
)
# `INFO 09-04 17:38:34 [utils.py:302] ` (brackets optional, relative paths allowed, millis
# allowed) or uvicorn's `INFO:     `.
_HEADER_RE = re.compile(
    r"(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
    r"(?: \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? (?:\[?[\w./-]+:\d+\] ?)?|:\s+)"
)
_LEVEL_INITIALS = frozenset("DIWEC")
# SGLang: `[2025-08-04 10:10:06 TP3] `, `[... DP0 TP3 EP3] `, `[... PP1 ATTN_CP2 TP2] `: the
# rank tag of a scheduler
# process (titled `sglang::scheduler_TP3`). Without a tag (TP=1, the launcher) the stamp is
# peeled like any timestamp wrapper.
_SGLANG_TAG_RE = re.compile(
    r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?((?: [A-Z][A-Z_]+\d+)+)\] ?")
# The end of a vLLM header whose start a copy lost: `[multiproc_executor.py:492] `
_HEADER_TAIL_RE = re.compile(r"\[?[\w./-]+\.py:\d+\] ")
_PREFIX_COLOUR, _PREFIX_RESET = "\x1b[1;36m(", "\x1b[0;0m"  # 7 + "(", and 6 characters
# Ray's log deduplication appends how often a line was seen across the cluster; the line is
# the worker's without it (a traceback's frame stays a frame).
_RAY_REPEATED = " across cluster]"
_RAY_REPEATED_RE = re.compile(r" ?\[repeated \d+x across cluster\]$")


def _unrepeated(body: str) -> str:
    return _RAY_REPEATED_RE.sub("", body) if body.endswith(_RAY_REPEATED) else body


def _peel_wrappers(s: str) -> str:
    for _ in range(5):
        c = s[:1]
        if not (c.isdigit() or c == "[" or " |" in s or (c in _MONTH_INITIALS and s[3:4] == " ")
                or s[:7] in ("stdout ", "stderr ") or c.islower()):
            return s
        m = _WRAPPER_RE.match(s)
        if m is None:
            return s
        s = s[m.end():]
    return s


_HEADERS: dict[str, str] = {}  # a vLLM header seen (level, stamp, source) → its level
_UVICORN_INFO = "INFO:     "


def _split_header(body: str) -> tuple[str | None, str]:
    """The level and what follows the header, as `_HEADER_RE` says. A header repeats for every
    record of a source within one second, so the regex's verdict is kept for its exact text
    (the header ends at the first `] `, which no part of it can contain)."""
    if body[:10] == _UVICORN_INFO:  # uvicorn's `INFO:` and its padding (`:\s+`)
        return "INFO", body[5:].lstrip()
    k = body.find("] ", 14, 100)
    key = body[:k + 2] if k > 0 else ""
    level = _HEADERS.get(key) if k > 0 else None
    if level is not None:
        return level, body[k + 2:]
    m = _HEADER_RE.match(body)
    if m is None:
        return None, body
    level = "WARNING" if m.group(1) == "WARN" else m.group(1)
    if m.end() == k + 2:
        if len(_HEADERS) > 4096:  # a new stamp every second: keep the recent ones
            _HEADERS.clear()
        _HEADERS[key] = level
    return level, body[m.end():]


_MISS = object()
_PREFIX_CACHE: dict[str, tuple[str, int | None] | None] = {}


def _prefix_at(s: str, pos: int) -> tuple[str, int | None, int] | None:
    """The process prefix at `pos`: (name, pid, where the rest starts). A log has a handful of
    distinct prefixes, so each is parsed by regex once and then found in a dict."""
    j = s.find(") ", pos, pos + 120)
    if j < 0:  # nothing after the prefix (a tqdm leftover), or no prefix at all
        m = _PREFIX_RE.match(s, pos)
        return (m.group(1) or m.group(3), _pid(m.group(2)), m.end()) if m else None
    key = s[pos:j + 1]
    hit = _PREFIX_CACHE.get(key, _MISS)
    if hit is _MISS:
        m = _PREFIX_RE.fullmatch(key)
        hit = (m.group(1) or m.group(3), _pid(m.group(2))) if m else None
        if len(_PREFIX_CACHE) > 4096:  # lines that only look like prefixes must not pile up
            _PREFIX_CACHE.clear()
        _PREFIX_CACHE[key] = hit
    return None if hit is None else (hit[0], hit[1], j + 2)  # type: ignore[index]


def _sglang_process(tag: str) -> str:
    """The scheduler a rank tag names, as its title does: " DP0 TP3" -> "scheduler_DP0_TP3"."""
    return "scheduler" + tag.replace(" ", "_")


def _pid(text: str | None) -> int | None:
    return int(text) if text is not None else None


def _prefixes(s: str) -> tuple[str | None, int | None, int]:
    """The innermost of the leading process prefixes, and where the rest of the line starts."""
    proc: str | None = None
    pid: int | None = None
    pos = 0
    while True:
        hit = _prefix_at(s, pos)
        if hit is None:
            return proc, pid, pos
        proc, pid, pos = hit
        if s[pos:pos + 1] != "(":
            return proc, pid, pos


def parse_line(raw: str, offset: int = -1, unwrap: Unwrap | None = None) -> LogLine:
    """Decode one raw line (a trailing newline is tolerated). `unwrap`: the wrapper learnt from
    the log (tui.core.logwrap), which splits a line into the wrapper's text and the line."""
    s = raw.rstrip("\n") if raw[-1:] == "\n" else raw
    if "#" in s and ("#0" in s or "#177" in s):
        s = _decode_syslog(s)
    lead = ""
    if unwrap is not None:
        lead, s = unwrap(s)
        if lead and not lead.isprintable():
            lead = _strip(lead)
    if s[13:14] == "," and s[:13].isdigit():  # a log viewer's CSV export (CloudWatch:
        s = s[14:]  # `1756144012376,"<the line>"`, epoch milliseconds, quotes doubled inside)
        if s[:1] == '"' and s[-1:] == '"':
            s = s[1:-1].replace('""', '"')
    carried: tuple[str | None, int | None] = (None, None)
    if s[:8] == _PREFIX_COLOUR:  # vLLM's own cyan prefix: sliced off, cheaper than a regex
        k = s.find(_PREFIX_RESET, 8, 200)
        if k > 0:
            s = s[7:k] + s[k + 6:]
    if not s.isprintable():
        if "\r" in s:
            s, carried = _tqdm_segment(s)
        else:
            s = _strip(s)
    plain = s
    if (s[:1] == "[" or s[:8] == "        ") and s[-1:].isdigit() and ".py:" in s[-40:]:
        rich = _RICH_RE.match(s)
        if rich is not None:
            s = rich.group(1)
    body = _peel_wrappers(s) if s[:1] != "(" else s
    proc: str | None = None
    pid: int | None = None
    j = body.find(") ", 1, 120) if body[:1] == "(" else -1
    hit = _PREFIX_CACHE.get(body[:j + 1]) if j > 0 else None
    if hit is not None and body[j + 2:j + 3] != "(":  # the common case: one known prefix
        proc, pid = hit
        body = body[j + 2:]
    elif body[:1] == "[" and (tag := _SGLANG_TAG_RE.match(body)) is not None:
        proc = _sglang_process(tag.group(1))
        body = body[tag.end():]
    elif body[:1] == "(" or " pid=" in body[:100]:
        proc, pid, pos = _prefixes(body)
        if pos:
            body = body[pos:]
        elif body[:1] != " ":
            m = _EMBEDDED_PREFIX_RE.search(body)
            if m is not None:
                proc, pid, pos = _prefixes(body[m.start():])
                body = body[m.start() + pos:]
    if proc is None and carried[0] is not None:
        proc, pid = carried
        plain = f"({proc} pid={pid}) {plain}" if pid is not None else f"({proc}) {plain}"
    level, body = _split_header(body) if body[:1] in _LEVEL_INITIALS else (None, body)
    if level is None and ".py:" in body[:80] and (tail := _HEADER_TAIL_RE.match(body)):
        body = body[tail.end():]
    line = _Building(offset, raw, lead + plain if lead else plain, proc, pid, level,
                     _unrepeated(body.rstrip()))
    line.__class__ = LogLine
    return line  # type: ignore[return-value]


# A line that starts with one of these (no letter, digit, bracket or parenthesis: no wrapper,
# prefix, level or stamp starts so) and holds no margin, pid, source location, escape or `#`
# is its own message.
_BARE_INITIALS = frozenset(" !\"$%&'*+,-./:;<=>?@\\]^`{}~")


# A busy log repeats lines word for word (a warning per request, its source line, a record
# within its second): the decoding of a line seen recently is reused, at its new offset. Lines
# up to this long are kept, this many at most (then forgotten, as the log moves on).
_DECODED_LEN = 1000
_DECODED_MAX = 4096
_DECODED: dict[str, LogLine] = {}


def parse_lines(pairs: Iterable[tuple[int, str]], unwrap: Unwrap | None = None,
                ) -> list[LogLine]:
    """Decode a chunk of (byte offset, raw line): `parse_line` on each, with the commonest
    shape of a busy log (one known process prefix, then a vLLM or uvicorn header, nothing to
    strip) taken in one pass of cheap checks, without the general path's branches; a line
    with nothing to decode at all (a traceback's source line, a Python warning's) as it is;
    and a line decoded recently (without a wrapper) as it was then."""
    if unwrap is not None:
        return _parse_lines(pairs, unwrap)
    out: list[LogLine] = []
    append = out.append
    decoded = _DECODED
    known = decoded.get
    fresh: list[tuple[int, tuple[int, str]]] = []
    for pair in pairs:
        line = known(pair[1])
        if line is None:
            fresh.append((len(out), pair))
            append(line)  # type: ignore[arg-type]  # filled in below
            continue
        twin = _Building(pair[0], pair[1], line.plain, line.proc, line.pid, line.level,
                         line.message)
        twin.__class__ = LogLine
        append(twin)  # type: ignore[arg-type]
    if fresh:
        for (k, _), line in zip(fresh, _parse_lines([pair for _, pair in fresh], None),
                                strict=True):
            out[k] = line
            if len(line.raw) <= _DECODED_LEN:
                if len(decoded) >= _DECODED_MAX:
                    decoded.clear()
                decoded[line.raw] = line
    return out


def _parse_lines(pairs: Iterable[tuple[int, str]], unwrap: Unwrap | None) -> list[LogLine]:
    out: list[LogLine] = []
    append = out.append
    cache_get = _PREFIX_CACHE.get
    split = _split_header
    headers_get = _HEADERS.get
    initials = _LEVEL_INITIALS
    bare = _BARE_INITIALS if unwrap is None else frozenset()
    for offset, raw in pairs:
        if (raw[:1] in bare and raw[:8] != "        " and raw.isprintable() and "#" not in raw
                and " |" not in raw and " pid=" not in raw[:100] and ".py:" not in raw[:80]):
            line = _Building(offset, raw, raw, None, None, None, raw.rstrip())
            line.__class__ = LogLine
            append(line)  # type: ignore[arg-type]
            continue
        j = raw.find(") ", 1, 120) if raw[:1] == "(" else -1
        hit = cache_get(raw[:j + 1]) if j > 0 else None
        if (hit is None or raw[j + 2:j + 3] == "(" or raw[-1:] == "\n" or not raw.isprintable()
                or ("#" in raw and ("#0" in raw or "#177" in raw))):
            append(parse_line(raw, offset, unwrap))
            continue
        pos = j + 2
        k = raw.find("] ", pos + 14, pos + 100)  # the header's end, if it is one seen before
        level = headers_get(raw[pos:k + 2]) if k > 0 else None
        if level is not None:
            body = raw[k + 2:]
        else:
            body = raw[pos:]
            level, body = split(body) if body[:1] in initials else (None, body)
        line = _Building(offset, raw, raw, hit[0], hit[1], level, _unrepeated(body.rstrip()))
        line.__class__ = LogLine
        append(line)  # type: ignore[arg-type]
    return out


def _tqdm_segment(s: str) -> tuple[str, tuple[str | None, int | None]]:
    """The last non-blank `\\r` segment; the prefix `_add_prefix` wrote before the first `\\r`
    belongs to it (vLLM prefixes a write, and tqdm redraws inside one line)."""
    segs = s.split("\r")
    index, chosen = _last_segment(segs)
    if not chosen.isprintable():
        chosen = _strip(chosen)
    if index == 0:
        return chosen, (None, None)
    head = segs[0]
    if not head.isprintable():
        head = _strip(head)
    head = _peel_wrappers(head)
    if head[:1] == "(":
        proc, pid, pos = _prefixes(head)
        if pos and not head[pos:].strip():
            return chosen, (proc, pid)
    return chosen, (None, None)
