"""`wait`'s follow loop: one for a run on one host and for a run over several hosts.

It starts the run (attach, or launch when allowed), then prints a line per event worth one
until the run is READY (0), dead (3), given up on (4: not READY within the ready limit, which
the launch state machine keeps: the profile's ready_timeout, or `--timeout` in its place),
stalled (5) or cannot be watched (1). Over several hosts each line names the host and member it
is about ("gpu-b node-1: ..."), the joins are said, and the first death on any host is the run's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tui.cli.exit_codes import EXIT_DEAD, EXIT_ERROR, EXIT_READY, EXIT_STALLED, EXIT_TIMEOUT
from tui.core.describe import death_lines, describe, gpu_verdict, serving_words
from tui.core.phases import Phase
from tui.core.state import Death, Died, ProgressChanged, Ready, ReadyTimedOut, Stalled
from tui.core.units import duration
from tui.supervise.events import (
    Fatal,
    JobEnding,
    KillDone,
    LinkLost,
    LinkRestored,
    Notice,
    RunInfo,
    StacksTaken,
)
from tui.supervise.group import ClusterRun, Joined, MemberEvent, RunDied
from tui.supervise.supervisor import CAUSE_GRACE_S, Supervisor

Say = Callable[..., None]

STACKS_WAIT_S = 60.0  # py-spy of every process, over SSH: seconds, but a stuck host is slow
SERVING_WAIT_S = 3.0  # the agent reads /metrics at its first tick after READY


@dataclass(frozen=True, slots=True)
class Seen:
    """An event as the loop reads it: what happened, where ("" on one host), the state of the
    member it happened on, and whether that member serves (READY, the stall and the timeout
    are the run's only there)."""

    event: object
    state: str
    where: str = ""
    fields: dict[str, str] = field(default_factory=dict)  # host (and member) for --json
    serves: bool = True

    def words(self, text: str) -> str:
        return f"{self.where}: {text}" if self.where else text


class Followed(Protocol):
    """What the loop follows: a run on one host or on several, alike."""

    @property
    def server(self) -> Supervisor:
        """The serving member's supervisor (its machine holds the ready limit)."""

    def subscribe(self) -> asyncio.Queue[Any]: ...

    def opening(self, launch: bool) -> str | None:
        """The line before starting, if any."""

    async def start(self, args: argparse.Namespace) -> RunInfo: ...

    def seen(self, event: object) -> Seen | None:
        """The event as the loop reads it, or None when it says nothing by itself."""

    def is_death(self, event: object) -> bool:
        """The run's death (the first on any host)."""

    def death(self) -> tuple[Seen, Death] | None:
        """The run's death, with the best cause known now, and where it happened."""

    def link_words(self, seen: Seen) -> str: ...


class OneHost:
    """A run on one host: one supervisor, lines without a prefix."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    @property
    def server(self) -> Supervisor:
        return self.sup

    def subscribe(self) -> asyncio.Queue[Any]:
        return self.sup.subscribe()

    def opening(self, launch: bool) -> str | None:
        return None

    async def start(self, args: argparse.Namespace) -> RunInfo:
        return await self.sup.start(launch=args.launch, skip_preflight=args.skip_preflight,
                                    kill_leftovers=args.kill_leftovers)

    def seen(self, event: object) -> Seen:
        return Seen(event, self.sup.machine.state.value)

    def is_death(self, event: object) -> bool:
        """A death, unless its job was requeued: the run is followed to its next allocation
        (the preemption is said as a line; `wait` goes on to READY there)."""
        job = self.sup.job
        return isinstance(event, Died) and not (job is not None and event.death in job.requeued)

    def death(self) -> tuple[Seen, Death] | None:
        death = self.sup.machine.death
        return None if death is None else (self.seen(None), death)

    def link_words(self, seen: Seen) -> str:
        if isinstance(seen.event, LinkLost):
            return (f"connection lost, retrying in {seen.event.retry_in:.1f}s — "
                    f"{seen.event.reason}")
        assert isinstance(seen.event, LinkRestored)
        return f"connection restored to {seen.event.host}"


class SeveralHosts:
    """A run over several hosts (supervise.group): each member's events, tagged with where."""

    def __init__(self, group: ClusterRun) -> None:
        self.group = group

    @property
    def server(self) -> Supervisor:
        return self.group.server

    def subscribe(self) -> asyncio.Queue[Any]:
        return self.group.subscribe()

    def opening(self, launch: bool) -> str:
        hosts = ", ".join(f"{m.host} ({m.name})" for m in self.group.parts)
        return f"{'launching' if launch else 'following'} {self.group.name} on {hosts}"

    async def start(self, args: argparse.Namespace) -> RunInfo:
        return await self.group.start(launch=args.launch, skip_preflight=args.skip_preflight,
                                      kill_leftovers=args.kill_leftovers)

    def _member(self, event: object, host: str, member: str) -> Seen:
        return Seen(event, self.group.sups[member].machine.state.value, f"{host} {member}",
                    {"host": host, "member": member}, serves=member == "server")

    def seen(self, event: object) -> Seen | None:
        if isinstance(event, MemberEvent):
            return self._member(event.event, event.host, event.member)
        if isinstance(event, Joined):
            return self._member(event, event.host, event.member)
        if isinstance(event, (RunDied, Notice)):
            return Seen(event, self.server.machine.state.value)
        return None

    def is_death(self, event: object) -> bool:
        """The run's first death, unless the scheduler requeued its job: the members are then
        followed to the next allocation (the preemption said as a line)."""
        return isinstance(event, RunDied) and not event.requeued

    def death(self) -> tuple[Seen, Death] | None:
        found = self.group.death()
        if found is None:
            return None
        member, death = found
        return self._member(None, member.host, member.name), death

    def link_words(self, seen: Seen) -> str:
        """A dropped link is the host lost (not a death): its processes are not known dead."""
        host = seen.fields["host"]
        if isinstance(seen.event, LinkLost):
            return (f"{host} LOST: connection lost, retrying in {seen.event.retry_in:.1f}s — "
                    f"{seen.event.reason}")
        return f"{host} back: connection restored"


async def follow(target: Followed, args: argparse.Namespace, say: Say,
                 past_ready: bool = False) -> int:
    """Start the run and follow it to its verdict (the exit code); `past_ready`: keep watching
    after READY until the run dies or stalls (`wait --until dead`; the demo shows a death while
    serving)."""
    events = target.subscribe()
    opening = target.opening(args.launch)
    if opening:
        say(opening)
    if args.timeout is not None:
        target.server.limit_ready(args.timeout, "--timeout")
    starting: asyncio.Task[RunInfo] | None = asyncio.create_task(target.start(args))
    try:
        return await _follow(target, events, starting, say, past_ready)
    finally:
        if not starting.done():  # the run ended while the others were still starting
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting


async def _next(events: asyncio.Queue[Any], starting: asyncio.Task[RunInfo] | None) -> object:
    """The next event, or None when the run finished starting first."""
    if starting is None:
        return await events.get()
    getter = asyncio.ensure_future(events.get())
    await asyncio.wait({getter, starting}, return_when=asyncio.FIRST_COMPLETED)
    if getter.done():
        return getter.result()
    getter.cancel()  # nothing was taken off the queue
    return None


async def _follow(target: Followed, events: asyncio.Queue[Any],
                  starting: asyncio.Task[RunInfo] | None, say: Say, past_ready: bool) -> int:
    decile = -1
    while True:
        event = await _next(events, starting)
        if starting is not None and starting.done():
            run = starting.result()  # a refusal or an error ends the command here
            starting = None
            verb = "attached to" if run.attached else "launched"
            say(f"{verb} run {run.run_id} on {target.server.profile.host.target} "
                f"(pid {run.pid})", run_id=run.run_id, pid=run.pid, attached=run.attached)
        seen = target.seen(event) if event is not None else None
        if seen is None:
            continue
        inner = seen.event
        if target.is_death(inner):
            return await _dead(target, say)
        if isinstance(inner, Joined):
            say(seen.words(f"joined after {duration(inner.after)}"), **seen.fields)
        elif isinstance(inner, Fatal):
            say("ERROR: " + seen.words(inner.text), state="error", **seen.fields)
            return EXIT_ERROR
        elif isinstance(inner, (LinkLost, LinkRestored)):
            say(target.link_words(seen), lost=isinstance(inner, LinkLost), **seen.fields)
        elif isinstance(inner, Notice):
            say(seen.words(inner.text), **seen.fields)
        elif isinstance(inner, JobEnding):
            say(seen.words(f"TIME LIMIT NEAR: {inner.words()}"), state="ending",
                job_id=inner.job_id, left_s=round(inner.left_s), **seen.fields)
        elif isinstance(inner, ProgressChanged):
            if (seen.serves and inner.phase is Phase.WEIGHTS and inner.progress is not None
                    and int(inner.progress * 10) > decile):
                decile = int(inner.progress * 10)
                shards = f" ({inner.shards[0]}/{inner.shards[1]} shards)" if inner.shards else ""
                say(seen.words(f"{inner.phase.label} {inner.progress:.0%}{shards}"),
                    progress=inner.progress, **seen.fields)
        elif not isinstance(inner, Died):  # a member's death: the run's follows it
            for line in describe(inner):
                say(seen.words(line), state=seen.state, **seen.fields)
            code = await _verdict(target, events, seen, say, past_ready)
            if code is not None:
                return code


async def _verdict(target: Followed, events: asyncio.Queue[Any], seen: Seen, say: Say,
                   past_ready: bool) -> int | None:
    """The exit code when the serving member's event ends the wait, after what goes with it
    (the serving figures, the stacks of a stall, the kill of a launch given up on)."""
    inner = seen.event
    if not seen.serves:
        return None
    if isinstance(inner, Ready) and not past_ready:
        await _serving_at_ready(events, target.server, say)
        return EXIT_READY
    if isinstance(inner, Stalled):
        if target.server.profile.expect.stacks_on_stall:
            await _stall_stacks(target, events, say)
        return EXIT_STALLED
    if isinstance(inner, ReadyTimedOut):
        if inner.limit.kill:
            await _given_up(target, events, say)
        return EXIT_TIMEOUT
    return None


async def _dead(target: Followed, say: Say) -> int:
    """The run's death, after late lines had their moment to name the cause."""
    end = time.monotonic() + CAUSE_GRACE_S
    while time.monotonic() < end:
        found = target.death()
        if found is not None and found[1].cause is not None and (
                found[1].code is not None or found[1].signal is not None):
            break
        await asyncio.sleep(0.02)
    found = target.death()
    assert found is not None
    where, death = found
    for line in death_lines(death):
        say(where.words(line), state="dead", **where.fields, process=death.process,
            pid=death.pid, code=death.code, signal=death.signal,
            since_launch=round(death.since_launch, 3),
            root_cause=death.cause.line if death.cause else None)
    return EXIT_DEAD


async def _serving_at_ready(events: asyncio.Queue[Any], sup: Supervisor, say: Say) -> None:
    """Once at READY: what the server says it is doing (its /metrics, else its stats line)."""
    end = time.monotonic() + SERVING_WAIT_S
    while sup.machine.serving.latest is None and (left := end - time.monotonic()) > 0:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(events.get(), left)
    sample = sup.machine.serving.latest
    if sample is not None:
        say("serving: " + serving_words(sample), serving=sample.figures(),
            source=sample.source)


async def _stall_stacks(target: Followed, events: asyncio.Queue[Any], say: Say) -> None:
    """The stacks the supervisor takes on a stall: where each process is, and where the whole
    dump is saved on the host (or why there is none)."""
    end = time.monotonic() + STACKS_WAIT_S
    while (left := end - time.monotonic()) > 0:
        try:
            seen = target.seen(await asyncio.wait_for(events.get(), left))
        except asyncio.TimeoutError:
            break
        if seen is None or not seen.serves:
            continue
        if isinstance(seen.event, StacksTaken):
            taken = seen.event
            say(f"stacks of {len(taken.stacks)} processes (py-spy, {taken.why}), saved "
                f"on the host: {taken.path}", stacks=taken.path)
            for stack in taken.stacks:
                say(f"  {stack.summary()}")
            return
        if isinstance(seen.event, Notice) and seen.event.text.startswith("no stacks"):
            say(seen.event.text)
            return
    say(f"no stacks within {STACKS_WAIT_S:.0f}s (py-spy did not answer)")


async def _given_up(target: Followed, events: asyncio.Queue[Any], say: Say) -> None:
    """on_ready_timeout = "kill": the supervisor kills the run; what remains, host by host."""
    kill = target.server.giving_up
    if kill is not None:
        await asyncio.wait({kill})  # its failure is a Notice, said below
    while not events.empty():
        seen = target.seen(events.get_nowait())
        if seen is None:
            continue
        if isinstance(seen.event, KillDone):
            killed = seen.event.killed
            if killed.remaining:
                say(seen.words(f"STILL RUNNING: {', '.join(map(str, killed.remaining))}"),
                    **seen.fields)
            else:
                say(seen.words(f"killed: no process of the run remains; "
                               f"{gpu_verdict(killed)[1]}"), **seen.fields)
        elif isinstance(seen.event, Notice):
            say(seen.words(seen.event.text), **seen.fields)
