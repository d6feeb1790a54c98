"""Headless orchestration: one session, one run, one LaunchMachine, events out.

The Textual app and `specconsole wait` both consume a Supervisor's events; nothing here draws.
It connects, attaches to the profile's live run or runs preflight and launches one, streams the
agent's watch into the machine, reconnects with capped backoff when the link drops (resuming the
log at the last byte offset, so no line is lost or doubled), and kills with escalation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from itertools import accumulate, repeat
from operator import add
from typing import Any

from tui.core.acceptance import parse_totals
from tui.core.attach import attached_words
from tui.core.command import known_secrets, redact, served_by, served_changes, shell_join
from tui.core.describe import disk_words, gpu_verdict
from tui.core.errors import (
    ConnectionLost,
    HostUnreachable,
    PreflightFailed,
    RunNotFound,
    SessionError,
    SpecconsoleError,
)
from tui.core.logchunk import LineChunk
from tui.core.logline import strip_escapes
from tui.core.logwindow import Entry, entries
from tui.core.noise import NoiseFilter, builtin_rules, rule_from_pattern
from tui.core.phases import Phase
from tui.core.profile import Profile
from tui.core.protocol import (
    AgentFault,
    Check,
    DiskSpace,
    GpuHolder,
    Gpus,
    Health,
    Hello,
    HttpReply,
    Killed,
    KillStep,
    Leftover,
    LogChunk,
    LogSkipped,
    Metrics,
    ProcExit,
    Procs,
    RunExit,
    RunRecord,
    Secrets,
    Served,
    leftover_words,
)
from tui.core.stacks import process_stacks
from tui.core.state import (
    CauseUpdated,
    Died,
    LaunchMachine,
    Ready,
    ReadyLimit,
    ReadyTimedOut,
    Stalled,
    State,
    StateChanged,
)
from tui.core.units import duration
from tui.remote import launcher
from tui.remote import slurm as remote_slurm
from tui.remote.agent_link import stream_agent
from tui.remote.interface import Session
from tui.remote.session import check_python, open_session
from tui.supervise.events import (
    AgentHello,
    Fatal,
    GpusSeen,
    HistoryLoaded,
    JobEnded,
    JobEnding,
    KillDone,
    KillProgress,
    LinkLost,
    LinkRestored,
    Notice,
    PreflightDone,
    ProcEnded,
    ProcsSeen,
    RunInfo,
    RunStarted,
    SmokeDone,
    SpecDecodeSeen,
    StacksTaken,
    SupervisorEvent,
)
from tui.supervise.history import History, Launch
from tui.supervise.hooks import hook_env, run_hook
from tui.supervise.slurmjob import JobFollow, JobRun, job_checks

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 10.0
TICK_S = 0.5
# the agent's requests to the server: liveness, still serving the model, the metrics
METRICS_PATH = "/metrics"
# attached to a long log, the agent sends its first and last bytes only (tui/agent/logtail.py):
# the start holds the launch's phases, the end the state now and a death's traceback
SKIM_HEAD = 4 << 20
SKIM_TAIL = 8 << 20
CAUSE_GRACE_S = 0.5  # after a death, how long late log lines may sharpen the cause


SessionOpener = Callable[[Any], Awaitable[Session]]


def noise_for(profile: Profile) -> NoiseFilter:
    """The profile's rules first, then the engine's built-ins."""
    rules = [rule_from_pattern(f"hide:{r.label}", "hide", r.pattern, r.label)
             for r in profile.logs.hide]
    rules += [rule_from_pattern(f"harmless:{r.label}", "harmless", r.pattern, r.label)
              for r in profile.logs.harmless]
    return NoiseFilter([*rules, *builtin_rules(profile.server.engine)])


class Supervisor:
    """Owns a session to the profile's host and the launch state machine of one run."""

    def __init__(self, profile: Profile, *, environ: Mapping[str, str] | None = None,
                 opener: SessionOpener = open_session,
                 clock: Callable[[], float] = time.time,
                 history: History | None = None, serves: bool = True,
                 whole_log: bool = False) -> None:
        self.profile = profile
        # True: every line of the log is streamed (`specconsole logs`); else a long log's
        # middle is skipped on attach and read back by page (read_log) when scrolled to
        self.whole_log = whole_log
        # False: one host's part of a multi-host run (supervise.group): no health, smoke or stall of
        # its own; the server's member answers for the run
        self.serves = serves
        self.hook_allowed: Callable[[str], bool] = lambda event: True  # the group's say
        self.history = history
        self.usual: dict[str, float] = {}
        self._history_failed = False
        self._side: set[asyncio.Task[None]] = set()  # hooks and the smoke request
        self.environ = os.environ if environ is None else environ
        self.opener = opener
        self.clock = clock
        self.session: Session | None = None
        self.run: RunInfo | None = None
        # the launch is given up on past this (the server's member only: it answers for READY)
        self.ready_limit = ready_limit_of(profile) if serves else None
        self.kill_grace = 10.0  # TERM to KILL, for the kills this supervisor decides itself
        # on_ready_timeout = "kill": what kills the run (a multi-host run's coordinator kills
        # every host), and the kill under way, for `wait` to report when it ends
        self.give_up: Callable[[], Awaitable[object]] = lambda: self.kill(self.kill_grace)
        self.giving_up: asyncio.Task[None] | None = None
        self.machine = self.new_machine()
        self.log_end = 0
        self.lost_gpus: set[int] = set()  # devices already said lost (once each)
        self._stall_stacks = False  # stacks were taken for the current stall
        # secret values known here (launch or attach) are redacted from every line and cmdline
        self.secrets = known_secrets(profile, self.environ)
        self.last_checks: tuple[Check, ...] = ()
        self.last_kill_steps: list[KillStep] = []
        self._queues: list[asyncio.Queue[SupervisorEvent]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._python_checked = False
        # a [slurm] profile's run: its job (the session reaches the job's node as a step
        # once allocated; `login` is the login node's own session)
        self.job: JobRun | None = None
        self.login: Session | None = None
        self.ready_at: float | None = None
        self.slurm = JobFollow(self)  # what a job's run does differently

    @property
    def served(self) -> Served:
        """How the current run is reached: as it was launched, else as the profile says."""
        recorded = self.run.served if self.run is not None else None
        return recorded or served_by(self.profile)

    def new_machine(self, engine: str | None = None) -> LaunchMachine:
        """A fresh launch machine for the next run (or a requeued job's next allocation)."""
        exp = self.profile.expect
        return LaunchMachine(engine=engine or self.profile.server.engine,
                             noise=noise_for(self.profile),
                             stall_timeout_s=exp.stall_timeout if self.serves else math.inf,
                             expected_load_s=exp.load_time, ready_limit=self.ready_limit)

    def limit_ready(self, seconds: float, name: str) -> None:
        """`wait --timeout`: give up after `seconds` from when the run is followed, in place
        of the profile's ready_timeout; what giving up does stays the profile's."""
        kill = self.profile.expect.on_ready_timeout == "kill"
        self.ready_limit = ReadyLimit(seconds, name, from_launch=False, kill=kill)
        self.machine.ready_limit = self.ready_limit

    # -- events ------------------------------------------------------------------------------

    def subscribe(self) -> asyncio.Queue[SupervisorEvent]:
        queue: asyncio.Queue[SupervisorEvent] = asyncio.Queue()
        self._queues.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[SupervisorEvent]) -> None:
        with contextlib.suppress(ValueError):
            self._queues.remove(queue)

    def emit(self, events: Sequence[SupervisorEvent]) -> None:
        """Tell the subscribers `events`, then react to them (history, hooks, smoke)."""
        for event in events:
            for queue in self._queues:
                queue.put_nowait(event)
        for event in events:
            self._react(event)

    # -- what follows an event: history, hooks, the smoke request -----------------------------

    def _react(self, event: object) -> None:
        if isinstance(event, Ready):
            self.ready_at = self.clock()
            self.record(outcome="ready", took=event.took)
            self._note_survived()
            self._hook("ready", took=round(event.took, 1),
                       cause=f"ready after {duration(event.took)}")
            if self.profile.smoke.enabled:
                self._spawn(self._smoke())
        elif isinstance(event, (Died, CauseUpdated)):
            death = event.death
            self.record(outcome="dead", exit_code=death.code,
                        cause=death.cause.line if death.cause else None, ended=death.at)
            if isinstance(event, Died):
                self._spawn(self._dead_hook())
        elif isinstance(event, Stalled):
            self.record(outcome="stalled")
            self._hook("stalled", cause=event.summary(), quiet_s=round(event.quiet_s))
            if self.profile.expect.stacks_on_stall and not self._stall_stacks:
                self._stall_stacks = True  # once a stall: it is taken, or said why not
                self._spawn(self._stacks_on_stall())
        elif isinstance(event, JobEnded):
            self.record(job_end=self.job.told(event.verdict) if self.job else event.verdict)
        elif isinstance(event, JobEnding):
            self._hook("ending", cause=event.words(), left_s=round(event.left_s),
                       job_id=event.job_id)
        elif isinstance(event, ReadyTimedOut) and event.limit.kill and self.giving_up is None:
            self.giving_up = self._spawn(self._give_up())
        elif isinstance(event, StateChanged) and event.previous is State.STALLED:
            self._stall_stacks = False
        elif isinstance(event, StateChanged) and event.state is State.STOPPED:
            self.record(ended=event.at, stopped=True)

    def record(self, stopped: bool = False, **fields: Any) -> None:
        """Bring this run's history row up to date (a failing history is said once, then
        ignored: it never stops supervision)."""
        if self.history is None or self.run is None or self._history_failed:
            return
        m = self.machine
        tl = m.timeline
        fields["phases"] = tuple((s.phase.label, round(s.start - tl.launched_at, 3),
                                  round(s.duration(self.clock()), 3))
                                 for s in tl.spans if s.phase is not Phase.QUEUED
                                 ) if tl is not None else ()  # a job's queue: apart
        fields["engine_version"] = m.engine_version
        try:
            current = self.history.get(self.run.run_id)
            if stopped:  # a kill ends a launch that had not ended otherwise
                if current is not None and current.outcome in ("ready", "dead"):
                    fields.pop("phases")
                else:
                    fields["outcome"] = "stopped"
            if current is None:
                self.history.record(Launch(self.run.run_id, self.profile.key,
                                           self.profile.host.target, self.run.launched_at))
            self.history.update(self.run.run_id, **fields)
        except (sqlite3.Error, OSError, LookupError) as exc:
            self._history_failed = True
            self.emit([Notice(f"launch history not written ({self.history.path}): {exc}",
                              "warning")])

    def _note_survived(self) -> None:
        """The errors this launch logged before READY: no later launch's cause while another
        is known (tui.core.ranking's tiers)."""
        if self.history is None or self._history_failed:
            return
        try:
            self.history.note_survived(self.profile.key, self.profile.host.target,
                                       self.machine.tracker.shapes(), self.clock())
        except (sqlite3.Error, OSError) as exc:
            self._history_failed = True
            self.emit([Notice(f"launch history not written ({self.history.path}): {exc}",
                              "warning")])

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._side.add(task)
        task.add_done_callback(self._side.discard)
        return task

    async def _give_up(self) -> None:
        """on_ready_timeout = "kill": the run killed as the kill key kills it; a kill that
        fails is said, never raised."""
        try:
            await self.give_up()
        except (SpecconsoleError, OSError) as exc:
            self.emit([Notice(f"not killed after the ready timeout: {exc}", "warning")])

    def _hook(self, event: str, **fields: object) -> None:
        command = getattr(self.profile.alerts, f"on_{event}")
        if command is None or self.run is None or not self.hook_allowed(event):
            return
        env = hook_env(self.environ, event, {
            "profile": self.profile.key, "host": self.profile.host.target,
            "run_id": self.run.run_id, "pid": self.run.pid, **fields})
        self._spawn(self._run_hook(event, command, env))

    async def _run_hook(self, event: str, command: str, env: dict[str, str]) -> None:
        error = await run_hook(command, env, self.profile.alerts.hook_timeout)
        if error is not None:
            self.emit([Notice(f"hook on_{event} {error}", "warning")])

    async def _dead_hook(self) -> None:
        await asyncio.sleep(CAUSE_GRACE_S)  # late lines sharpen the cause; wait for them
        death = self.machine.death
        if death is not None:
            self._hook("dead", process=death.process, exit_code=death.code,
                       signal=death.signal, since_launch=round(death.since_launch, 1),
                       phase=death.phase.label if death.phase else None,
                       cause=death.cause.line if death.cause else death.summary())

    async def stacks(self, native: bool = False, why: str = "on request") -> StacksTaken:
        """py-spy every process of the run on its host; the result is also an event, so the
        console shows stacks taken on a stall as it shows those asked for."""
        if self.run is None:
            raise RunNotFound(f"no run of {self.profile.key} to take stacks of")
        got, done = await launcher.stacks(await self.connect(), self.profile,
                                          self.run.run_dir, native)
        m = self.machine
        taken = StacksTaken(tuple(process_stacks(s.pid, m.name_of(s.pid, s.name), s.state,
                                                 s.text, s.error) for s in got),
                            done.path, why, self.clock())
        self.emit([taken])
        return taken

    async def _stacks_on_stall(self) -> None:
        try:
            await self.stacks(why="on stall")
        except (SpecconsoleError, OSError) as exc:
            self.emit([Notice(f"no stacks on the stall: {exc}", "warning")])

    async def _smoke(self) -> None:
        """One request after READY, from the GPU host: latency, tokens, the reply's first line;
        a failure is "up but not serving"."""
        smoke = self.profile.smoke
        try:
            session = await self.connect()
            port = self.served.port
            models = await launcher.http(session, self.profile, "/v1/models", None, 10.0,
                                         port=port)
            model = json.loads(models.body)["data"][0]["id"] if models.status == 200 else None
            if smoke.kind == "chat":
                path, body = "/v1/chat/completions", {
                    "messages": [{"role": "user", "content": smoke.prompt}]}
            else:
                path, body = "/v1/completions", {"prompt": smoke.prompt}
            body.update(model=model or self.profile.server.model, max_tokens=smoke.max_tokens)
            reply = await launcher.http(session, self.profile, path, body, smoke.timeout,
                                        port=port)
        except (SessionError, OSError, ValueError, KeyError, IndexError) as exc:
            self.emit([SmokeDone(False, 0.0, None, "", f"the request could not be made: {exc}")])
            return
        self.emit([smoke_result(reply, smoke.kind)])

    # -- lifecycle ---------------------------------------------------------------------------

    async def connect(self) -> Session:
        """Open the session once, and check the host's Python can run the agent (psutil,
        pynvml) so a missing module is one line with the fix, before anything starts."""
        if self.session is None:
            session = await self.opener(self.profile.host)
            if not self._python_checked:
                try:
                    await check_python(session, launcher.agent_target(self.profile).interpreter())
                except BaseException:
                    await session.close()
                    raise
                self._python_checked = True
            self.login = session
            if self.job is not None and self.job.node is not None and self.job.end is None:
                try:
                    session = await remote_slurm.reach_node(
                        session, self.profile, self.job.job_id, self.job.node, self.opener)
                except BaseException:
                    await session.close()
                    raise
            self.session = session
        return self.session

    async def login_session(self) -> Session:
        """The session on [host] itself: the login node of a [slurm] profile."""
        await self.connect()
        assert self.login is not None
        return self.login

    async def run_preflight(self) -> tuple[Check, ...]:
        """The agent's checks on the host; for a [slurm] profile, the scheduler's answer on
        the login node (the node is not known before the allocation: slurmjob.job_checks)."""
        self.emit(self.machine.preflight(self.clock()))
        if self.profile.slurm is not None:
            checks = await job_checks(await self.login_session(), self.profile)
        else:
            checks = await launcher.preflight(await self.connect(), self.profile)
        self.last_checks = checks
        self.emit([PreflightDone(checks)])
        failed = [c for c in checks if not c.ok and c.severity == "error"]
        if failed:
            self.machine.state = State.PENDING
            raise PreflightFailed("; ".join(f"{c.check}: {c.message}" for c in failed))
        for check in checks:
            if not check.ok:
                self.emit([Notice(f"preflight warning — {check.check}: {check.message}",
                                  "warning")])
        return checks

    def leftovers(self) -> tuple[Leftover, ...]:
        """What the last preflight found to be leftovers of ended runs: GPU holders (each pid
        once) and containers (a holder inside one goes with its container): the only things
        `kill_leftovers` may be asked to kill."""
        boxes = {box.id: box for check in self.last_checks for box in check.containers}
        found: dict[int, GpuHolder] = {}
        for check in self.last_checks:
            for holder in check.holders:
                if (holder.leftover and holder.start_ticks is not None
                        and holder.container not in boxes):
                    found.setdefault(holder.pid, holder)
        return (*found.values(), *boxes.values())

    async def kill_leftovers(self, leftovers: Sequence[Leftover],
                             grace: float = 10.0) -> Killed:
        """TERM these leftovers, KILL after the grace, then verify they are gone and their GPU
        memory released (PreflightFailed if not: nothing may launch beside them). Each step is
        a Notice. The agent re-checks each one (same process, still holding GPU memory; the
        container still carrying the run id) right before signalling it."""
        pids = leftover_words(leftovers)
        self.emit([Notice(f"killing leftovers of ended runs: {pids}")])

        def step(s: KillStep) -> None:
            if s.pids or s.step == "TERM":
                what = {"SKIP": "not killed (no longer the process preflight saw, or no longer "
                                "holding GPU memory)"}.get(s.step, "")
                self.emit([Notice(f"leftovers {s.step}: {', '.join(map(str, s.pids)) or '—'}"
                                  + (f" {what}" if what else ""))])

        _, killed = await launcher.kill_holders(await self.connect(), self.profile, leftovers,
                                                grace, on_step=step)
        released, gpu = gpu_verdict(killed)
        if killed.remaining or not released:
            still = f"pids {', '.join(map(str, killed.remaining))} still alive; " \
                if killed.remaining else ""
            raise PreflightFailed(f"leftovers not cleared: {still}{gpu}")
        self.emit([Notice(f"leftovers gone ({pids}); {gpu}")])
        return killed

    async def launch(self, skip_preflight: bool = False, kill_leftovers: bool = False,
                     grace: float = 10.0) -> RunInfo:
        """Preflight (unless skipped or switched off), then start a new run and watch it.
        With `kill_leftovers`, leftovers of ended runs that hold the GPUs are killed (see
        kill_leftovers) and preflight runs again."""
        if self.profile.attach is not None:
            raise SpecconsoleError(f"{self.profile.name} was not launched by specconsole: it "
                                   "is not relaunched here (its owner starts it again)")
        if self.profile.slurm is not None:
            return await self.slurm.launch_job(skip_preflight)
        session = await self.connect()
        if not skip_preflight and self.profile.preflight.enabled:
            try:
                await self.run_preflight()
            except PreflightFailed:
                if not kill_leftovers or not self.leftovers():
                    raise
                await self.kill_leftovers(self.leftovers(), grace)
                await self.run_preflight()
        plan = launcher.plan_launch(self.profile, self.environ, self.clock())
        launched = await launcher.launch(session, self.profile, plan)
        now = self.clock()
        self.run = RunInfo(launched.run_id, launched.run_dir, launched.pid, now, attached=False,
                           served=served_by(self.profile), pulling=launched.pulling)
        self.remember_launch(plan, now)
        self.begin(now)
        return self.run








    def remember_launch(self, plan: launcher.LaunchPlan, now: float) -> None:
        """The launch's row in the history (its command, its env names, its job), once it runs."""
        if self.history is None or self._history_failed:
            return
        args = tuple(redact(a, plan.secrets) for a in plan.argv)
        env_names = tuple(sorted({*self.profile.server.env, *self.profile.server.secret_env}))
        job = self.job
        try:
            self.history.record(Launch(
                plan.run_id, self.profile.key, self.profile.host.target, now,
                command=shell_join(args), args=args, env_names=env_names,
                job_id=job.job_id if job is not None else None,
                nodes=job.job.nodes if job is not None and job.job is not None else (),
                queued=round(job.queued_s, 3) if job and job.queued_s is not None else None))
        except (sqlite3.Error, OSError) as exc:
            self._history_failed = True
            self.emit([Notice(f"launch history not written ({self.history.path}): {exc}",
                              "warning")])

    async def select(self, record: RunRecord | None = None) -> RunRecord:
        """Make a run (the profile's newest when none is given) this supervisor's, unwatched:
        enough to kill it or read its log."""
        whose = ""
        if record is None and self.profile.attach is not None:  # made (or found) by the agent
            if self.profile.attach.slurm_job is not None:
                whose = await self.slurm.attach_job(self.profile.attach.slurm_job)
            record = await launcher.attach(await self.connect(), self.profile, self.clock())
        record = record or await launcher.latest_run(await self.connect(), self.profile)
        if record is None or record.pid is None:
            raise RunNotFound(f"no run of {self.profile.key} on {self.profile.host.target}")
        if self.profile.slurm is not None:
            await self.slurm.find_job(record)
        started = record.started if record.started is not None else self.clock()
        self.run = RunInfo(record.run_id, record.run_dir, record.pid, started, attached=True,
                           served=record.served, owner=None if record.attached is None
                           else whose + attached_words(record.attached, self.clock()))
        if record.served is not None and (changes := served_changes(record.served,
                                                                    self.profile)):
            self.emit([Notice(f"run {record.run_id} was launched with {'; '.join(changes)}: "
                              "following it as it was launched", "warning")])
        return record

    async def attach(self, record: RunRecord | None = None) -> RunInfo:
        """Follow an existing run (the profile's newest when none is given) from its first line."""
        await self.select(record)
        if self.served.engine != self.machine.engine:  # the run's engine reads its log
            self.machine = self.new_machine(self.served.engine)
        self.begin(self.clock())
        assert self.run is not None
        return self.run

    async def start(self, *, launch: bool = True, skip_preflight: bool = False,
                    kill_leftovers: bool = False, grace: float = 10.0) -> RunInfo:
        """Attach to the profile's live run, else launch one (when allowed), else follow its
        newest run, dead or not, so its end can be reported."""
        self.kill_grace = grace
        if self.profile.attach is not None:  # a server launched by others: never launched here
            return await self.attach()
        latest = await launcher.latest_run(await self.connect(), self.profile)
        if latest is not None and self.profile.slurm is not None:
            # a job's run lives on its node: the scheduler says whether it still runs
            job = await self.slurm.find_job(latest)
            if job.end is None:
                return await self.attach(latest)
        elif latest is not None and latest.alive:
            return await self.attach(latest)
        if launch:
            return await self.launch(skip_preflight, kill_leftovers, grace)
        if latest is None:
            raise RunNotFound(f"no run of {self.profile.key}; "
                              "start one with `specconsole launch` or `wait --launch`")
        return await self.attach(latest)

    def begin(self, now: float, resume_log: bool = False) -> None:
        """Watch the run from `now`: its log from the start, or (a requeued job's next
        allocation) from where it was."""
        assert self.run is not None
        if not resume_log:
            self.log_end = 0
        self.lost_gpus = set()
        self.emit(self.machine.started(self.run.pid, self.run.launched_at, now))
        self.emit([RunStarted(self.run)])
        if self.history is not None:
            try:
                key, host = self.profile.key, self.profile.host.target
                self.usual = self.history.expected_phases(key, host)
                previous = self.history.last(key, host, before=self.run.run_id)
                self.machine.tracker.survived = self.history.survived(key, host)
            except (sqlite3.Error, OSError) as exc:
                self.emit([Notice(f"launch history not read ({self.history.path}): {exc}",
                                  "warning")])
            else:
                self.emit([HistoryLoaded(previous, self.usual)])
        self._tasks = [asyncio.create_task(self._watch_loop()),
                       asyncio.create_task(self._tick_loop())]
        if self.job is not None and self.serves:  # one member asks after a several-node job
            self._tasks.append(asyncio.create_task(self.slurm.job_loop()))

    def stop_watching(self) -> None:
        """The watch of a job's run stops where the job ended (JobFollow.job_over): every
        task of it but the caller's own is cancelled (the caller goes on to tell the end)."""
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def close(self) -> None:
        """Stop watching and drop the session; the server keeps running. Hooks already started
        get their timeout to finish (a DEAD alert must not die with the console)."""
        if self._side:
            await asyncio.wait(set(self._side), timeout=self.profile.alerts.hook_timeout + 1)
        self._closing = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self.session is not None:
            await self.session.close()
            self.session = None

    # -- watching ----------------------------------------------------------------------------

    def _watch_spec(self) -> dict[str, Any]:
        assert self.run is not None
        spec: dict[str, Any] = {
            "run_dir": self.run.run_dir, "log_offset": self.log_end,
            "redact": list(self.secrets), "secret_env": list(self.profile.server.secret_env),
            "procs_interval": 1.0, "gpus_interval": 1.0, "log_interval": 0.05}
        if not self.whole_log:
            spec["skim"] = {"head": SKIM_HEAD, "tail": SKIM_TAIL}
        if self.serves:
            spec["health"] = {"port": self.served.port, "paths": list(self.served.health),
                              "interval": 1.0,
                              "serving_interval": self.profile.expect.serving_probe_interval}
            spec["metrics"] = {"path": METRICS_PATH, "prefixes": ["vllm:", "sglang:"]}
        return spec

    async def _watch_loop(self) -> None:
        """Stream the agent; a lost link is retried with capped backoff from the last byte
        offset, anything else (the agent refusing, a bug) ends watching with a Fatal event."""
        backoff = BACKOFF_START_S
        while not self._closing:
            try:
                session = await self.connect()
                async for event in stream_agent(session, launcher.agent_target(self.profile),
                                                "watch", self._watch_spec()):
                    if backoff != BACKOFF_START_S:
                        self.emit([LinkRestored(session.host)])
                        backoff = BACKOFF_START_S
                    self._dispatch(event)
                    if isinstance(event, LogChunk):  # a backlog of chunks is read without a
                        await asyncio.sleep(0)  # pause: let the screen draw between them
                reason, lost = "the agent ended", False
            except (ConnectionLost, HostUnreachable) as exc:
                reason, lost = str(exc), True
            except OSError as exc:
                reason, lost = f"{self.profile.host.target}: {exc}", True
            except Exception as exc:  # shown as one line, never a traceback
                if not self._closing:
                    self.emit([Fatal(str(exc) if isinstance(exc, SessionError)
                                     else f"internal error while watching: {exc!r}")])
                return
            if self._closing:
                return
            if self.job is not None and await self.slurm.job_gone():
                return
            self.emit([LinkLost(self.profile.host.target, reason, backoff)])
            if lost:  # a session whose agent merely ended is kept: a kill may be using it
                await self._drop_session()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)


    async def _drop_session(self) -> None:
        if self.session is not None:
            with contextlib.suppress(Exception):
                await self.session.close()
            self.session = None

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self.emit(self.machine.tick(self.clock()))

    def _dispatch(self, event: Any) -> None:
        now = self.clock()
        m = self.machine
        if isinstance(event, LogChunk):
            self.emit(m.feed_lines(self._lines(event), now))
        elif isinstance(event, LogSkipped):
            self.log_end = max(self.log_end, event.end)
            self.emit([event])
        elif isinstance(event, ProcExit):
            self._emit_death(m.feed_exit(event, now))
            ended = m.ended_as(event)
            self.emit([ProcEnded(ended.pid, ended.name, ended.code, ended.signal)])
        elif isinstance(event, Procs):
            m.feed_procs(event, now)
            self.emit([ProcsSeen(event)])
        elif isinstance(event, Gpus):
            m.feed_gpus(event, now)
            self.emit([GpusSeen(event)])
            for gpu in event.gpus:
                if gpu.lost and gpu.index not in self.lost_gpus:
                    self.lost_gpus.add(gpu.index)
                    self.emit([Notice(
                        f"{self.profile.host.target}: GPU {gpu.index} is lost (fell off the bus:"
                        " NVML answers GPU_IS_LOST); what runs on it will fail, the other GPUs"
                        f" keep streaming — `nvidia-smi -q -i {gpu.index}` and dmesg say why",
                        "warning")])
        elif isinstance(event, Health):
            self.emit(m.feed_health(event, now))
        elif isinstance(event, RunExit):
            self._emit_death(m.feed_run_exit(event, now))
        elif isinstance(event, (Hello, Secrets)):
            self.secrets = tuple({*self.secrets, *event.redact})
            if isinstance(event, Hello):
                self.emit([AgentHello(event)])
                if not event.nvml_ok:
                    self.emit([Notice(f"{event.host}: no GPU data — {event.nvml_error}",
                                      "warning")])
        elif isinstance(event, Metrics):
            totals = parse_totals(event.text)
            if totals is not None:
                self.emit([SpecDecodeSeen(totals, event.time)])
            self.emit(m.feed_metrics(event.text, event.time))
        elif isinstance(event, AgentFault):
            self.emit([Notice(f"agent: {event.kind}: {event.message}", "warning")])
        elif isinstance(event, DiskSpace):
            self.emit([Notice(*disk_words(self.profile.host.target, event))])

    def _emit_death(self, events: list[Any]) -> None:
        """A job's death waits for the scheduler's word on it (JobFollow.died_in_job)."""
        if self.job is not None and any(isinstance(e, Died) for e in events):
            self._spawn(self.slurm.died_in_job(events))
        else:
            self.emit(events)

    def _lines(self, chunk: LogChunk) -> list[tuple[int, str]]:
        """Per-line byte offsets; a chunk that starts before what we have is trimmed."""
        if chunk.end <= self.log_end:
            return []
        out: list[tuple[int, str]] = []
        offset = chunk.off
        for line in chunk.lines:
            if offset >= self.log_end:
                out.append((offset, redact(line, self.secrets) if self.secrets else line))
            offset += len(line.encode("utf-8", "replace")) + 1
        self.log_end = chunk.end
        return out

    async def read_log(self, start: int, end: int) -> list[Entry]:
        """Bytes [start, end) of the run's log file, as classified lines (the console's
        scroll-back past its capped buffer). A partial first line is skipped, so a page begins
        at a line boundary; nothing is counted again by the noise filter, and only the lines a
        rule cares about are decoded (the rest when drawn), as in the live stream."""
        if self.run is None or end <= start:
            return []
        result = await (await self.connect()).run(
            ["dd", f"if={self.run.run_dir}/server.log", "iflag=skip_bytes,count_bytes",
             f"skip={start}", f"count={end - start}", "status=none"])
        data = result.stdout if result.returncode == 0 else b""
        offset = start
        if start > 0:
            cut = data.find(b"\n")
            if cut < 0:
                return []
            data, offset = data[cut + 1:], start + cut + 1
        pieces = data.split(b"\n")
        if data.endswith(b"\n"):
            pieces.pop()
        offsets = list(accumulate(map(add, map(len, pieces), repeat(1)), initial=offset))
        raws = [p.decode("utf-8", "replace") for p in pieces]
        if self.secrets:
            raws = [redact(raw, self.secrets) for raw in raws]
        return entries(self.machine.reader.read_page(LineChunk(offsets[:-1], raws)))

    # -- control -----------------------------------------------------------------------------

    async def kill(self, grace: float = 10.0, cancel_job: bool = True) -> Killed:
        """TERM the group, KILL after the grace, sweep by run id; report what remains. A job's
        run: then scancel (unless `cancel_job` is False: a several-node job's members are
        cancelled together, supervise.group)."""
        if self.run is None:
            raise RunNotFound(f"no run of {self.profile.key} to kill")
        if self.job is not None:
            return await self.slurm.kill_job(grace, cancel_job)
        self.mark_killing()
        steps, killed = await launcher.kill(
            await self.connect(), self.profile, self.run.run_dir, grace,
            on_step=lambda step: self.emit([KillProgress(step)]))
        self.last_kill_steps = steps
        self.emit([KillDone(killed), *self.machine.stopped(self.clock())])
        return killed


    def mark_killing(self) -> None:
        """From now on the run's processes ending is our kill, not a death (a cluster marks
        every member before it kills the first: the others' processes end with it)."""
        self.emit(self.machine.killing(self.clock()))

    async def restart(self, grace: float = 10.0, skip_preflight: bool = False) -> RunInfo:
        """Kill, verify, and relaunch as a new run with a fresh machine and timeline. With no
        run yet (the first start failed), start: attach to a live run, else launch."""
        self.kill_grace = grace
        if self.run is None:
            return await self.start(launch=True, skip_preflight=skip_preflight, grace=grace)
        if self.job is not None and self.job.end is not None:  # its job is over: resubmit
            self.reset()
            return await self.launch(skip_preflight)
        killed = await self.kill(grace)
        if killed.remaining:  # never a second server beside a first that will not die
            raise SpecconsoleError(
                "not relaunching: processes of the run are still alive after the kill "
                f"(pids {', '.join(map(str, killed.remaining))})")
        self.reset()
        return await self.launch(skip_preflight)

    def reset(self) -> None:
        """Stop watching the killed run and start a fresh machine for the next launch."""
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        self.giving_up = None
        self.machine = self.new_machine()
        if self.job is not None:  # a relaunch submits a job of its own
            self.job = None
            if self.login is not None:
                self.session = self.login


