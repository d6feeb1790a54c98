"""Root cause: the first real exception of the first process that died.

Every process of a vLLM run writes to one log, tracebacks interleaved and each line carrying its
process prefix (or none: some tracebacks are printed raw). The tracker assembles a traceback per
process, records the first exception of each that is not a known symptom ("Engine core
initialization failed ... See root cause above" only points elsewhere) nor noise, and answers
with the candidate of the process reported dead first, or before any death the first candidate.

Real logs arrive damaged, and the tracker reads them as they are:
- a traceback whose `Traceback (most recent call last):` line was cut off (an excerpt, a rotated
  log) starts at its first `File "...", line N` frame;
- a traceback pasted without its indentation still reads as frames, source lines and an
  exception line;
- a traceback cut before its exception line is a crash whose cause line is missing: the answer
  says so, with the deepest frame of the engine's own code;
- an exception whose message spans several lines (pydantic's `1 validation error for X` and its
  `Value error, ...` reason) is the whole message;
- an ERROR or WARNING record that states a failure of a known class (tui.core.failures: CUDA out
  of memory, NCCL, a port in use, ...) is a cause even without a traceback: vLLM logs some
  causes that way before a traceback that carries only a symptom.

SGLang logs a scheduler's failure as ONE record, `[... TP3] Scheduler hit an exception:
Traceback ...`: only its first line carries the rank tag, the rest are its continuation. Its
launcher's "Received sigquit from a child process" is a symptom, and may come first.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tui.core.failures import (
    FailureClass,
    by_id,
    classify,
    fatal_statement,
    signal_of,
    signal_words,
    states_cause,
)
from tui.core.logline import LogLine
from tui.core.noise import NoiseFilter
from tui.core.procnames import untitled
from tui.core.ranking import (
    BEFORE_READY_WORDS,
    SURVIVED_WORDS,
    Facts,
    Ranker,
    reasons,
    shape,
    shipped,
    tier,
)


@dataclass(frozen=True, slots=True)
class RootCause:
    """`line` is the exception line (a SyntaxError carries its file and line; a message that
    spans lines, its reason too); `traceback` the assembled traceback for display; `symptoms`
    every distinct symptom seen so far. `missing`: the traceback was cut before its exception
    line, and `line` says so; `deepest_frame` is then where it was (engine code preferred)."""

    line: str
    process: str | None
    pid: int | None
    offset: int
    symptoms: tuple[str, ...] = ()
    traceback: tuple[str, ...] = ()
    missing: bool = False
    deepest_frame: str | None = None
    kind: FailureClass | None = None
    score: float | None = None  # the ranking's (tui.core.ranking), when candidates were ranked
    reasons: tuple[str, ...] = ()  # why the ranking considered it, in words
    elsewhere: bool = False  # it reports a failure elsewhere (the ranking's second tier)
    survived: bool = False  # a good launch of the profile logged it too (second tier as well)
    before_ready: bool = False  # logged before this launch's READY, which it survived (likewise)
    signal: str | None = None  # a process ended by this signal with no error of its own: `line`


# Lines that report a failure somewhere else: never the cause (vllm-reference.md section 2).
# Where they are printed: vLLM v1/engine/utils.py wait_for_engine_startup (raise RuntimeError
# 'Engine core initialization failed. See root cause above'); v1/engine/core.py run_engine_core
# (logger.exception 'EngineCore failed to start.' / 'EngineCore encountered a fatal error.');
# v1/executor/multiproc_executor.py monitor_workers (logger.error 'Worker proc %s died
# unexpectedly'); V0 engine/multiprocessing/client.py run_heartbeat_loop ('Engine process (pid
# %s) died.') and engine/async_llm_engine.py ('Background loop has errored already.'); SGLang
# entrypoints/engine.py (logger.error 'Received sigquit from a child process', 'Rank %s
# scheduler is dead', raise RuntimeError 'Rank %s scheduler died during initialization').
_SYMPTOM_RE = re.compile(
    r"Engine core initialization failed|Frontend process failed during engine core init"
    r"|EngineCore failed to start|WorkerProc failed to start|WorkerProc initialization failed"
    r"|[Pp]roc(?: rank=)?\s?\S* died unexpectedly|EngineCore encountered (?:a fatal error|an issue)"
    r"|EngineDeadError"
    r"|Parent process exited, terminating worker|Received sigquit from a child process"
    r"|[Ee]ngine core (?:proc \S+ )?exited unexpectedly|See root cause above"
    r"|Child process unexpectedly failed"
    # V0 (<= 0.9): the front end's view of a dead engine process or background loop
    r"|Engine process (?:\(pid \d+\) )?(?:died|failed to start)|Engine loop is not running"
    r"|Background loop (?:has errored already|is stopped)|Engine background task failed"
    r"|AsyncEngineDeadError|MQEngineDeadError"
    # SGLang: the launcher's and the tokenizer manager's view of a dead scheduler
    r"|[Ss]cheduler is dead|[Ss]cheduler died during initialization"
    r"|could finish the model loading, but (?:there are )?other ranks"
    r"|Initialization failed\. (?:Please see the error messages above|warmup error"
    r"|\w+_init_state:)"
    # vLLM v1/engine/core_client.py: a worker's death signalled to the front end (SIGUSR1)
    r"|Got fatal signal from worker processes"
    # a launcher's or a test harness's view of its child's end (SGLang's popen_launch_server)
    r"|[Pp]rocess (?:\S+ )?exited with (?:exit )?code -?\d+"
    r"|MQLLMEngine is already dead|failed to be inspected\. Please check the logs"
    # vLLM v1/executor/multiproc_executor.py collective_rpc and v1/engine/core.py: the
    # executor's failure callback fired (a worker died): raised in the engine core
    r"|Executor failed\."
)
# A process's death reported with its exit status (vLLM's executor monitor, the engine-core
# handshake, a launcher): its name and the status, -N or 128+N when a signal ended it.
_REPORTED_DEATH_RE = re.compile(
    r"Worker proc (?P<worker>\S+) died unexpectedly \(exit code: (?P<wcode>-?\d+)\)"
    r"|Failed core proc\(s\): \{'(?P<core>[^']+)': (?P<ccode>-?\d+)"
    r"|(?P<proc>\w[\w-]*) process (?:\(pid \d+\) )?exited with (?:exit )?code (?P<pcode>-?\d+)")
# Signals that end a process in native code: its own last words are unprefixed native lines
# (faulthandler's fatal error, a signal handler's report), never a traceback of its own.
_NATIVE_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE,
                             signal.SIGILL})
# An orderly shutdown someone asked for (SIGTERM, `specconsole kill`): the "Parent process
# exited, terminating worker queues" that follows (INFO in vLLM 0.32) is its consequence, not a
# failure. After the engine died, vLLM's own "shutdown triggered" comes after its symptoms.
_REQUESTED_SHUTDOWN_RE = re.compile(
    r"\[shutdown\].*(?:received signal=SIG(?:TERM|INT)|shutdown triggered)")
# Every symptom contains one of these.
_SYMPTOM_NEEDLES = ("ailed", "died", "ncountered", "EngineDead", "xited", "sigquit", "root cause",
                    "not running", "errored", "stopped", "dead", "other ranks", "inspected")
# Exceptions that only say another process failed (vLLM's model inspection runs in a
# subprocess and re-raises its failure, with the child's own traceback printed below; V0's
# worker wrapper names the method and the reason, its traceback follows): the cause when
# nothing better is known, else the real exception that follows wins.
_ELSEWHERE_RE = re.compile(
    r"(?:[\w.]+\.)?CalledProcessError\b|RuntimeError: Error raised in subprocess"
    # Ray: an actor died (its own log has the why; the node's OOM killer, a signal), in the
    # exception's name or in Ray's own words with its list of possible reasons
    r"|(?:ray\.exceptions\.)?(?:ActorDiedError|RayActorError|RayTaskError)\b"
    # Ray's task error names the actor by its repr: the exception it carries follows
    r"|repr=<[\w.]+ object at 0x"
    r"|[Tt]he actor is dead because|[Tt]he actor died unexpectedly")
# Headers of a report that follows (a worker's method failed, the model inspection failed):
# they order the candidates but are the answer only when they carry the reason themselves.
_HEADER_WRAPPER_RE = re.compile(
    r"Exception in worker \S+ while processing method|Error executing method"
    r"|Error in inspecting model architecture")
# Exceptions a signal or a shutdown raises: consequences, neither cause nor symptom.
_CONSEQUENCE_RE = re.compile(r"(?:[\w.]+\.)?(?:KeyboardInterrupt|SystemExit|CancelledError)\b")
# The last line of a traceback: `pkg.mod.Name: message`, `Name:` or a bare `Name`.
_EXCEPTION_RE = re.compile(r"([A-Za-z_][\w.]*)(?::(?: .*)?)?$")
# ... and, where indentation was lost, a name that is an exception's: `...Error`, `...Exception`,
# or a class named with its module path and a message (`triton.runtime.errors.OutOfResources:
# out of resource: shared memory`, `torch._dynamo.exc.Unsupported: ...`): a library's own
# exception classes need not end in Error.
_NAMED_EXCEPTION_RE = re.compile(
    r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Timeout|Warning)"
    r"(?::(?: .*)?)?$|(?:[a-z_]\w*\.){2,}[A-Z]\w*: .*$")
# An exception named inside an ERROR record that has no traceback.
_ERROR_EXCEPTION_RE = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b|\bError: |\[Errno \d+\]")
_FRAME_RE = re.compile(r'\s*File "([^"]+)", line (\d+)(?:, in (\S+))?')
# faulthandler's frame (no comma before `in`), under `Current thread 0x... (most recent call
# first):`, after its `Fatal Python error: ...`: where the process was, not a traceback
_FAULT_FRAME_RE = re.compile(r'\s*File "([^"]+)", line (\d+) in (\S+)\s*$')
_FAULT_STACK = "(most recent call first):"
_FAULT_FRAMES_MAX = 64
# An exception's message: what follows its type (`IndexError: <message>`).
_MESSAGE_RE = re.compile(r"[\w.]+(?:\([\w.]*\))?: (.{16,})")
_HAS_LOCATION_RE = re.compile(r"\(\S.*, line \d+\)$")
_SYNTAX_ERRORS = ("SyntaxError", "IndentationError", "TabError")
_PROCESS_HEADER_RE = re.compile(r"Process (\S+):$")
_TB_START = "(most recent call last):"
_CHAINING = ("During handling of the above exception", "The above exception was the direct cause")
# A message that continues on the lines below it: pydantic's header, or one ending in a colon.
_HEADER_MESSAGE_RE = re.compile(r"\d+ validation errors? for \w+$|:$")
_MESSAGE_MORE_MAX = 2
_PYDANTIC_TAIL_RE = re.compile(r"\s*\[type=\w+.*$")
_PYDANTIC_LINK = "For further information visit"
# The engines' own code, for the deepest frame worth naming.
_ENGINE_PATH_RE = re.compile(r"/(vllm|sglang|vllm_ascend)/(.+)$")

# A request's failure while serving: a traceback through the HTTP request cycle (uvicorn's,
# the engines' OpenAI handlers, a tool-call parser), or under uvicorn's `Exception in ASGI
# application`. The server answers that request with an error and goes on: no crash, unless a
# process died or the engine says it is dead (a symptom). Start-up tracebacks pass through
# uvicorn's lifespan and the API server's run_server, never these.
_REQUEST_FRAME_RE = re.compile(
    r"/uvicorn/protocols/http/|/entrypoints/openai/serving_\w+\.py|/openai_api/adapter\.py"
    r"|/(?:tool_parsers?|function_call|reasoning)/\w+\.py")
_REQUEST_HEADER_RE = re.compile(r"Exception in ASGI application")

# Failure classes that are the engine's, wherever they are raised: an in-process engine (V0's
# AsyncLLMEngine, an offline LLM) raises its death through the request that was running.
_ENGINE_CLASSES = frozenset({"oom", "nccl", "native_crash", "device_assert", "cuda_env",
                             "killed"})


def _engine_failure(text: str) -> bool:
    kind = classify(text)
    return kind is not None and kind.id in _ENGINE_CLASSES


_IN_FRAMES, _AFTER_EXCEPTION = 0, 1
# The earliest errors are the ones that matter; a server failing every request for days must not
# grow the tracker without bound.
_MAX_CANDIDATES = 256


class _Trace:
    """A traceback being assembled for one process."""

    __slots__ = ("after_frame", "candidate", "chained", "dedented", "frames", "level", "lines",
                 "offset", "pid", "preface", "proc", "request", "state")

    def __init__(self, proc: str | None, pid: int | None, first: str, offset: int,
                 level: str | None) -> None:
        self.proc = proc
        self.pid = pid
        self.level = level  # a WARNING's traceback is no evidence of a crash by itself
        self.lines = [first]
        self.offset = offset
        self.state = _IN_FRAMES
        self.frames: list[tuple[str, str, str]] = []  # (path, line, function)
        self.after_frame = False  # the line before was a frame: this one is its source
        self.dedented = False  # pasted without indentation: frames and source at column 0
        self.candidate: _Candidate | None = None
        self.preface: _Candidate | None = None  # the words that headed it (see _start)
        self.request = False  # headed by uvicorn's `Exception in ASGI application`
        self.chained = False  # `During handling ...` / `The above exception ...` just read

    def of_a_request(self, ready_at: int) -> bool:
        """A request's failure while serving (see _REQUEST_FRAME_RE), not the server's."""
        return 0 <= ready_at < self.offset and (
            self.request or any(_REQUEST_FRAME_RE.search(f[0]) for f in self.frames))


class _Candidate:
    __slots__ = ("dropped", "elsewhere", "frames", "level", "line", "more", "offset", "pid",
                 "proc", "trace", "traceback_end", "wants_more", "weak", "wrapper")

    def __init__(self, line: str, proc: str | None, pid: int | None, offset: int,
                 trace: list[str], level: str | None) -> None:
        self.line, self.proc, self.pid, self.offset, self.trace = line, proc, pid, offset, trace
        self.level = level
        self.wrapper = _HEADER_WRAPPER_RE.search(line) is not None
        self.elsewhere = self.wrapper or _ELSEWHERE_RE.search(line) is not None
        self.weak = False  # a wrapper's words, a library's stderr: see _candidate
        self.traceback_end = False  # the exception line that ends a traceback
        self.dropped = False  # a preface whose traceback ended in a symptom: no cause at all
        self.wants_more = _HEADER_MESSAGE_RE.search(line) is not None
        self.more: list[str] = []
        # faulthandler's stack of the crashing thread, under a `Fatal Python error` line
        self.frames: list[tuple[str, str, str]] = []

    def where(self) -> str | None:
        """The innermost frame of the engine's own code in faulthandler's stack (else its
        innermost frame): where the process was when it crashed."""
        return _deepest(self.frames[::-1]) if self.frames else None

    def text(self) -> str:
        if not self.more:
            return self.line
        return f"{self.line} — {' '.join(self.more)}"

    def facts(self, survived: frozenset[str] = frozenset(), ready_at: int = -1,
              rewrap: bool = False) -> Facts:
        """`ready_at`: where the launch first showed READY (-1: not yet); `rewrap`: it raises
        another candidate's exception again, with that one's message inside its own."""
        text = self.text()
        return Facts(text, self.level, self.traceback_end, self.weak, self.elsewhere or rewrap,
                     bool(self.more), bool(survived) and shape(text) in survived,
                     ready_at >= 0 and self.offset < ready_at)


class _Cut:
    """A traceback that ended (or the log ended) before its exception line."""

    __slots__ = ("frames", "lines", "offset", "pid", "proc")

    def __init__(self, trace: _Trace) -> None:
        self.proc, self.pid, self.offset = trace.proc, trace.pid, trace.offset
        self.frames, self.lines = list(trace.frames), list(trace.lines)

    def deepest(self) -> str | None:
        """The innermost frame of the engine's own code (else the innermost frame)."""
        return _deepest(self.frames)


