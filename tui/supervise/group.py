"""One launch over several hosts: a Supervisor per member, started in order, watched together.

Each member (tui.core.cluster) is one process tree on one host with its own session, agent and
LaunchMachine, so everything a single-host run has (reconnect from the last byte offset, kill
escalation, the env-marker sweep that finds Ray's workers outside the launch's process group)
holds per host. This class only orders the launch (each member must print its "joined" line
before the next starts), tags every member event with its host, and makes the first death on
any host the run's death. A host whose link drops is that host lost, not a death: the member's
Supervisor reconnects and its own rules decide.

Through Slurm (`[slurm] nodes = N`) the run is one job of N nodes: the server's member submits
it and follows it through the queue (supervise.slurmjob); once allocated, the members are placed
on its nodes (the head on the first) and launched in the same order, each through the agent the
job script started on its node; each is watched through a step of the job. A member that dies
while the job runs on is said with the nodes the job still holds (StepFailed); kill kills every
member through its step, then cancels the job once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tui.core import cluster, slurm
from tui.core.command import new_run_id
from tui.core.errors import JobNeverStarts, PreflightFailed, RunNotFound, SpecconsoleError
from tui.core.profile import Profile
from tui.core.protocol import Killed, RunRecord
from tui.core.state import Death, Died, LinesAdded
from tui.core.units import duration
from tui.remote import launcher
from tui.remote import slurm as remote_slurm
from tui.remote.session import open_session
from tui.supervise.events import Fatal, JobEnded, Notice, RunInfo
from tui.supervise.history import History
from tui.supervise.runs import Member, Run, SingleRun
from tui.supervise.slurmjob import RUN_RECORD_S, JobRun
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
    # the scheduler requeued the job with it (a preemption): the run is followed to its next
    # allocation (ClusterRun._follow_requeue), so `wait` goes on
    requeued: bool = False


@dataclass(frozen=True, slots=True)
class StepFailed:
    """A several-node job's member died while the job runs on: the job still holds the other
    nodes (and their GPUs) until someone ends it."""

    job_id: str
    node: str
    process: str
    holding: tuple[str, ...]

    def words(self) -> str:
        return slurm.step_failed_words(self.job_id, self.node, self.process, self.holding)


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
        self.step_failed: StepFailed | None = None
        self.joined: dict[str, float] = {}
        self._queues: list[asyncio.Queue[Any]] = []
        self._pumps: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[None]] = set()
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
            self._pumps = [asyncio.create_task(self._forward(m.name)) for m in self.parts]

    def _emit(self, event: object) -> None:
        for queue in self._queues:
            queue.put_nowait(event)

    async def _forward(self, name: str) -> None:
        """Every event of one member, tagged with where it runs now (a job's member is placed
        on its node once the job is allocated); its first death may be the run's."""
        events = self.sups[name].subscribe()
        while True:
            event = await events.get()
            m = self.part(name)
            self._emit(MemberEvent(m.name, m.host, event))
            if (isinstance(event, JobEnded) and event.end.requeued and name == cluster.SERVER
                    and self.sups[name].job is not None):
                self._spawn(self._follow_requeue(event.end))
            if isinstance(event, Died) and self.died is None:
                job = self.sups[m.name].job
                self.died = RunDied(m.name, m.host, event.death,
                                    job is not None and event.death in job.requeued)
                self._emit(self.died)
                if self.sups[m.name].job is not None and event.death.ended_by is None:
                    self._spawn(self._step_failed(m.name, event.death))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _step_failed(self, name: str, death: Death) -> None:
        """A member of a several-node job died: when the scheduler still runs the job, the
        other nodes are still allocated to it, GPUs and all (StepFailed); when the job has
        ended, its end is told by the members (supervise.slurmjob)."""
        sup = self.sups[name]
        assert sup.job is not None
        with contextlib.suppress(SpecconsoleError):
            job = await remote_slurm.show_job(await sup.login_session(), sup.job.job_id)
            if job is None or job.state != "RUNNING":
                return
            node = self.part(name).host
            holding = tuple(n for n in job.nodes if n != node)
            if holding:
                self.step_failed = StepFailed(job.job_id, node, death.process, holding)
                self._emit(self.step_failed)
                self._emit(Notice(self.step_failed.words(), "warning"))

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
        if death.code is None and death.signal is None:
            # its parent reaped it before its agent read how it ended: a headless node's
            # worker, whose death the head's executor logs with its code on another host
            status = next((s for m in self.parts if m.name != name and (
                s := self.sups[m.name].machine.reported_status(death.process)) is not None),
                None)
            if status is not None:
                death = replace(death, code=status[0], signal=status[1])
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
        placed = [self.sups[m.name].job for m in self.parts]
        if self.profile.slurm is not None and all(j is not None and j.node for j in placed):
            # a several-node job's members, found where their runs recorded their nodes
            nodes = dict.fromkeys(str(j.node) for j in placed if j is not None)  # head first
            self.parts = cluster.members(cluster.allocated(self.profile,
                                                           [(n, n) for n in nodes]))
            self.members[:] = [Member(m.host, m.name, self.sups[m.name]) for m in self.parts]
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
        # a several-node job: the scheduler's answer, once (its nodes are not known yet)
        asked = [self.part(cluster.SERVER)] if self.profile.slurm is not None else self.parts
        refused = [r for r in await asyncio.gather(*(one(m) for m in asked)) if r]
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
        self.step_failed = None
        self.joined = {}
        if self.profile.slurm is not None:
            await self._allocate()
        await self._start_members(grace)
        run = self.server.run
        if run is None:  # a member died before the server was launched
            first = next(s for s in self.sups.values() if s.run is not None)
            assert first.run is not None
            return first.run
        return run

    async def _start_members(self, grace: float) -> None:
        """The members launched in order, each after the one before it joined."""
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

    async def _allocate(self) -> None:
        """A several-node job: submitted by the server's member, which follows it through the
        queue; once it runs, every member is placed on its node (the head's address is the
        scheduler's NodeAddr of the first) and told its job."""
        server = self.server
        login = await server.login_session()
        join = self.profile.cluster.join_timeout if self.profile.cluster else 300.0
        wait_s = join * len(self.parts) + RUN_RECORD_S  # the last member's turn, at the latest
        run_id = new_run_id(f"{self.profile.name}.job", self.clock())
        sub, job = await server.slurm.submit_job(
            remote_slurm.submit_nodes(login, self.profile, run_id, wait_s))
        await self._place(job, sub.script, sub.run_dir)

    async def _place(self, job: slurm.Job, script: str, job_dir: str) -> None:
        """Every member placed on the running job's nodes (the head on the first, its address
        the scheduler's NodeAddr) and told its job, its node, and whether another member
        follows on that node."""
        server = self.server
        login = await server.login_session()
        known = {n.name: n.address for n in await remote_slurm.node_states(login, job.nodes)}
        profile = cluster.allocated(self.profile, [(n, known.get(n, n)) for n in job.nodes])
        self.parts = cluster.members(profile)
        self.members[:] = [Member(m.host, m.name, self.sups[m.name]) for m in self.parts]
        for i, m in enumerate(self.parts):
            sup = self.sups[m.name]
            sup.profile = m.profile
            if sup.job is None or sup is not server:
                sup.job = JobRun(job.job_id, script, restarts=job.restarts)
                sup.job.seen(job, self.clock())
            sup.job.node, sup.job.job_dir = m.node.job_node, job_dir
            sup.job.more_on_node = any(o.node.job_node == m.node.job_node
                                       for o in self.parts[i + 1:])

    async def _follow_requeue(self, end: slurm.SchedulerEnd) -> None:
        """The scheduler requeued the several-node job (preempted; same id): its script starts
        an agent on every node of the next allocation again, each waiting for its member's
        launch. Followed as a single node's requeued job is (the queue again, `allocated on
        ...`), then the members placed on the new nodes and launched in order, as the first
        time, each a fresh run. A job that ends or can never start first is said (and, never
        starting, cancelled); the first allocation's death stays the run's."""
        server = self.server
        first = server.job
        assert first is not None and first.script is not None and first.job_dir is not None
        requeued_at = self.clock()
        for sup in self.sups.values():
            sup.reset()  # fresh machines: each member's run ended with the allocation
        server.job = replace(first, end=None, node=None, alerted=False, clock=None)
        try:
            job = await server.slurm.requeued_job(end, requeued_at)
            await self._place(job, first.script, first.job_dir)
            self.died, self.step_failed, self.joined = None, None, {}
            await self._start_members(server.kill_grace)
        except (JobNeverStarts, SpecconsoleError) as exc:
            after = str(exc)
            if isinstance(exc, JobNeverStarts):
                await remote_slurm.cancel(await server.login_session(), first.job_id)
                after += f": cancelled it (scancel {first.job_id})"
            if self.died is not None and self.died.requeued:  # the run's death after all
                death = self.died.death
                self.died = RunDied(self.died.member, self.died.host,
                                    replace(death, ended_by=f"{death.ended_by}; then {after}"))
                self._emit(self.died)
            self._emit(Notice(f"job {first.job_id}: {after}", "warning"))

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
        job = self.server.job if self.profile.slurm is not None else None
        if not ordered and (job is None or job.end is not None):
            raise RunNotFound(f"no run of {self.profile.name} to kill")
        for m in ordered:
            self.sups[m.name].mark_killing()
        # a several-node job is cancelled once, after every member is killed on its node
        cancel = job is None
        first, rest = (ordered[0], ordered[1:]) if ordered else (None, [])
        if first is not None:
            killed[first.name] = await self.sups[first.name].kill(grace, cancel)
        results = await asyncio.gather(*(self.sups[m.name].kill(grace, cancel) for m in rest),
                                       return_exceptions=True)
        for m, result in zip(rest, results, strict=True):
            if isinstance(result, BaseException):
                raise result
            killed[m.name] = result
        if job is not None:
            ended = await self.server.slurm.cancel_job()
            for m in self.parts:
                sup = self.sups[m.name]
                if sup is not self.server and sup.job is not None:
                    await sup.slurm.job_over(ended)
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
        for task in self._side:
            task.cancel()
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
