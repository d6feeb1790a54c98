"""`wait`, `launch`, `kill` and `check` for a profile that spans several hosts (supervise.group).

The lines are those of a single-host run, each prefixed with the host and the member it is
about ("gpu-b ray-node-1: ..."), plus the joins; the exit codes are the same: 0 ready (the
server's member), 3 dead (the first death on any host, with its cause), 4 timeout, 5 stalled.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

from tui.cli.exit_codes import (
    EXIT_DEAD,
    EXIT_ERROR,
    EXIT_PREFLIGHT,
    EXIT_READY,
    EXIT_STALLED,
    EXIT_TIMEOUT,
)
from tui.core.describe import death_lines, describe, duration, gpu_verdict
from tui.core.errors import PreflightFailed
from tui.core.logline import strip_escapes
from tui.core.phases import Phase
from tui.core.state import ProgressChanged, Ready, Stalled
from tui.supervise.group import ClusterRun, Joined, MemberEvent, RunDied
from tui.supervise.supervisor import CAUSE_GRACE_S, Fatal, LinkLost, LinkRestored, Notice

Say = Callable[..., None]


def link_words(host: str, event: LinkLost | LinkRestored) -> str:
    """A dropped link is the host lost (not a death): its processes are not known dead."""
    if isinstance(event, LinkLost):
        return (f"{host} LOST: connection lost, retrying in {event.retry_in:.1f}s — "
                f"{event.reason}")
    return f"{host} back: connection restored"


async def wait_cluster(group: ClusterRun, args: argparse.Namespace, say: Say) -> int:
    """Start (attach or launch, in order) and follow every host until ready, dead, stalled
    or the timeout; what happens while the hosts join is said as it happens."""
    events = group.subscribe()
    hosts = ", ".join(f"{m.host} ({m.name})" for m in group.parts)
    say(f"{'launching' if args.launch else 'following'} {group.name} on {hosts}")
    starting = asyncio.create_task(group.start(
        launch=args.launch, skip_preflight=args.skip_preflight,
        kill_leftovers=args.kill_leftovers))
    deadline = time.monotonic() + args.timeout if args.timeout is not None else None
    decile = -1
    while True:
        if starting is not None and starting.done():
            run = starting.result()  # a refusal or an error ends the command here
            starting = None
            verb = "attached to" if run.attached else "launched"
            say(f"{verb} run {run.run_id} on {group.profile.host.target} (pid {run.pid})",
                run_id=run.run_id, pid=run.pid, attached=run.attached)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            state = group.server.machine.state.value
            say(f"TIMEOUT after {duration(args.timeout)}; still {state}", state=state)
            return EXIT_TIMEOUT
        try:
            event = await asyncio.wait_for(events.get(), min(left or 0.2, 0.2))
        except asyncio.TimeoutError:
            continue
        if isinstance(event, RunDied):
            return await _dead(group, say)
        if isinstance(event, Joined):
            say(f"{event.host} {event.member}: joined after {duration(event.after)}",
                host=event.host, member=event.member)
            continue
        if isinstance(event, Notice):
            say(event.text)
            continue
        if not isinstance(event, MemberEvent):
            continue
        inner, serves = event.event, event.member == "server"
        where = f"{event.host} {event.member}"
        if isinstance(inner, Fatal):
            say(f"ERROR: {where}: {inner.text}", state="error", host=event.host)
            return EXIT_ERROR
        if isinstance(inner, (LinkLost, LinkRestored)):
            say(link_words(event.host, inner), host=event.host,
                lost=isinstance(inner, LinkLost))
        elif isinstance(inner, Notice):
            say(f"{where}: {inner.text}", host=event.host)
        elif isinstance(inner, ProgressChanged):
            if (serves and inner.phase is Phase.WEIGHTS and inner.progress is not None
                    and int(inner.progress * 10) > decile):
                decile = int(inner.progress * 10)
                say(f"{where}: {inner.phase.label} {inner.progress:.0%}",
                    progress=inner.progress)
        else:
            state = group.sups[event.member].machine.state.value
            for line in describe(inner):
                say(f"{where}: {line}", state=state, host=event.host)
            if serves and isinstance(inner, Ready):
                return EXIT_READY
            if serves and isinstance(inner, Stalled):
                return EXIT_STALLED


async def _dead(group: ClusterRun, say: Say) -> int:
    """The run's death, after late lines had their moment to name the cause."""
    end = time.monotonic() + CAUSE_GRACE_S
    while time.monotonic() < end:
        found = group.death()
        if found is not None and found[1].cause is not None and (
                found[1].code is not None or found[1].signal is not None):
            break
        await asyncio.sleep(0.02)
    found = group.death()
    assert found is not None
    member, death = found
    for line in death_lines(death):
        say(f"{member.host} {member.name}: {line}", state="dead", host=member.host,
            member=member.name, process=death.process, pid=death.pid, code=death.code,
            signal=death.signal, since_launch=round(death.since_launch, 3),
            root_cause=death.cause.line if death.cause else None)
    return EXIT_DEAD


async def launch_cluster(group: ClusterRun, args: argparse.Namespace) -> int:
    events = group.subscribe()
    run = await group.launch(skip_preflight=args.skip_preflight,
                             kill_leftovers=args.kill_leftovers)
    while not events.empty():
        event = events.get_nowait()
        if isinstance(event, Joined):
            print(f"{event.host} {event.member}: joined after {duration(event.after)}")
        elif isinstance(event, RunDied):
            print(f"{event.host} {event.member}: DEAD while joining — {event.death.summary()}")
            return EXIT_DEAD
    print(f"launched run {run.run_id} on {group.profile.host.target} (pid {run.pid}) and "
          f"{len(group.parts) - 1} more members; follow it with: specconsole wait "
          f"{args.profile}")
    return 0


async def kill_cluster(group: ClusterRun, grace: float) -> int:
    """Every member's newest run, the server first; what remains, host by host."""
    await group.start(launch=False)
    print(f"killing {group.name} on every host: TERM, KILL after {grace:g}s, then sweep by "
          "run id")
    killed = await group.kill(grace)
    code = 0
    for name, result in killed.items():
        member = group.part(name)
        if result.remaining:
            print(f"{member.host} {name}: STILL RUNNING: "
                  f"{', '.join(map(str, result.remaining))}")
            code = EXIT_ERROR
            continue
        released, gpu = gpu_verdict(result)
        print(f"{member.host} {name}: no process of the run remains; {gpu}")
        code = code if released else EXIT_ERROR
    return code


async def check_cluster(group: ClusterRun) -> int:
    """Preflight on every host, each check under its host; 6 when any host refuses."""
    refused = False
    for m in group.parts:
        sup = group.sups[m.name]
        if not m.profile.preflight.enabled:
            print(f"{m.host} {m.name}: preflight switched off")
            continue
        try:
            checks = await sup.run_preflight()
        except PreflightFailed:
            checks, refused = sup.last_checks, True
        for c in checks:
            mark = "ok  " if c.ok else ("FAIL" if c.severity == "error" else "warn")
            print(f"{m.host} {m.name}: {mark} {c.check}: {strip_escapes(c.message)}")
    return EXIT_PREFLIGHT if refused else 0