def _deepest(frames: Sequence[tuple[str, str, str]]) -> str | None:
    """Of frames listed outermost first: the innermost of the engine's own code, else the
    innermost, as `vllm/v1/worker/gpu_worker.py:235 in init_device`."""
    for path, line, func in reversed(frames):
        m = _ENGINE_PATH_RE.search(path)
        if m is not None:
            return f"{m.group(1)}/{m.group(2)}:{line} in {func}" if func else \
                f"{m.group(1)}/{m.group(2)}:{line}"
    if not frames:
        return None
    path, line, func = frames[-1]
    return f"{path}:{line}" + (f" in {func}" if func else "")


# Candidates compared for re-raised exceptions: the first few (a log's causes come early).
_REWRAP_SCAN = 64


def _rewraps(cands: Sequence[_Candidate]) -> set[int]:
    """The candidates that raise another's exception again with its message inside theirs,
    in either order (Ray streams a worker's own lines after its driver's): vLLM's
    `IndexError: Error in model execution: <the original's message>`, a wrapper's
    `RuntimeError: Worker failed with error 'IndexError(...)'`. A preface (weak) is no
    original: it is the record `logger.exception` wrote before its own traceback."""
    head = cands[:_REWRAP_SCAN]
    messages = [(i, m.group(1).strip()) for i, c in enumerate(head)
                if not c.weak and (m := _MESSAGE_RE.match(c.line)) is not None]
    out: set[int] = set()
    for i, c in enumerate(head):
        mine = _MESSAGE_RE.match(c.line)
        if mine is None:
            continue
        own = mine.group(1)
        for j, message in messages:
            if j != i and message != own.strip() and own.find(message) > 0:
                out.add(i)
                break
    return out


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
        self._cuts: list[_Cut] = []
        self._symptoms: dict[str, None] = {}
        self._death: tuple[int, str] | None = None
        self._death_signal: signal.Signals | None = None
        self._read_to = -1  # the offset of the last line read (fed or passed over)
        self._death_read_to = -1  # ... when the first death was noted
        # the first death the log itself reports with its status (name, signal or None, where)
        self._reported: tuple[str, signal.Signals | None, int] | None = None
        self._process_header: str | None = None
        # the last ERROR record of each process, while it may head a traceback that follows
        self._preface: dict[object, LogLine] = {}
        self._stopping = False
        # the last `Fatal Python error` candidate, whose faulthandler stack may follow, and
        # whether the stack being read is its crashing thread's (`Current thread`)
        self._fatal: _Candidate | None = None
        self._fault_current = True
        # an exception header whose message is still coming, line by line (its process key)
        self._unfinished: tuple[object, _Candidate] | None = None
        self.last_symptom_offset = -1
        self.last_exception_offset = -1
        self.last_cut_offset = -1  # where the last traceback without an exception line began
        self._failure_offsets: list[int] = []  # of each exception, symptom and cut, in order
        self._evidence: list[int] = []  # of each candidate that shows a crash, in order
        # shapes (tui.core.ranking.shape) of errors that launches of this profile logged and
        # survived to READY: never the cause while another is known
        self.survived: frozenset[str] = frozenset()
        # where this launch first showed READY (the diagnosis says): what it logged before and
        # survived is never the cause of a later death while another is known
        self.ready_at = -1
        # requests that failed while serving (see _REQUEST_FRAME_RE): how many, the first one
        self.requests_failed = 0
        self.first_request_failure: str | None = None

    @property
    def symptoms(self) -> tuple[str, ...]:
        return tuple(self._symptoms)

    def note_death(self, pid: int, name: str, sig: int | None = None) -> None:
        """Only the first death counts: later ones are consequences. `sig`: the signal that
        ended it (the agent saw it): with no error of its own, its survivors' errors are its
        consequences, not its cause."""
        if self._death is None:
            self._death = (pid, name)
            self._death_signal = signal_of(-sig) if sig else None
            self._death_read_to = self._read_to

    def cause(self, ranker: Ranker | None = None) -> RootCause | None:
        """The best cause known now: a real exception or stated failure, the best ranked
        (`ranker`: the shipped one unless given); else, when a traceback was cut
        before its exception line, that (`missing`); else None."""
        ranked = self.ranked(ranker, 1)
        if self._death is None and self._reported is not None and (
                not ranked or ranked[0].elsewhere or ranked[0].before_ready
                or ranked[0].survived):
            signalled = self._signalled()
            if signalled is not None:
                return signalled
        if ranked:
            return ranked[0]
        if self._death is not None and self._death_signal is not None:
            return None  # no error of its own: the signal is the answer (the death says it)
        return self._missing()

    def _signalled(self) -> RootCause | None:
        """The first death the log reports, when a signal ended it and nothing after it is an
        error of its own: that signal, with who could have sent it."""
        assert self._reported is not None
        name, sig, offset = self._reported
        if sig is None:
            return None
        line = f"{name} was ended by {signal_words(sig)}; no error of its own in the log"
        kind = by_id("native_crash") if sig in _NATIVE_SIGNALS else (
            by_id("killed") if sig == signal.SIGKILL else None)
        return RootCause(line, name, None, offset, self.symptoms, missing=True, kind=kind,
                         signal=sig.name)

    def candidates(self) -> list[_Candidate]:
        """The candidates the ranking chooses from, in the log's order: none dropped, and
        those of the process that died first when a death is known (a pid beats a name)."""
        # a wrapper that names no reason ("Error in inspecting model architecture 'X'") only
        # orders the others: it is never the answer
        cands = [c for c in self._candidates
                 if not c.dropped and (not c.wrapper or classify(c.line) is not None)]
        if self._death is not None and cands:
            pid, name = self._death
            short = untitled(name)
            own = ([c for c in cands if c.pid == pid]
                   or [c for c in cands if c.proc is not None and c.proc == short])
            if own or self._death_signal is None:
                return own or cands
            # ended by a signal with no error of its own: the others' errors read after it are
            # what its death did to them, and what the launch survived to READY is none of
            # it; an error read before it, since READY, may be why it was killed; a native
            # crash's own words are unprefixed native lines
            if self._death_signal in _NATIVE_SIGNALS:
                native = [c for c in cands if c.pid is None and c.proc is None
                          and fatal_statement(c.line)]
                if native:
                    return native
            return [c for c in cands
                    if self.ready_at < c.offset <= self._death_read_to
                    and not tier(c.facts(self.survived, self.ready_at))]
        return cands

    def ranked(self, ranker: Ranker | None = None, limit: int | None = None) -> list[RootCause]:
        """The candidates as RootCauses, best ranked first (tui.core.ranking); the first
        `limit` of them (each one classified: the live console asks after every chunk)."""
        cands = self.candidates()
        if not cands:
            return []
        ranker = ranker or shipped()
        facts = self.facts(cands)
        out = []
        for score, i, feats in ranker.order(facts)[:limit]:
            c, fact = cands[i], facts[i]
            text = c.text()
            why = ([SURVIVED_WORDS] if fact.survived else [BEFORE_READY_WORDS]
                   if fact.before_ready else reasons(ranker, feats))
            out.append(RootCause(text, c.proc, c.pid, c.offset, self.symptoms, tuple(c.trace),
                                 deepest_frame=c.where(), kind=classify(text), score=score,
                                 reasons=tuple(why),
                                 elsewhere=tier(fact) % 2 == 1, survived=fact.survived,
                                 before_ready=fact.before_ready))
        return out

    def facts(self, cands: Sequence[_Candidate]) -> list[Facts]:
        """What the ranking knows of each candidate (the profile's survived shapes, READY,
        which ones raise another's exception again)."""
        rewraps = _rewraps(cands)
        return [c.facts(self.survived, self.ready_at, i in rewraps)
                for i, c in enumerate(cands)]

    def shapes(self) -> list[str]:
        """The shapes of every candidate so far (at READY: what this launch survived)."""
        return list(dict.fromkeys(shape(c.text()) for c in self._candidates))

    def _missing(self) -> RootCause | None:
        cuts = self._cuts + [_Cut(t) for t in self._open.values()
                             if t.state == _IN_FRAMES and t.frames]
        if not cuts:
            return None
        if self._death is not None:
            pid, name = self._death
            short = untitled(name)
            cuts = [c for c in cuts if c.pid == pid or c.proc == short] or cuts
        cut = min(cuts, key=lambda c: c.offset)
        deepest = cut.deepest()
        where = f": deepest frame {deepest}" if deepest else ""
        return RootCause(f"the traceback was cut before its exception line{where}", cut.proc,
                         cut.pid, cut.offset, self.symptoms, tuple(cut.lines), missing=True,
                         deepest_frame=deepest)

    def feed_all(self, lines: Iterable[LogLine],
                 hidden: Sequence[bool] | None = None) -> None:
        """`feed` each line of a chunk; the INFO and DEBUG records that cannot start, continue
        or end a traceback nor report a symptom (nearly all of a busy log), and the lines a
        noise rule hides (`hidden`, per line), are passed over outside a traceback."""
        feed = self.feed
        line = None
        for i, line in enumerate(lines):
            if hidden is not None and hidden[i] and not self._open and self._unfinished is None:
                continue
            level = line.level
            if (level == "INFO" or level == "DEBUG") and not self._open:
                msg = line.message
                if not (msg.endswith(_TB_START) or "[shutdown]" in msg or "xited" in msg
                        or "died" in msg or 'File "' in msg):
                    continue
            feed(line)
        if line is not None:
            self._read_to = line.offset

    def feed(self, line: LogLine) -> None:
        msg = line.message
        self._read_to = line.offset
        key = line.pid if line.pid is not None else line.proc
        if self._unfinished is not None and self._message_goes_on(key, msg):
            return
        carry, self._carry = self._carry, None
        if self._open:
            at = carry if key is None and carry is not None else key
            trace = self._open.get(at)
            if trace is not None:
                if self._continue(trace, line, msg, at):
                    self._carry = at if self._records else None
                    return
                if trace.state == _IN_FRAMES and trace.frames:
                    self._cut(trace)
        if msg.endswith(_TB_START):
            self._start(key, line, msg)
            self._carry = key if self._records else None
            return
        if self._fatal is not None and self._faulthandler(msg):
            return
        frame = _FRAME_RE.match(msg) if 'File "' in msg[:12] else None
        if frame is not None:  # a traceback whose first line was cut off
            trace = self._start(key, line, msg)
            trace.frames.append((frame.group(1), frame.group(2), frame.group(3) or ""))
            trace.after_frame, trace.dedented = True, not msg[:1].isspace()
            self._carry = key if self._records else None
            return
        if "[shutdown]" in msg and _REQUESTED_SHUTDOWN_RE.search(msg) is not None:
            self._stopping = True
        level = line.level
        self._preface.pop(key, None)
        if level == "ERROR" or level == "CRITICAL":
            if not self._symptom(line, msg) and msg[:1] not in (" ", "\t"):
                if (_ERROR_EXCEPTION_RE.search(msg[:2048]) is not None
                        or states_cause(msg, level)):
                    self._candidate(line, msg.strip(), [msg])
                elif msg.strip() and len(self._preface) < _MAX_CANDIDATES:
                    self._preface[key] = line
        elif level == "WARNING":
            if (not self._symptom(line, msg) and msg[:1] not in (" ", "\t")
                    and states_cause(msg, level)):
                # `Unable to load X from Y on HF Hub.`: its traceback's exception says more
                self._candidate(line, msg.strip(), [msg], weak=True, evidence=False)
        elif level is None:
            if msg[:12].lstrip().startswith("what():"):
                # std::terminate's report of the C++ exception that ended the process
                self._candidate(line, msg.strip(), [msg])
            elif not self._symptom(line, msg) and msg[:1] not in (" ", "\t"):
                if ((": " in msg[:256] or msg[-1:] == ":")
                        and _NAMED_EXCEPTION_RE.match(msg[:256]) is not None):
                    # a traceback's last line whose frames are not in this log; a bare
                    # `ImportError:` header takes its reason from the lines below
                    cand = self._candidate(line, msg.strip(), [msg])
                    if cand is not None and cand.wants_more:
                        self._unfinished = (key, cand)
                elif states_cause(msg, None):  # a library's own stderr: CUDA, NCCL WARN
                    # one that shows its process could not go on (faulthandler's fatal error,
                    # argparse's usage error) is a cause in its own right, not a wrapper's words
                    fatal = fatal_statement(msg)
                    cand = self._candidate(line, msg.strip(), [msg], weak=not fatal,
                                           evidence=fatal)
                    if fatal and cand is not None and msg.startswith("Fatal Python error"):
                        self._fatal, self._fault_current = cand, True
        elif "xited" in msg or "died" in msg:
            self._symptom(line, msg)
        if key is None and level is None:
            # multiprocessing prints `Process EngineCore_DP0:` above a raw traceback: its name.
            m = _PROCESS_HEADER_RE.match(msg) if msg.startswith("Process ") else None
            self._process_header = m.group(1) if m else None

    def _faulthandler(self, msg: str) -> bool:
        """A line of the stack faulthandler prints under its `Fatal Python error`: a thread's
        header or one of its frames (the crashing thread's name where it crashed). True when
        the line was that."""
        assert self._fatal is not None
        if msg.endswith(_FAULT_STACK):
            # `Current thread 0x...` / `Stack` is the crashing one; `Thread 0x...` another
            self._fault_current = not msg.lstrip().startswith("Thread ")
            return True
        if 'File "' not in msg[:12]:
            return False
        m = _FAULT_FRAME_RE.match(msg)
        if m is None:
            return False
        frames = self._fatal.frames
        if self._fault_current and len(frames) < _FAULT_FRAMES_MAX:
            frames.append((m.group(1), m.group(2), m.group(3)))
        return True

    def _message_goes_on(self, key: object, msg: str) -> bool:
        """A line under an exception header printed without its traceback (`ImportError:`
        alone, the reason below it): part of the message, up to a blank line."""
        assert self._unfinished is not None
        at, cand = self._unfinished
        text = msg.strip()
        if at != key or not text or msg.endswith(_TB_START) or text.startswith('File "'):
            self._unfinished = None
            return False
        cand.more.append(text)
        if len(cand.more) >= _MESSAGE_MORE_MAX:
            self._unfinished = None
        return True

    def in_traceback(self) -> bool:
        """A traceback is being assembled: its next lines must all be fed."""
        return bool(self._open)

    def first_failure_after(self, offset: int) -> int:
        """Where the first sign of a failure after `offset` began (-1: none)."""
        at = [o for o in self._failure_offsets if o > offset]
        at += [t.offset for t in self._open.values() if t.state == _IN_FRAMES and t.frames
               and t.offset > offset and t.level != "WARNING"
               and not t.of_a_request(self.ready_at)]
        return min(at, default=-1)

    def _failed_at(self, offset: int) -> None:
        if len(self._failure_offsets) < 4 * _MAX_CANDIDATES:
            self._failure_offsets.append(offset)

    def last_failure_offset(self) -> int:
        """Where the last sign of a failure began: an exception, a traceback cut before its
        exception line, or one still open without it (the log may end there)."""
        open_at = max((t.offset for t in self._open.values()
                       if t.state == _IN_FRAMES and t.frames and t.level != "WARNING"
                       and not t.of_a_request(self.ready_at)), default=-1)
        return max(self.last_exception_offset, self.last_cut_offset, open_at)

    # -- tracebacks -------------------------------------------------------------------------

    def _start(self, key: object, line: LogLine, msg: str) -> _Trace:
        proc = line.proc
        if proc is None and self._process_header is not None:
            proc, self._process_header = self._process_header, None
        trace = self._open[key] = _Trace(proc, line.pid, msg, line.offset, line.level)
        head = msg[:-len(_TB_START)].removesuffix("Traceback").rstrip(" ,:")
        preface = self._preface.pop(key, None)
        if preface is not None and _REQUEST_HEADER_RE.search(preface.message) is not None:
            trace.request = True  # uvicorn's header names no reason: the traceback does
            return trace
        if head and (_ERROR_EXCEPTION_RE.search(head) is not None
                     or states_cause(head, "ERROR")):
            # `Exception in worker X while processing method Y: <why>, Traceback (...)`
            trace.preface = self._candidate(line, head.strip(), [msg], weak=True)
        elif preface is not None and preface.offset < line.offset:
            # the record logged just before (V0: `logger.exception(e)` logs str(e) first)
            trace.preface = self._candidate(preface, preface.message.strip(),
                                            [preface.message], weak=True)
        return trace

    def _cut(self, trace: _Trace) -> None:
        if trace.of_a_request(self.ready_at):
            self._request_failed(f"a traceback cut before its exception line, in "
                                 f"{_Cut(trace).deepest()}", trace)
            trace.frames = []
            return
        if len(self._cuts) < _MAX_CANDIDATES:
            self._cuts.append(_Cut(trace))
            if trace.level != "WARNING":
                self.last_cut_offset = trace.offset
                self._failed_at(trace.offset)
        trace.frames = []  # reported once

    def _continue(self, trace: _Trace, line: LogLine, msg: str, key: object) -> bool:
        """Absorb `line` into the open traceback; False when the traceback has ended."""
        if trace.state == _IN_FRAMES:
            stripped = msg.lstrip()
            if stripped.startswith('File "'):
                m = _FRAME_RE.match(msg)
                if m is not None:
                    trace.lines.append(msg)
                    trace.frames.append((m.group(1), m.group(2), m.group(3) or ""))
                    trace.after_frame = True
                    trace.dedented = trace.dedented or not msg[:1].isspace()
                    return True
            if not msg or msg[0] == " ":
                trace.lines.append(msg)
                trace.after_frame = False
                return True
            exception = (_NAMED_EXCEPTION_RE if trace.dedented else _EXCEPTION_RE).match(msg)
            if exception is not None:
                trace.lines.append(msg)
                trace.state = _AFTER_EXCEPTION
                self._exception(trace, line, msg)
                return True
            if trace.dedented and trace.after_frame:  # the frame's source, unindented
                trace.lines.append(msg)
                trace.after_frame = False
                return True
        else:
            if not msg or msg[0] == " ":
                trace.lines.append(msg)
                self._more(trace, msg)
                return True
            if msg.startswith(_CHAINING):
                trace.lines.append(msg)
                trace.chained = True
                return True
            if msg.endswith(_TB_START) and trace.chained:
                # the next exception of the chain: the first one stays its cause
                trace.lines.append(msg)
                trace.state = _IN_FRAMES
                trace.frames = []
                trace.chained = False
                return True
            # a traceback with no chaining sentence above it is another exception's own
        del self._open[key]
        return False

    def _more(self, trace: _Trace, msg: str) -> None:
        """A line under the exception line: the rest of a message that spans lines."""
        cand = trace.candidate
        text = msg.strip()
        if (cand is None or not cand.wants_more or len(cand.more) >= _MESSAGE_MORE_MAX
                or not text or text.startswith((_PYDANTIC_LINK, 'File "'))):
            return
        cand.more.append(_PYDANTIC_TAIL_RE.sub("", text))

    def _exception(self, trace: _Trace, line: LogLine, msg: str) -> None:
        if self._symptom(line, msg):
            if trace.preface is not None:  # "X failed." over a symptom: a symptom too
                trace.preface.dropped = True
            return
        if trace.candidate is not None:
            return
        if _CONSEQUENCE_RE.match(msg) is not None:
            return
        text = msg.strip()
        if trace.of_a_request(self.ready_at) and not _engine_failure(text):
            self._request_failed(text, trace)
            trace.candidate = _Candidate(text, trace.proc, trace.pid, line.offset, trace.lines,
                                         line.level)  # its message's lines, never a cause
            return
        name = text.split(":", 1)[0]
        if (name.endswith(_SYNTAX_ERRORS) and trace.frames
                and _HAS_LOCATION_RE.search(text) is None):
            path, number, _ = trace.frames[-1]
            text = f"{text} ({path}, line {number})"
        trace.candidate = self._candidate(line, text, trace.lines, trace.proc, trace.pid,
                                          evidence=trace.level != "WARNING")
        if trace.candidate is not None:
            trace.candidate.traceback_end = True

    def _request_failed(self, text: str, trace: _Trace) -> None:
        preface = trace.preface
        if preface is not None and not preface.dropped:
            # the handler's own words for that request's failure: no cause, no evidence
            preface.dropped = True
            if preface.offset in self._evidence:
                self._evidence.remove(preface.offset)
                if preface.offset in self._failure_offsets:
                    self._failure_offsets.remove(preface.offset)
                self.last_exception_offset = self._evidence[-1] if self._evidence else -1
        self.requests_failed += 1
        if self.first_request_failure is None:
            self.first_request_failure = text

    # -- candidates and symptoms ------------------------------------------------------------

    def _candidate(self, line: LogLine, text: str, trace: list[str], proc: str | None = None,
                   pid: int | None = None, *, weak: bool = False,
                   evidence: bool = True) -> _Candidate | None:
        """`weak`: the cause only when no real exception is known (a wrapper's words, a
        library's stderr). `evidence`: it shows a crash by itself (not a WARNING's)."""
        if len(self._candidates) >= _MAX_CANDIDATES or (
                self._noise is not None and self._noise.match(line) is not None):
            return None
        cand = _Candidate(text, proc if proc is not None else line.proc,
                          pid if pid is not None else line.pid, line.offset, trace, line.level)
        cand.weak = weak
        self._candidates.append(cand)
        if evidence:
            self.last_exception_offset = line.offset
            self._failed_at(line.offset)
            self._evidence.append(line.offset)
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
        if self._reported is None and ("code" in msg or "core proc" in msg):
            m = _REPORTED_DEATH_RE.search(msg)
            if m is not None:
                code = int(m["wcode"] or m["ccode"] or m["pcode"])
                self._reported = (m["worker"] or m["core"] or m["proc"], signal_of(code),
                                  line.offset)
        self._symptoms[msg.strip()] = None
        self.last_symptom_offset = line.offset
        self._failed_at(line.offset)
        return True
