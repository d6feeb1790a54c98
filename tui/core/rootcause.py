"""Root cause: the first real exception of the first process that died.

Every process of a vLLM run writes to one log, tracebacks interleaved and each line carrying its
process prefix (or none: some tracebacks are printed raw). The tracker assembles a traceback per
process, records the first exception of each that is not a known symptom ("Engine core
initialization failed ... See root cause above" only points elsewhere) nor noise, and answers
with the candidate of the process reported dead first, or before any death the first candidate.

SGLang logs a scheduler's failure as ONE record, `[... TP3] Scheduler hit an exception:
Traceback ...`: only its first line carries the rank tag, the rest are its continuation. Its
launcher's "Received sigquit from a child process" is a symptom, and may come first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tui.core.logline import LogLine
from tui.core.noise import NoiseFilter


@dataclass(frozen=True, slots=True)
class RootCause:
    """`line` is the exception line (a SyntaxError carries its file and line); `traceback` the
    assembled traceback for display; `symptoms` every distinct symptom seen so far."""

    line: str
    process: str | None
    pid: int | None
    offset: int
    symptoms: tuple[str, ...] = ()
    traceback: tuple[str, ...] = ()


# Lines that report a failure somewhere else: never the cause (vllm-reference.md section 2).
_SYMPTOM_RE = re.compile(
    r"Engine core initialization failed|Frontend process failed during engine core init"
    r"|EngineCore failed to start|WorkerProc failed to start|WorkerProc initialization failed"
    r"|died unexpectedly|EngineCore encountered (?:a fatal error|an issue)|EngineDeadError"
    r"|Parent process exited, terminating worker|Received sigquit from a child process"
    r"|[Ee]ngine core (?:proc \S+ )?exited unexpectedly|See root cause above"
    r"|Child process unexpectedly failed"
)
# An orderly shutdown someone asked for (SIGTERM, `specconsole kill`): the "Parent process
# exited, terminating worker queues" that follows (INFO in vLLM 0.32) is its consequence, not a
# failure. After the engine died, vLLM's own "shutdown triggered" comes after its symptoms.
_REQUESTED_SHUTDOWN_RE = re.compile(
    r"\[shutdown\].*(?:received signal=SIG(?:TERM|INT)|shutdown triggered)")
# Every symptom contains one of these.
_SYMPTOM_NEEDLES = ("ailed", "died", "ncountered", "EngineDead", "xited", "sigquit", "root cause")
# Exceptions that only say another process failed (vLLM's model inspection runs in a
# subprocess and re-raises its failure, with the child's own traceback printed below): the
# cause when nothing better is known, else the real exception that follows wins.
_ELSEWHERE_RE = re.compile(
    r"(?:[\w.]+\.)?CalledProcessError\b|RuntimeError: Error raised in subprocess")
# Exceptions a signal or a shutdown raises: consequences, neither cause nor symptom.
_CONSEQUENCE_RE = re.compile(r"(?:[\w.]+\.)?(?:KeyboardInterrupt|SystemExit|CancelledError)\b")
# The last line of a traceback: `pkg.mod.Name: message`, `Name:` or a bare `Name`.
_EXCEPTION_RE = re.compile(r"([A-Za-z_][\w.]*)(?::(?: .*)?)?$")
# An exception named inside an ERROR record that has no traceback.
_ERROR_EXCEPTION_RE = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b|\bError: |\[Errno \d+\]")
_FRAME_RE = re.compile(r'  File "([^"]+)", line (\d+)')
_HAS_LOCATION_RE = re.compile(r"\(\S.*, line \d+\)$")
_SYNTAX_ERRORS = ("SyntaxError", "IndentationError", "TabError")
_PROCESS_HEADER_RE = re.compile(r"Process (\S+):$")
_TB_START = "(most recent call last):"
_CHAINING = ("During handling of the above exception", "The above exception was the direct cause")

_IN_FRAMES, _AFTER_EXCEPTION = 0, 1
# The earliest errors are the ones that matter; a server failing every request for days must not
# grow the tracker without bound.
_MAX_CANDIDATES = 256


class _Trace:
    """A traceback being assembled for one process."""

    __slots__ = ("candidate", "last_frame", "lines", "pid", "proc", "state")

    def __init__(self, proc: str | None, pid: int | None, first: str) -> None:
        self.proc = proc
        self.pid = pid
        self.lines = [first]
        self.state = _IN_FRAMES
        self.last_frame: tuple[str, str] | None = None
        self.candidate: _Candidate | None = None


class _Candidate:
    __slots__ = ("elsewhere", "line", "offset", "pid", "proc", "trace")

    def __init__(self, line: str, proc: str | None, pid: int | None, offset: int,
                 trace: list[str]) -> None:
        self.line, self.proc, self.pid, self.offset, self.trace = line, proc, pid, offset, trace
        self.elsewhere = _ELSEWHERE_RE.match(line) is not None


class RootCauseTracker:
    """Feed every line; `note_death` the processes as they die; ask `cause()` at any time.

    The answer is computed when asked, so a death reported before its traceback arrives (the
    agent's pidfd is faster than the log tail) still gets the right cause.
    """

    def __init__(self, noise: NoiseFilter | None = None, engine: str = "vllm") -> None:
        self._noise = noise
        # SGLang: a line without a process continues the traceback of the line before it
        self._records = engine == "sglang"
        self._carry: object = None  # that traceback's key
        self._open: dict[object, _Trace] = {}
        self._candidates: list[_Candidate] = []
        self._symptoms: dict[str, None] = {}
        self._death: tuple[int, str] | None = None
        self._process_header: str | None = None
        self._stopping = False
        self.last_symptom_offset = -1
        self.last_exception_offset = -1

    @property
    def symptoms(self) -> tuple[str, ...]:
        return tuple(self._symptoms)

    def note_death(self, pid: int, name: str) -> None:
        """Only the first death counts: later ones are consequences."""
        if self._death is None:
            self._death = (pid, name)

    def cause(self) -> RootCause | None:
        cands = self._candidates
        if not cands:
            return None
        if self._death is not None:
            pid, name = self._death
            short = name.removeprefix("VLLM::").removeprefix("sglang::")
            cands = ([c for c in cands if c.pid == pid]
                     or [c for c in cands if c.proc is not None and c.proc == short] or cands)
        # a failure reported from another process gives way to a real exception of the same one
        chosen = next((c for c in cands if not c.elsewhere), cands[0])
        return RootCause(chosen.line, chosen.proc, chosen.pid, chosen.offset, self.symptoms,
                         tuple(chosen.trace))

    def feed_all(self, lines: Iterable[LogLine]) -> None:
        """`feed` each line of a chunk; the INFO and DEBUG records that cannot start, continue
        or end a traceback nor report a symptom (nearly all of a busy log) are passed over."""
        feed = self.feed
        for line in lines:
            level = line.level
            if (level == "INFO" or level == "DEBUG") and not self._open:
                msg = line.message
                if not (msg.endswith(_TB_START) or "[shutdown]" in msg or "xited" in msg
                        or "died" in msg):
                    continue
            feed(line)

    def feed(self, line: LogLine) -> None:
        msg = line.message
        key = line.pid if line.pid is not None else line.proc
        carry, self._carry = self._carry, None
        if self._open:
            at = carry if key is None and carry is not None else key
            trace = self._open.get(at)
            if trace is not None and self._continue(trace, line, msg, at):
                self._carry = at if self._records else None
                return
        if msg.endswith(_TB_START):
            self._start(key, line, msg)
            self._carry = key if self._records else None
            return
        if "[shutdown]" in msg and _REQUESTED_SHUTDOWN_RE.search(msg) is not None:
            self._stopping = True
        level = line.level
        if level == "ERROR" or level == "CRITICAL":
            if not self._symptom(line, msg) and _ERROR_EXCEPTION_RE.search(msg) is not None:
                self._candidate(line, msg.strip(), [msg])
        elif level is None or level == "WARNING" or "xited" in msg or "died" in msg:
            self._symptom(line, msg)
        if key is None and level is None:
            # multiprocessing prints `Process EngineCore_DP0:` above a raw traceback: its name.
            m = _PROCESS_HEADER_RE.match(msg) if msg.startswith("Process ") else None
            self._process_header = m.group(1) if m else None

    # -- tracebacks -------------------------------------------------------------------------

    def _start(self, key: object, line: LogLine, msg: str) -> None:
        proc = line.proc
        if proc is None and self._process_header is not None:
            proc, self._process_header = self._process_header, None
        self._open[key] = _Trace(proc, line.pid, msg)

    def _continue(self, trace: _Trace, line: LogLine, msg: str, key: object) -> bool:
        """Absorb `line` into the open traceback; False when the traceback has ended."""
        if trace.state == _IN_FRAMES:
            if not msg or msg[0] == " ":
                trace.lines.append(msg)
                if msg.startswith('  File "'):
                    m = _FRAME_RE.match(msg)
                    if m is not None:
                        trace.last_frame = (m.group(1), m.group(2))
                return True
            if _EXCEPTION_RE.match(msg) is not None:
                trace.lines.append(msg)
                trace.state = _AFTER_EXCEPTION
                self._exception(trace, line, msg)
                return True
        else:
            if not msg or msg[0] == " " or msg.startswith(_CHAINING):
                trace.lines.append(msg)
                return True
            if msg.endswith(_TB_START):
                trace.lines.append(msg)
                trace.state = _IN_FRAMES
                trace.last_frame = None
                return True
        del self._open[key]
        return False

    def _exception(self, trace: _Trace, line: LogLine, msg: str) -> None:
        if self._symptom(line, msg) or trace.candidate is not None:
            return
        if _CONSEQUENCE_RE.match(msg) is not None:
            return
        text = msg.strip()
        name = text.split(":", 1)[0]
        if (name.endswith(_SYNTAX_ERRORS) and trace.last_frame is not None
                and _HAS_LOCATION_RE.search(text) is None):
            text = f"{text} ({trace.last_frame[0]}, line {trace.last_frame[1]})"
        trace.candidate = self._candidate(line, text, trace.lines, trace.proc, trace.pid)

    # -- candidates and symptoms ------------------------------------------------------------

    def _candidate(self, line: LogLine, text: str, trace: list[str], proc: str | None = None,
                   pid: int | None = None) -> _Candidate | None:
        if len(self._candidates) >= _MAX_CANDIDATES or (
                self._noise is not None and self._noise.match(line) is not None):
            return None
        cand = _Candidate(text, proc if proc is not None else line.proc,
                          pid if pid is not None else line.pid, line.offset, trace)
        self._candidates.append(cand)
        self.last_exception_offset = line.offset
        return cand

    def _symptom(self, line: LogLine, msg: str) -> bool:
        for needle in _SYMPTOM_NEEDLES:  # a cheap gate: the regex is slow on long lines
            if needle in msg:
                break
        else:
            return False
        if _SYMPTOM_RE.search(msg) is None:
            return False
        if self._stopping:
            return True  # a consequence of the shutdown: neither cause nor symptom
        self._symptoms[msg.strip()] = None
        self.last_symptom_offset = line.offset
        return True
