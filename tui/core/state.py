"""The launch state machine: agent facts in, domain events out.

PENDING → PREFLIGHT → STARTING → LOADING(phase, progress) → READY; from any live state DEAD(cause),
STALLED (nothing in the log and no GPU memory change for longer than the profile allows) and
KILLING → STOPPED. After READY quiet is what an idle server is too: a stall there needs work
that was in flight and stopped (see LaunchMachine._stalled_serving). Not READY within the
ready limit (the profile's ready_timeout), the launch is given up on once (ReadyTimedOut); its
state stays what it was, what follows is the supervisor's.
The death of ANY server process is a death, whatever the top process's exit code: a real vLLM
exits 0 after its engine core was killed.
"""

from __future__ import annotations

import ast
import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tui.core.acceptance import SpecDecodeInterval, parse_interval
from tui.core.diagnosis import Diagnosis, Explanation
from tui.core.logchunk import ChunkReader, LineChunk
from tui.core.logtime import LogClock
from tui.core.noise import NoiseFilter
from tui.core.phases import Phase, PhaseHit
from tui.core.procnames import (
    ROLE_BY_COMMAND,
    SGLANG_TITLE,
    is_helper,
    is_server_role,
    is_shell,
    top_name,
)
from tui.core.protocol import Gpus, Health, ProcExit, ProcInfo, Procs, RunExit
from tui.core.rootcause import RootCause
from tui.core.serving import ServingReadout, ServingSample
from tui.core.stall import ProcWatch, Suspect
from tui.core.timeline import Timeline


class State(enum.Enum):
    PENDING = "pending"
    PREFLIGHT = "preflight"
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    DEAD = "dead"
    STALLED = "stalled"
    KILLING = "killing"
    STOPPED = "stopped"

    @property
    def live(self) -> bool:
        return self in _LIVE


_LIVE = {State.PREFLIGHT, State.STARTING, State.LOADING, State.READY, State.STALLED}

# How vLLM reports a child's exit code: the only record of it once the parent has reaped it.
_REPORTED_EXIT = re.compile(
    r"(?:Worker proc (?P<worker>\S+) died unexpectedly \(exit code: (?P<wcode>-?\d+)\)"
    r"|Failed core proc\(s\): \{'(?P<core>[^']+)': (?P<ccode>-?\d+)\})")


def _status(code: int | None, signal: int | None) -> tuple[int | None, int | None]:
    """(code, signal): vLLM reports a child killed by signal N as exit code -N, as Python's
    multiprocessing does; it is a signal, said as one."""
    if signal is None and code is not None and code < 0:
        return None, -code
    return code, signal


# Processes that exit this close to the run's death died with it (one wakeup of the agent).
TOGETHER_S = 0.25
# A parent's report that a command it ran failed (Python's CalledProcessError): vLLM's model
# inspection subprocess is reaped by the API server before the agent can read its code.
_REPORTED_COMMAND = re.compile(r"Command '(\[.*?\])' returned non-zero exit status (-?\d+)")
# Exits of unknown code kept until the log reports them (a few: inspection children are rare)
_PENDING_MAX = 16
# A line stamped this much before it was read is history (a replay on attach), not live.
LATE_LINE_S = 2.0


@dataclass(frozen=True, slots=True)
class StateChanged:
    state: State
    previous: State
    at: float


@dataclass(frozen=True, slots=True)
class PhaseChanged:
    phase: Phase
    at: float
    since_launch: float
    detail: str | None = None  # the queue's: the scheduler's reason and expected start


@dataclass(frozen=True, slots=True)
class ProgressChanged:
    phase: Phase
    progress: float | None
    shards: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class LinesAdded:
    """A chunk of the log, classified (tui.core.logchunk): one event for many lines."""

    chunk: LineChunk


