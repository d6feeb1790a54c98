"""`launch`, `kill` and `check` for a profile that spans several hosts (supervise.group); its
`wait` is the single-host one's loop (tui.cli.follow).

The lines are those of a single-host run, each prefixed with the host and the member it is
about ("gpu-b ray-node-1: ..."), plus the joins; the exit codes are the same.
"""

from __future__ import annotations

import argparse

from tui.cli.exit_codes import EXIT_DEAD, EXIT_ERROR, EXIT_PREFLIGHT
from tui.core.cluster import SERVER
from tui.core.describe import gpu_verdict
from tui.core.errors import PreflightFailed
from tui.core.logline import strip_escapes
from tui.core.units import duration
from tui.supervise.group import ClusterRun, Joined, RunDied


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
    """Preflight on every host, each check under its host; 6 when any host refuses. A
    several-node Slurm job's is the scheduler's answer, once (its nodes are not known yet)."""
    refused = False
    asked = [group.part(SERVER)] if group.profile.slurm is not None else group.parts
    for m in asked:
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
