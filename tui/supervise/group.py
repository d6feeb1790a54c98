"""One launch over several hosts: a Supervisor per member, started in order, watched together.

Each member (tui.core.cluster) is one process tree on one host with its own session, agent and
LaunchMachine, so everything a single-host run has (reconnect from the last byte offset, kill
escalation, the env-marker sweep that finds Ray's workers outside the launch's process group)
holds per host. This class only orders the launch (each member must print its "joined" line
before the next starts), tags every member event with its host, and makes the first death on
any host the run's death. A host whose link drops is that host lost, not a death: the member's
Supervisor reconnects and its own rules decide.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tui.core import cluster
from tui.core.errors import PreflightFailed, RunNotFound, SpecconsoleError
from tui.core.profile import Profile
from tui.core.protocol import Killed, RunRecord
from tui.core.state import Death, Died, LinesAdded
from tui.core.units import duration
from tui.remote import launcher
from tui.remote.session import open_session
from tui.supervise.events import Fatal, Notice, RunInfo
from tui.supervise.history import History
from tui.supervise.runs import Member, Run, SingleRun
from tui.supervise.supervisor import SessionOpener, Supervisor

# how long after a death without a cause another member's death may lend it its cause
CAUSE_ELSEWHERE_S = 10.0


@dataclass(frozen=True, slots=True)
class MemberEvent:
    """A member Supervisor's event, with where it happened."""

    member: str
    host: str
    event: object


@dataclass(frozen=True, slots=True)
class Joined:
    member: str
    host: str
    after: float  # seconds since that member was launched


@dataclass(frozen=True, slots=True)
class RunDied:
    """The run's death: the first member death, on whichever host it happened."""

    member: str
    host: str
    death: Death