@dataclass(frozen=True, slots=True)
class Death:
    """Who died first, how, when, in which phase, and the best root cause known so far."""

    pid: int
    process: str
    code: int | None
    signal: int | None
    at: float
    since_launch: float
    phase: Phase | None
    cause: RootCause | None
    cpid: int | None = None  # its pid inside the container, as the log names it
    oom_killed: bool = False  # the container's memory limit killed it (the runtime says)
    # the ranking's second candidate when it was not sure (tui.core.diagnosis.runner_up): the
    # console marks it beside the cause; the banner and `wait` name one cause
    runner_up: RootCause | None = None
    # the scheduler ended the run's job (a Slurm time limit, scancel, a preemption), in words:
    # what died then is its doing, never a crash (tui.core.slurm.SchedulerEnd.words)
    ended_by: str | None = None

    def summary(self) -> str:
        how = ("was ended by the scheduler" if self.ended_by is not None
               else "was killed by the container's memory limit (OOMKilled)" if self.oom_killed
               else f"died, signal {self.signal}" if self.signal is not None
               else f"died, exit code {self.code}" if self.code is not None
               else "died, exit code unknown")
        pids = (f"pid {self.cpid} in the container" if self.cpid is not None and not self.pid
                else f"pid {self.pid}" + (f", {self.cpid} in the container"
                                          if self.cpid is not None else ""))
        return f"{self.process} ({pids}) {how}, {self.since_launch:.1f}s after launch"


@dataclass(frozen=True, slots=True)
class Died:
    death: Death


@dataclass(frozen=True, slots=True)
class CauseUpdated:
    """Log lines that arrived after the death sharpened the root cause or the exit code."""

    death: Death


@dataclass(frozen=True, slots=True)
class Stalled:
    """`suspects`: what the processes say (tui.core.stall), the likeliest first."""

    quiet_s: float
    frozen_gpus: tuple[int, ...]
    at: float
    suspects: tuple[Suspect, ...] = ()
    # after READY: the work in flight that stopped, in words (None: stalled while starting)
    serving: str | None = None
    # after READY: the log's hang marker after READY (never what the start-up logged)
    cause: RootCause | None = None

    def summary(self) -> str:
        gpus = (f"GPU memory and utilisation frozen on {', '.join(map(str, self.frozen_gpus))}"
                if self.frozen_gpus else "no GPU memory change")
        if self.serving is not None:
            return f"stopped serving: {self.serving}; no progress for {self.quiet_s:.0f}s, {gpus}"
        return f"no log line for {self.quiet_s:.0f}s, {gpus}"


@dataclass(frozen=True, slots=True)
class ReadyLimit:
    """How long a launch may take to READY before it is given up on: the profile's
    `ready_timeout`, counted from the launch, or `wait --timeout` in its place, counted from
    when that wait began following (`name` says which); `kill`: the profile's
    on_ready_timeout = "kill" (the run is killed when given up on, else it keeps running)."""

    seconds: float
    name: str = "ready_timeout"
    from_launch: bool = True
    kill: bool = False


@dataclass(frozen=True, slots=True)
class ReadyTimedOut:
    """The launch was given up on: not READY within its limit (`state`: what it still was)."""

    limit: ReadyLimit
    state: State
    at: float


@dataclass(frozen=True, slots=True)
class Ready:
    at: float
    took: float


@dataclass(frozen=True, slots=True)
class ServingSeen:
    """A new reading of what the serving server does (its /metrics, else its stats line)."""

    sample: ServingSample


@dataclass(frozen=True, slots=True)
class HelperExited:
    """A helper process (not a server role) exited with a failure; shown, not a death."""

    exit: ProcExit


DomainEvent = (StateChanged | PhaseChanged | ProgressChanged | LinesAdded | Died | CauseUpdated
               | Stalled | Ready | HelperExited | ServingSeen | ReadyTimedOut)


@dataclass(slots=True)
class _GpuTrack:
    used: int | None = None
    util: int | None = None
    changed_at: float = 0.0