def ready_limit_of(profile: Profile) -> ReadyLimit | None:
    """The profile's [expect] ready_timeout and on_ready_timeout, when it sets a timeout."""
    exp = profile.expect
    if exp.ready_timeout is None:
        return None
    return ReadyLimit(exp.ready_timeout, "ready_timeout", kill=exp.on_ready_timeout == "kill")


def smoke_result(reply: HttpReply, kind: str) -> SmokeDone:
    """The smoke request's reply in a few words: latency, tokens, the first line of text."""
    if reply.status != 200:
        what = "no answer" if reply.status is None else f"HTTP {reply.status}"
        return SmokeDone(False, reply.seconds, None, "",
                         f"{what}: {strip_escapes(reply.body[:200])}")
    try:
        data = json.loads(reply.body)
        choice = data["choices"][0]
        text = choice["message"]["content"] if kind == "chat" else choice["text"]
        tokens = (data.get("usage") or {}).get("completion_tokens")
    except (ValueError, KeyError, IndexError, TypeError):
        return SmokeDone(False, reply.seconds, None, "", "the reply is not an OpenAI answer")
    first = next((line.strip() for line in str(text).splitlines() if line.strip()), "")
    return SmokeDone(True, reply.seconds, tokens, strip_escapes(first)[:200])