class ClusterRun:
    """Launch, attach, watch, kill and restart every member of a multi-host profile."""

    def __init__(self, profile: Profile, *, environ: Mapping[str, str] | None = None,
                 opener: SessionOpener = open_session, clock: Callable[[], float] = time.time,
                 history: History | None = None) -> None:
        self.profile = profile
        self.name = profile.name
        self.clock = clock
        self.parts = cluster.members(profile)
        self.sups = {m.name: Supervisor(m.profile, environ=environ, opener=opener, clock=clock,
                                        history=history if m.serves else None, serves=m.serves)
                     for m in self.parts}
        # the console's view: every host alike (tui.supervise.runs), acted on through this run only
        self.members = [Member(m.host, m.name, self.sups[m.name]) for m in self.parts]
        self.died: RunDied | None = None
        self.joined: dict[str, float] = {}
        self._queues: list[asyncio.Queue[Any]] = []
        self._pumps: list[asyncio.Task[None]] = []
        for m in self.parts:
            self.sups[m.name].hook_allowed = self._hook_gate(m)
        self.kill_grace = 10.0
        # the server's member gives up on the launch (its ready_timeout); a kill then is the
        # whole run's, every host
        self.server.give_up = lambda: self.kill(self.kill_grace)

    @property
    def server(self) -> Supervisor:
        return self.sups[cluster.SERVER]

    def part(self, name: str) -> cluster.Member:
        return next(m for m in self.parts if m.name == name)

    # -- events ------------------------------------------------------------------------------

    def subscribe(self) -> asyncio.Queue[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues.append(queue)
        return queue

    def _watch_members(self) -> None:
        """Forward every member's events from now on (once; needs the running loop)."""
        if not self._pumps:
            self._pumps = [asyncio.create_task(self._forward(m)) for m in self.parts]

    def _emit(self, event: object) -> None:
        for queue in self._queues:
            queue.put_nowait(event)

    async def _forward(self, m: cluster.Member) -> None:
        """Every event of one member, tagged; its first death may be the run's."""
        events = self.sups[m.name].subscribe()
        while True:
            event = await events.get()
            self._emit(MemberEvent(m.name, m.host, event))
            if isinstance(event, Died) and self.died is None:
                self.died = RunDied(m.name, m.host, event.death)
                self._emit(self.died)

    def _hook_gate(self, m: cluster.Member) -> Callable[[str], bool]:
        """Alerts are the run's: on_dead once, for the first death on any host; on_ready and
        on_stalled from the server's member only."""
        def allowed(event: str) -> bool:
            if event == "dead":
                return self.died is not None and self.died.member == m.name
            return m.serves
        return allowed

    def death(self) -> tuple[cluster.Member, Death] | None:
        """The run's death with the best cause known now (late lines sharpen it): of the
        deaths seen on every host, the one that happened first, whichever was heard of first
        (each host's news travels its own link). When that one has no cause of its own (no
        words and no signal: a signal is its cause), the cause of a later death within
        CAUSE_ELSEWHERE_S that was printed by a process of the same name: a Ray worker's words
        reach the driver's log on the head (prefixed with the worker's name), not the host the
        worker died on. What other processes print after a death is its symptom."""
        if self.died is None:
            return None
        deaths = sorted(((d.at, m.name, d) for m in self.parts
                         if (d := self.sups[m.name].machine.death) is not None),
                        key=lambda found: found[0])
        if not deaths:
            return self.part(self.died.member), self.died.death
        first_at, name, death = deaths[0]
        if death.cause is None and death.signal is None:
            cause = next((d.cause for at, _, d in deaths[1:]
                          if d.cause is not None and d.cause.process == death.process
                          and at - first_at <= CAUSE_ELSEWHERE_S), None)
            if cause is not None:
                death = replace(death, cause=cause)
        return self.part(name), death

    # -- starting ----------------------------------------------------------------------------

    async def start(self, *, launch: bool = True, skip_preflight: bool = False,
                    kill_leftovers: bool = False, grace: float = 10.0) -> RunInfo:
        """Attach when any member's run is alive (every member with a run is followed, so a
        host that died is reported), else launch (when allowed), else follow the last runs."""
        self.kill_grace = grace
        self._watch_members()
        async def newest(m: cluster.Member) -> RunRecord | None:
            return await launcher.latest_run(await self.sups[m.name].connect(), m.profile)

        latest = await asyncio.gather(*(newest(m) for m in self.parts))
        records = dict(zip((m.name for m in self.parts), latest, strict=True))
        if any(r is not None and r.alive for r in records.values()) or (
                not launch and any(records.values())):
            return await self._attach(records)
        if not launch:
            raise RunNotFound(f"no run of {self.profile.name} on "
                              f"{', '.join(n.host.target for n in self.profile.nodes)}; "
                              "start one with `specconsole launch` or `wait --launch`")
        return await self.launch(skip_preflight, kill_leftovers, grace)

    async def _attach(self, records: dict[str, RunRecord | None]) -> RunInfo:
        for m in self.parts:
            record = records[m.name]
            if record is None:
                self._emit(Notice(f"{m.host}: no run of {m.name} to follow", "warning"))
                continue
            await self.sups[m.name].attach(record)
            self.joined[m.name] = 0.0
        if self.server.run is None:
            raise RunNotFound(f"no server run of {self.profile.name} on "
                              f"{self.profile.host.target}")
        return self.server.run

    async def preflight(self, kill_leftovers: bool, grace: float) -> None:
        """Every host's preflight before anything starts: a refusal on one host launches
        nothing anywhere."""
        async def one(m: cluster.Member) -> str | None:
            sup = self.sups[m.name]
            if not m.profile.preflight.enabled:
                return None
            try:
                await sup.run_preflight()
            except PreflightFailed as exc:
                if not kill_leftovers or not sup.leftovers():
                    return f"{m.host} ({m.name}): {exc}"
                await sup.kill_leftovers(sup.leftovers(), grace)
                await sup.run_preflight()
            return None
        refused = [r for r in await asyncio.gather(*(one(m) for m in self.parts)) if r]
        if refused:
            raise PreflightFailed("; ".join(refused))

    async def launch(self, skip_preflight: bool = False, kill_leftovers: bool = False,
                     grace: float = 10.0) -> RunInfo:
        """Preflight every host, then start the members in order, each waiting for the one
        before it to join. A member that dies while joining ends the launch (the run is dead,
        with that cause); one that does not join in time is said, and what started is killed."""
        self._watch_members()
        if not skip_preflight:
            await self.preflight(kill_leftovers, grace)
        self.died = None
        self.joined = {}
        for m in self.parts:
            sup = self.sups[m.name]
            queue = sup.subscribe()
            try:
                await sup.launch(skip_preflight=True)
                joined = m.joined is None or await self._join(m, queue)
            finally:
                sup.unsubscribe(queue)
            if not joined:
                if self.died is None:
                    timeout = self.profile.cluster.join_timeout if self.profile.cluster else 0
                    await self.kill(grace)
                    raise SpecconsoleError(
                        f"{m.host} ({m.name}) did not join within {duration(timeout)}: "
                        "nothing started was left running; see its log with `specconsole "
                        f"logs {self.profile.path} --member {m.name}`")
                break
        run = self.server.run
        if run is None:  # a member died before the server was launched
            first = next(s for s in self.sups.values() if s.run is not None)
            assert first.run is not None
            return first.run
        return run

    async def _join(self, m: cluster.Member, queue: asyncio.Queue[Any]) -> bool:
        """Until the member's joined line (True), its death or the join timeout (False)."""
        assert m.joined is not None and self.profile.cluster is not None
        started = self.clock()
        deadline = time.monotonic() + self.profile.cluster.join_timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = await asyncio.wait_for(queue.get(), left)
            except asyncio.TimeoutError:
                break
            if isinstance(event, LinesAdded) and any(
                    m.joined.search(raw) for raw in event.chunk.raws):
                self.joined[m.name] = self.clock() - started
                self._emit(Joined(m.name, m.host, self.joined[m.name]))
                return True
            if isinstance(event, (Died, Fatal)) or self.died is not None:
                return False
        return False

    # -- stopping ----------------------------------------------------------------------------

    async def kill(self, grace: float = 10.0) -> dict[str, Killed]:
        """The server first (its engine would otherwise log every worker's loss), then the
        other members together; each on its own host with the full escalation. Every member
        is marked killing before the first is killed: under Ray the server's end makes the
        raylets end their actors, which is the kill, not a death."""
        killed: dict[str, Killed] = {}
        ordered = [m for m in reversed(self.parts) if self.sups[m.name].run is not None]
        if not ordered:
            raise RunNotFound(f"no run of {self.profile.name} to kill")
        for m in ordered:
            self.sups[m.name].mark_killing()
        first, rest = ordered[0], ordered[1:]
        killed[first.name] = await self.sups[first.name].kill(grace)
        results = await asyncio.gather(*(self.sups[m.name].kill(grace) for m in rest),
                                       return_exceptions=True)
        for m, result in zip(rest, results, strict=True):
            if isinstance(result, BaseException):
                raise result
            killed[m.name] = result
        return killed

    async def restart(self, grace: float = 10.0, skip_preflight: bool = False) -> RunInfo:
        """Kill every member, verify, then launch the whole run again, in order."""
        self.kill_grace = grace
        if any(s.run is not None for s in self.sups.values()):
            killed = await self.kill(grace)
            alive = sorted(p for k in killed.values() for p in k.remaining)
            if alive:
                raise SpecconsoleError("not relaunching: processes of the run are still alive "
                                       f"after the kill (pids {', '.join(map(str, alive))})")
        for sup in self.sups.values():
            sup.reset()
        return await self.launch(skip_preflight)

    async def close(self) -> None:
        """Stop watching every host; the servers keep running."""
        await asyncio.gather(*(s.close() for s in self.sups.values()))
        for pump in self._pumps:
            pump.cancel()
        for pump in self._pumps:
            with contextlib.suppress(asyncio.CancelledError):
                await pump


def run_of(profile: Profile, *, history: History | None = None) -> Run:
    """The run a profile describes (the one place that chooses how it is coordinated)."""
    if cluster.is_cluster(profile):
        return ClusterRun(profile, history=history)
    return SingleRun(Supervisor(profile, history=history))