@dataclass
class LaunchMachine:
    """Feeds on agent events and returns the domain events they cause; owns no I/O."""

    engine: str = "vllm"
    noise: NoiseFilter = field(default_factory=lambda: NoiseFilter([]))
    stall_timeout_s: float = 600.0
    expected_load_s: float | None = None
    ready_limit: ReadyLimit | None = None
    ready_deadline: float | None = None  # when the launch is given up on without READY
    timed_out: ReadyTimedOut | None = None
    state: State = State.PENDING
    launched_at: float | None = None
    timeline: Timeline | None = None
    death: Death | None = None
    procs: dict[int, ProcInfo] = field(default_factory=dict)
    top_pid: int | None = None
    last_line_at: float | None = None
    # vLLM's own names and reported exit codes, from the log: a process that died young or
    # was reaped by its parent is known to the agent only by a provisional name and no code
    log_names: dict[int, str] = field(default_factory=dict)
    # the names a process was logged under before its latest (vLLM's CPU worker logs first as
    # VllmWorker-0, then as Worker; its parent reports its death by the first)
    former_names: dict[int, list[str]] = field(default_factory=dict)
    # a containerised run: each host pid's pid inside the container, which the log prints
    container_pids: dict[int, int] = field(default_factory=dict)
    log_clock: LogClock | None = None
    engine_version: str | None = None  # from the banner, for the launch history
    ready_log_at: float | None = None  # when the log said "Application startup complete"
    _replayed_at: float | None = None  # the stamp of the last late line, while replaying
    reported_codes: dict[str, int] = field(default_factory=dict)
    # processes that ended with an unknown code, until the log says how (see _REPORTED_COMMAND)
    pending_exits: dict[int, ProcExit] = field(default_factory=dict)
    # server processes that died with the run's death (see _vllms_account): name -> pid
    died_with: dict[str, int] = field(default_factory=dict)
    # the latest `SpecDecoding metrics:` interval (acceptance while serving)
    spec_decode: SpecDecodeInterval | None = None
    serving: ServingReadout = field(default_factory=ServingReadout)
    health_paths: tuple[str, ...] = ("/health", "/v1/models")
    # each live process's state and since when it is held (stopped, D): the stall's suspects
    procwatch: ProcWatch = field(default_factory=ProcWatch)
    _health_ok: set[str] = field(default_factory=set)
    _health_heard: set[str] = field(default_factory=set)  # paths that answered (ok or not)
    _furthest: Phase | None = None  # the furthest phase a line of the log named
    _gpus: dict[int, _GpuTrack] = field(default_factory=dict)
    ready_at: float | None = None  # when the launch went READY (the health answered)
    _served_at: float | None = None  # the last serving sample with tokens moving
    _health_down: Health | None = None  # after READY: the first probe that failed, while any fails
    _health_down_since: float | None = None

    def __post_init__(self) -> None:
        # the log's own verdict, the same reader `explain` uses (live parity)
        self.diagnosis = Diagnosis(self.engine, self.noise)
        self.tracker = self.diagnosis.tracker
        self.reader = ChunkReader(self.engine, self.noise)

    def verdict(self) -> Explanation:
        """What the log alone says so far: outcome, furthest phase, root cause."""
        return self.diagnosis.verdict()

    # -- transitions driven by the supervisor ------------------------------------------------

    def _to(self, state: State, at: float) -> list[DomainEvent]:
        if state is self.state:
            return []
        previous, self.state = self.state, state
        return [StateChanged(state, previous, at)]

    def preflight(self, at: float) -> list[DomainEvent]:
        return self._to(State.PREFLIGHT, at)

    def queued(self, detail: str, at: float) -> list[DomainEvent]:
        """A Slurm job waits in the scheduler's queue (`detail`: its reason and expected start):
        the timeline's first phase, before the launch; the state stays what it was (never
        STARTING: nothing can stall, nothing is loading), and the queue is never part of the
        load's time. A PhaseChanged at the start and at each change of what it says."""
        if self.timeline is None:
            self.timeline = Timeline(at, self.expected_load_s)
        if not self.timeline.queue(detail, at):
            return []
        return [PhaseChanged(Phase.QUEUED, at, 0.0, detail)]

    def allocated(self, detail: str, at: float) -> None:
        """The queue is over (`detail`: where the job runs); the load counts from `started`."""
        if self.timeline is not None:
            self.timeline.allocated(detail, at)

    def started(self, top_pid: int, launched_at: float, at: float) -> list[DomainEvent]:
        """The launcher started (or we attached to) the run whose top process is `top_pid`."""
        self.top_pid = top_pid
        self.launched_at = launched_at
        self.last_line_at = at
        queue = [s for s in self.timeline.spans if s.phase is Phase.QUEUED] \
            if self.timeline is not None else []
        self.timeline = Timeline(launched_at, self.expected_load_s, queue)
        limit = self.ready_limit
        if limit is not None:
            self.ready_deadline = (launched_at if limit.from_launch else at) + limit.seconds
        self.log_clock = LogClock(launched_at)
        return self._to(State.STARTING, at)

    def killing(self, at: float) -> list[DomainEvent]:
        return self._to(State.KILLING, at) if self.state is not State.STOPPED else []

    def stopped(self, at: float) -> list[DomainEvent]:
        if self.timeline is not None and self.timeline.finished_at is None:
            self.timeline.finish(at, failed=False)
        return self._to(State.STOPPED, at)

    # -- facts from the agent ----------------------------------------------------------------

    def feed_lines(self, lines: Iterable[tuple[int, str]], at: float) -> list[DomainEvent]:
        """Classify a chunk of (byte offset, raw line): noise, phase, root cause. Only the lines
        the reader finds worth it are decoded (tui.core.logchunk); the chunk is one event."""
        pairs = lines if isinstance(lines, list) else list(lines)
        read = self.reader.read(pairs, self.tracker.in_traceback())
        events: list[DomainEvent] = [LinesAdded(read.chunk)]
        cause_before = self.diagnosis.cause() if self.death is not None else None
        names = self.log_names
        # The diagnosis reads the whole chunk at once (cheaper than line by line), which is the
        # same unless a death is decided mid-chunk: only a pending exit (see
        # _reported_command_failure) can do that, and then it goes line by line.
        per_line = bool(self.pending_exits)
        hits = [None] * len(read.lines) if per_line else self.diagnosis.feed(read.lines, read.rules)
        for i, line in enumerate(read.lines):
            msg = line.message
            if line.pid is not None and line.proc and names.get(line.pid) != line.proc:
                if line.pid in names:
                    self.former_names.setdefault(line.pid, []).append(names[line.pid])
                names[line.pid] = line.proc
            if "exit code" in msg or "core proc" in msg:
                self._note_reported_code(msg)
            hit = hits[i]
            if per_line:
                hit = self.diagnosis.feed([line], [read.rules[i]])[0]
                if self.pending_exits and "non-zero exit status" in msg:
                    events.extend(self._reported_command_failure(msg, at))
            if hit is not None:
                if self._furthest is None or hit.phase > self._furthest:
                    self._furthest = hit.phase  # the console never folds this line away
                    read.chunk.phase_starts.add(read.indices[i])
                if hit.phase is Phase.SERVING:
                    if "SpecDecoding" in msg or "accept" in msg:
                        self.spec_decode = parse_interval(msg) or self.spec_decode
                    if (sample := self.serving.feed_log(msg, at)) is not None:
                        events.extend(self._served(sample, at))
                    if self._serving_known(hit):
                        continue  # serving goes on: nothing new for the timeline
                events.extend(self._on_phase(hit, self._written_at(line.raw, at)))
        progressed = len(read.chunk) > read.heartbeats
        if progressed:
            self.last_line_at = at
            if self.state is State.STALLED:
                events.extend(self._unstalled(at))
        if self.death is not None:
            death = self.death
            logged = self.container_pids.get(death.pid, death.pid)
            if names.get(logged, death.process) != death.process:  # the log names it now
                death = replace(death, process=names[logged])
            death = self._vllms_account(death)
            cause = self.diagnosis.cause()
            if cause is not None and cause != cause_before:
                death = replace(death, cause=cause, runner_up=self.diagnosis.runner_up(cause))
            if death != self.death:
                self.death = death
                events.append(CauseUpdated(death))
        return events

    def _vllms_account(self, death: Death) -> Death:
        """The death with the exit code vLLM's log reports, when the agent could not read it
        (the parent reaped the process first). Workers that die of one broken import die
        together, and the agent may see them in another order than their parent did: when the
        log names another process that died with this one, vLLM's account (which died, with
        what code) stands for it."""
        if death.code is not None or death.signal is not None:
            return death
        if death.process not in self.reported_codes:
            former = self.former_names.get(self.container_pids.get(death.pid, death.pid), ())
            alias = next((n for n in former if n in self.reported_codes), None)
            if alias is not None:  # the same process, reported under its earlier name
                code, sig = _status(self.reported_codes[alias], None)
                return replace(death, code=code, signal=sig)
            name = next((n for n in self.reported_codes if n in self.died_with), None)
            if name is None:
                return death
            death = replace(death, pid=self.died_with[name], process=name)
        code, sig = _status(self.reported_codes[death.process], None)
        return replace(death, code=code, signal=sig)

    def reported_status(self, process: str) -> tuple[int | None, int | None] | None:
        """How this log says `process` ended ((code, signal), vLLM's `Worker proc X died
        unexpectedly (exit code: -9)`), or None: a member on another host lends its account to
        a death whose status its agent could not read (supervise.group)."""
        code = self.reported_codes.get(process)
        return None if code is None else _status(code, None)

    def _note_reported_code(self, message: str) -> None:
        m = _REPORTED_EXIT.search(message)
        if m is not None:
            self.reported_codes.setdefault(m["worker"] or m["core"], int(m["wcode"] or m["ccode"]))

    def _reported_command_failure(self, message: str, at: float) -> list[DomainEvent]:
        """A process that ended with an unknown code turns out, by its parent's log, to have
        failed: it is the death it was, at the time it ended."""
        m = _REPORTED_COMMAND.search(message)
        if m is None:
            return []
        try:
            argv = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError):
            return []
        command = " ".join(map(str, argv))
        for pid, ex in self.pending_exits.items():
            proc = self.procs.get(pid)
            if proc is not None and proc.cmd and command.startswith(proc.cmd):
                del self.pending_exits[pid]
                return self.feed_exit(replace(ex, code=int(m.group(2))), at)
        return []

    def _written_at(self, raw: str, at: float) -> float:
        """A line read late (attaching to a running server replays its log) counts from when
        it was written, so the timeline's durations are right; a live line, from now. Lines
        without a stamp (tqdm bars, uvicorn) take the time of the stamped line before them."""
        written = self.log_clock.time_of(raw) if self.log_clock is not None else None
        if written is None:
            written = self._replayed_at
        elif written > at - LATE_LINE_S:
            self._replayed_at = None
            return at
        else:
            self._replayed_at = written
        if written is None or self.launched_at is None:
            return at
        return max(written, self.launched_at)

    def _serving_known(self, hit: PhaseHit) -> bool:
        """The timeline is already in SERVING (or past the phases): a serving line moves
        nothing, so its time need not be read."""
        timeline = self.timeline
        current = timeline.current if timeline is not None else None
        return (hit.version is None and self.state.live and current is not None
                and current.phase is Phase.SERVING) or self.state is State.READY

    def _on_phase(self, hit: PhaseHit, at: float) -> list[DomainEvent]:
        events: list[DomainEvent] = []
        if hit.version is not None and self.engine_version is None:
            self.engine_version = hit.version
        if hit.phase is Phase.READY_LOG:
            self.ready_log_at = at
        if self.timeline is None or not self.state.live or self.state is State.READY:
            return events
        if self.timeline.enter(hit.phase, at):
            events.append(PhaseChanged(hit.phase, at, at - self.timeline.launched_at))
            if self.state in (State.STARTING, State.PREFLIGHT):
                events.extend(self._to(State.LOADING, at))
        cur = self.timeline.current
        if cur is not None and cur.phase is hit.phase and (hit.progress is not None
                                                          or hit.shards is not None):
            self.timeline.progress(hit.progress, hit.shards)
            events.append(ProgressChanged(hit.phase, cur.progress, cur.shards))
        return events

    def feed_procs(self, snap: Procs, at: float | None = None) -> list[DomainEvent]:
        for proc in snap.procs:
            self.procs[proc.pid] = proc
            if proc.cpid is not None:
                self.container_pids[proc.pid] = proc.cpid
        self.procwatch.feed(snap, snap.time if at is None else at)
        return []

    def name_of(self, pid: int, fallback: str) -> str:
        """The engine's name for a process: from the log's prefixes, else from its command line
        (vLLM's model-inspection child logs nothing of its own, SGLang's processes carry their
        title), else the kernel's."""
        name = self.log_names.get(self.container_pids.get(pid, pid))
        if name is not None:
            return name
        proc = self.procs.get(pid)
        if proc is not None:
            if proc.cmd.startswith(SGLANG_TITLE):
                return proc.cmd[len(SGLANG_TITLE):].split(" ", 1)[0] or fallback
            for needle, role in ROLE_BY_COMMAND:
                if needle in proc.cmd:
                    return role
        return fallback

    def names(self) -> dict[int, str]:
        """Every known pid's name (see name_of), for the console's process tree."""
        return {pid: self.name_of(pid, proc.name) for pid, proc in self.procs.items()}

    def feed_metrics(self, text: str, at: float) -> list[DomainEvent]:
        """A scrape of the server's /metrics (the serving figures' first source)."""
        sample = self.serving.feed_metrics(text, at)
        return [] if sample is None else self._served(sample, at)

    def _served(self, sample: ServingSample, at: float) -> list[DomainEvent]:
        """A serving sample; tokens moving are progress (a stall after READY ends)."""
        events: list[DomainEvent] = [ServingSeen(sample)]
        if (sample.gen_tps or 0) > 0 or (sample.prompt_tps or 0) > 0:
            self._served_at = at
            if self.state is State.STALLED:
                events.extend(self._unstalled(at))
        return events

    def _unstalled(self, at: float) -> list[DomainEvent]:
        """Progress after a stall: back to what it was doing (serving, or loading)."""
        return self._to(State.READY if self.ready_at is not None else State.LOADING, at)

    def ended_as(self, ex: ProcExit) -> ProcExit:
        """An ended process as the run tells it: the engine's name (see name_of), and the code
        its parent reported when the agent could not read one. One forked under its parent's
        title that ended before it was seen as itself, with no line of its own, is a child of
        that process (a compiler a worker ran), not the process itself."""
        if ex.cpid is not None:
            self.container_pids[ex.pid] = ex.cpid
        if ex.forked and self.container_pids.get(ex.pid, ex.pid) not in self.log_names:
            name = f"child of {ex.name}"
        else:
            name = self.name_of(ex.pid, ex.name)
        code, sig = _status(ex.code, ex.signal) if ex.code is not None or ex.signal is not None \
            else _status(self.reported_codes.get(name), None)
        return replace(ex, name=name, code=code, signal=sig)

    def feed_exit(self, ex: ProcExit, at: float) -> list[DomainEvent]:
        """A process of the run ended. The first server-process death is the run's death."""
        self.procwatch.ended(ex.pid)
        ex = self.ended_as(ex)
        if self.death is not None and abs(ex.time - self.death.at) <= TOGETHER_S \
                and is_server_role(ex.name) and len(self.died_with) < _PENDING_MAX:
            self.died_with[ex.name] = ex.pid
            death = self._vllms_account(self.death)
            if death != self.death:
                self.death = death
                return [CauseUpdated(death)]
        if not self.state.live or self.death is not None:
            return []
        failed = (ex.code not in (0, None)) or ex.signal is not None
        server = ex.top or ex.pid == self.top_pid or is_server_role(ex.name)
        # any other process that failed is a death too; one that ended cleanly (or was reaped
        # before its code could be read, like vLLM's model-inspection subprocess) is not, nor
        # a helper, nor a command a shell ran (a script's `readlink` or `grep` fails as part
        # of its logic: the script's own end says whether it failed)
        helper = is_helper(ex.name) or (ex.parent is not None and is_shell(ex.parent))
        if not server and (not failed or helper):
            if ex.code is None and ex.signal is None and not helper:
                if len(self.pending_exits) >= _PENDING_MAX:
                    self.pending_exits.pop(next(iter(self.pending_exits)))
                self.pending_exits[ex.pid] = ex
            return [HelperExited(ex)] if failed else []
        cpid = self.container_pids.get(ex.pid)
        self.tracker.note_death(ex.pid if cpid is None else cpid, ex.name, ex.signal)
        launched = self.launched_at if self.launched_at is not None else ex.time
        phase = (Phase.SERVING if self.state is State.READY
                 else self.timeline.current.phase if self.timeline and self.timeline.current
                 else None)
        cause = self.diagnosis.cause()
        self.death = Death(ex.pid, ex.name, ex.code, ex.signal, ex.time,
                           max(0.0, ex.time - launched), phase, cause, cpid,
                           runner_up=self.diagnosis.runner_up(cause))
        if self.timeline is not None:
            self.timeline.finish(at, failed=True)
        return [*self._to(State.DEAD, at), Died(self.death)]

    def feed_run_exit(self, ex: RunExit, at: float) -> list[DomainEvent]:
        """exit.json appeared: the top process is gone (a death unless we were killing it)."""
        if self.state is State.KILLING:
            return self.stopped(at)
        events = self._run_exit_death(ex, at)
        if ex.oom_killed and self.death is not None and not self.death.oom_killed:
            # the runtime's word on the container's end says more than any signal number
            self.death = replace(self.death, oom_killed=True)
            died = [e for e in events if isinstance(e, Died)]
            events = ([e if not isinstance(e, Died) else Died(self.death) for e in events]
                      if died else [*events, CauseUpdated(self.death)])
        return events

    def _run_exit_death(self, ex: RunExit, at: float) -> list[DomainEvent]:
        if self.death is None and self.reported_codes:
            # no exit event seen (attached after the fact): the log says who died first
            first = next(iter(self.reported_codes))
            logged = next((p for p, n in self.log_names.items() if n == first), 0)
            host = {c: h for h, c in self.container_pids.items()}
            if ex.container is not None and logged not in host:  # gone before we looked
                return self.feed_exit(ProcExit(0, first, self.reported_codes[first], None,
                                               ex.time, False, logged), at)
            return self.feed_exit(ProcExit(host.get(logged, logged), first,
                                           self.reported_codes[first], None, ex.time, False),
                                  at)
        pid = ex.pid if ex.pid is not None else (self.top_pid or 0)
        name = self.procs[pid].name if pid in self.procs else top_name(self.engine)
        return self.feed_exit(ProcExit(pid, name, ex.code, ex.signal, ex.time, True), at)

    def ended_by_scheduler(self, words: str, at: float) -> list[DomainEvent]:
        """The scheduler says it ended the run's job (`words`): the death seen is its doing, or,
        when the agent saw none (its link went with the job), the top process's death is told
        as the scheduler's. Nothing while killing or stopped: that end was ours."""
        if self.state in (State.KILLING, State.STOPPED, State.PENDING):
            return []
        if self.death is not None:
            if self.death.ended_by == words:
                return []
            self.death = replace(self.death, ended_by=words)
            return [CauseUpdated(self.death)]
        events = self._run_exit_death(RunExit(self.top_pid, None, None, at), at)
        if self.death is None:
            return events
        self.death = replace(self.death, ended_by=words)
        return [Died(self.death) if isinstance(e, Died) else e for e in events]

    def feed_health(self, health: Health, at: float) -> list[DomainEvent]:
        """READY only when every health path (/health, then /v1/models) answers from the
        GPU host; a log line alone is not enough."""
        self._health_heard.add(health.path)
        if health.ok:
            self._health_ok.add(health.path)
        else:
            self._health_ok.discard(health.path)
        if self.ready_at is not None:
            return self._health_after_ready(health, at)
        if (not self._health_ok.issuperset(self.health_paths)
                or self.state not in (State.STARTING, State.LOADING, State.STALLED)):
            return []
        launched = self.launched_at if self.launched_at is not None else at
        # attached to a server that was ready long ago: it was ready when its log said so
        ready = self.ready_log_at if self.ready_log_at is not None \
            and self.ready_log_at < at - LATE_LINE_S else at
        if self.timeline is not None:
            self.timeline.enter(Phase.READY_LOG, ready)
            self.timeline.finish(ready)
        self.ready_at = at
        return [*self._to(State.READY, at), Ready(ready, ready - launched)]

    def _health_after_ready(self, health: Health, at: float) -> list[DomainEvent]:
        """Once READY, a probe that fails (no answer, or an error) is held with since when: a
        stall's evidence if it lasts (see _stalled_serving); every path answering again ends
        it, and a stall with it. READY is never said twice."""
        if self._health_ok.issuperset(self.health_paths):
            self._health_down = self._health_down_since = None
            return self._unstalled(at) if self.state is State.STALLED else []
        if not health.ok and self._health_down is None:  # the first probe that failed
            self._health_down, self._health_down_since = health, at
        return []

    def feed_gpus(self, snap: Gpus, at: float) -> list[DomainEvent]:
        for gpu in snap.gpus:
            track = self._gpus.setdefault(gpu.index, _GpuTrack(changed_at=at))
            if gpu.mem_used != track.used or gpu.util != track.util:
                track.used, track.util, track.changed_at = gpu.mem_used, gpu.util, at
        return []

    def frozen_gpus(self, at: float, window: float) -> tuple[int, ...]:
        """GPUs whose memory and utilisation have not changed for `window` seconds."""
        return tuple(i for i, t in sorted(self._gpus.items()) if at - t.changed_at >= window)

    def tick(self, at: float) -> list[DomainEvent]:
        """Time passes: past the ready limit without READY, the launch is given up on; a quiet
        log and frozen GPU memory for too long is a stall."""
        return [*self._overdue(at), *self._stalled(at)]

    def _overdue(self, at: float) -> list[DomainEvent]:
        """Given up on, once, when the ready limit passed without READY. Judged only after
        every health path has answered since watching began: a server attached to long after
        its launch may be READY, and must not be taken for a late one (nor killed for it)."""
        limit, deadline = self.ready_limit, self.ready_deadline
        if (limit is None or deadline is None or self.timed_out is not None or at < deadline
                or self.ready_at is not None
                or self.state not in (State.STARTING, State.LOADING, State.STALLED)
                or not self._health_heard.issuperset(self.health_paths)):
            return []
        self.timed_out = ReadyTimedOut(limit, self.state, at)
        return [self.timed_out]

    def _stalled(self, at: float) -> list[DomainEvent]:
        if self.state is State.READY:
            return self._stalled_serving(at)
        if self.state not in (State.STARTING, State.LOADING) or self.last_line_at is None:
            return []
        current = self.timeline.current if self.timeline is not None else None
        if current is not None and current.phase is Phase.PULLING:
            return []  # docker prints a line per layer: a large layer is minutes of quiet
        quiet = at - self.last_line_at
        if quiet < self.stall_timeout_s:
            return []
        frozen = self.frozen_gpus(at, self.stall_timeout_s)
        if self._gpus and len(frozen) < len(self._gpus):
            return []  # memory still moving somewhere: loading, just quietly
        return [*self._to(State.STALLED, at),
                Stalled(quiet, frozen, at, self.procwatch.suspects(at, self.names()))]



    def _stalled_serving(self, at: float) -> list[DomainEvent]:
        """A stall after READY. An idle server is quiet too, its GPUs frozen: quiet alone is
        no stall. It takes no progress (no log line but the hang's heartbeat, no tokens
        moving, GPU memory and utilisation frozen) for the stall timeout AND evidence that
        work was in flight and stopped: the log's hang marker after READY, the health probe
        failing that long while the processes live, or requests running. What the launch
        logged before READY is never its explanation."""
        if self.last_line_at is None:
            return []
        quiet = at - max(self.last_line_at, self._served_at or self.last_line_at)
        if quiet < self.stall_timeout_s:
            return []
        frozen = self.frozen_gpus(at, self.stall_timeout_s)
        if self._gpus and len(frozen) < len(self._gpus):
            return []  # a GPU still moves: working, quietly
        cause, serving = self._in_flight(at)
        if serving is None:
            return []  # idle: nothing was asked of it
        return [*self._to(State.STALLED, at),
                Stalled(quiet, frozen, at, self.procwatch.suspects(at, self.names()),
                        serving, cause)]

    def _in_flight(self, at: float) -> tuple[RootCause | None, str | None]:
        """(the hang marker, the evidence in words) that work was in flight after READY and
        stopped; (None, None) when nothing shows any."""
        diagnosis = self.diagnosis
        if diagnosis.outcome() == "hung":
            cause = diagnosis.cause("hung")
            if cause is not None:
                return cause, f"the log says it hangs: {cause.line}"
        said: list[str] = []
        down, since = self._health_down, self._health_down_since
        enough = False  # the health failing alone is evidence once it fails the stall timeout
        if down is not None and since is not None:
            how = "no answer" if down.status is None else f"HTTP {down.status}"
            said.append(f"{down.path} failing ({how}) for {at - since:.0f}s while its "
                        "processes live")
            enough = at - since >= self.stall_timeout_s
        latest = self.serving.latest
        if latest is not None and (latest.running or 0) > 0:
            said.append(f"{latest.running:.0f} request{'s' if latest.running != 1 else ''} "
                        "running with no token out")
            enough = True
        return None, "; ".join(said) if enough else None
