"""1. Death → DEAD: a simulated worker dies of the story's SyntaxError (it stamps the moment just
before `os._exit`); how long until (a) the Supervisor's Died event and (b) the DEAD banner is
drawn by the console (Textual, headless run_test; the moment after the next refresh), locally
and over SSH on loopback through the in-process asyncssh server.

What a user would otherwise get, on deaths of the same kind (at a slower time scale, so that
the workers live for several seconds, and a poll at a random phase sees them):
- `wait` on the top process (pidfd on the API server): it exits only when vLLM's own shutdown
  has run its course, seconds after the worker (reported in simulated seconds); with exit code
  0 when the engine dies while serving (a separate engine-killed run shows the code);
- a 2 s polling loop (the run's process tree every 2 s; a pid gone = a death).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import statistics
import time
from pathlib import Path

import psutil
from common import (
    Figures,
    each_target,
    first_death,
    launched,
    pct,
    profile_for,
    say,
    spread,
    supervisor,
    until_died,
)

from tui.sim import timeline

SCALE = 40.0  # the worker dies 23 simulated s after launch: 0.6 s
BASELINE_SCALE = 4.0  # workers from 4.5 s (+ start-up) to their death at 5.8 s: a poll sees them
WORKERS_UP = (timeline.WORKER_INIT + 1) / BASELINE_SCALE
POLL_S = 2.0


async def _pidfd_exit(pid: int) -> float:
    """When `pid` (not our child) exits: the moment its pidfd becomes readable."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    fd = os.pidfd_open(pid)
    loop.add_reader(fd, lambda: done.done() or done.set_result(time.time()))
    try:
        return await asyncio.wait_for(done, 60)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _tree(pid: int) -> set[int]:
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return set()
    alive = set()
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.add(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


async def _poll_loop(pid: int) -> float:
    """A user's watchdog: the tree every 2 s; the first poll that misses a pid."""
    seen = _tree(pid)
    while True:
        await asyncio.sleep(POLL_S)
        now = _tree(pid)
        if seen - now:
            return time.time()
        seen = now


def _exit_code(run_dir: str) -> int | None:
    path = Path(run_dir) / "exit.json"
    for _ in range(100):
        if path.exists():
            return json.loads(path.read_text()).get("code")
        time.sleep(0.02)
    return None


async def _one_event(tmp: Path, target: str, ssh_config: str | None) -> dict[str, float]:
    sup = supervisor(profile_for(tmp, "syntax-error", target=target, time_scale=SCALE),
                     ssh_config)
    async with launched(sup) as events:
        event = await until_died(sup, events)
        seen = time.time()
        died = first_death(tmp)
        return {"event_ms": (seen - died) * 1000, "agent_ms": (event.death.at - died) * 1000}


async def _one_baseline(tmp: Path, *_: object) -> dict[str, float]:
    """`wait` on the top process and the 2 s loop (started at a random phase) on one death."""
    sup = supervisor(profile_for(tmp, "syntax-error", time_scale=BASELINE_SCALE), None)
    async with launched(sup) as events:
        assert sup.run is not None
        top = asyncio.ensure_future(_pidfd_exit(sup.run.pid))
        await asyncio.sleep(WORKERS_UP + random.uniform(0, POLL_S))
        poll = asyncio.ensure_future(_poll_loop(sup.run.pid))
        await until_died(sup, events)
        died = first_death(tmp)
        return {"top_sim_s": (await top - died) * BASELINE_SCALE,
                "poll_ms": (await poll - died) * 1000, "top_code": _exit_code(sup.run.run_dir)}


async def _engine_killed_top(tmp: Path) -> tuple[int | None, float]:
    """The engine dies while serving: `wait` on the top process returns its code (and when)."""
    sup = supervisor(profile_for(tmp, "engine-killed", time_scale=1000), None)
    async with launched(sup) as events:
        assert sup.run is not None
        top = asyncio.ensure_future(_pidfd_exit(sup.run.pid))
        event = await until_died(sup, events, timeout=120)
        return _exit_code(sup.run.run_dir), await top - event.death.at


async def _one_banner(tmp: Path, target: str, ssh_config: str | None) -> float:
    """Milliseconds from the worker's death to the first refresh after the DEAD banner."""
    from tui.console.app import ConsoleApp
    from tui.console.heap import QuietCollector, settle_heap
    from tui.console.widgets.banner import Banner

    shown: list[float] = []
    original = Banner.show

    def show(self: Banner, kind: str, title: str, detail: str = "") -> None:
        original(self, kind, title, detail)
        if kind == "dead" and not shown:
            self.call_after_refresh(lambda: shown or shown.append(time.time()))

    Banner.show = show  # type: ignore[method-assign]
    sup = supervisor(profile_for(tmp, "syntax-error", target=target, time_scale=SCALE),
                     ssh_config)
    heap = QuietCollector()
    app = ConsoleApp(sup, env={}, kill_grace=1.0, heap=heap)
    settle_heap()  # as `specconsole` does before it runs the console
    try:
        with heap:  # full collections at quiet moments, as in `specconsole`
            async with app.run_test(size=(200, 50)) as pilot:
                deadline = time.monotonic() + 60
                while not shown and time.monotonic() < deadline:
                    await pilot.pause(0.05)
                await sup.kill(1.0)
    finally:
        gc.unfreeze()
        Banner.show = original  # type: ignore[method-assign]
    return (shown[0] - first_death(tmp)) * 1000


async def run(runs: int, baseline_runs: int) -> Figures:
    figures: Figures = {}
    async for label, results in each_target(runs, _one_event):
        events = [r["event_ms"] for r in results]
        say(f"death -> DEAD event,  {label:5s}: {spread(events)}; of which death -> the "
            f"agent's exit event: p50 {statistics.median(r['agent_ms'] for r in results):.1f} ms")
        figures[f"death_event_p50_ms_{label}"] = statistics.median(events)
        figures[f"death_event_p99_ms_{label}"] = pct(events, 99)
    async for _, results in each_target(baseline_runs, _one_baseline, targets=("local",)):
        tops = [r["top_sim_s"] for r in results]
        polls = [r["poll_ms"] for r in results]
        codes = sorted({r["top_code"] for r in results}, key=str)
        say(f"  instead, `wait` on the top process: p50 {statistics.median(tops):.1f} s after "
            f"the death (simulated seconds; real vLLM 0.32: 7.7 s), exit code {codes}; "
            f"a {POLL_S:.0f} s polling loop: {spread(polls)}")
        figures |= {"wait_top_p50_s": statistics.median(tops), "wait_top_codes": codes,
                    "poll_2s_p50_ms": statistics.median(polls), "poll_2s_p99_ms": pct(polls, 99)}
    async for label, samples in each_target(runs, _one_banner):
        say(f"death -> DEAD banner, {label:5s}: {spread(samples)}")
        figures[f"death_banner_p50_ms_{label}"] = statistics.median(samples)
        figures[f"death_banner_p99_ms_{label}"] = pct(samples, 99)
    async for _, (result,) in each_target(1, lambda tmp, *_: _engine_killed_top(tmp),
                                          targets=("local",)):
        code, after = result
        say(f"  engine killed while serving: the top process exits {after:.1f} s later "
            f"(the simulation's floor; vLLM: {timeline.DEAD_SHUTDOWN:.1f}+ s) with code {code}")
        figures["wait_top_code_engine_killed"] = code
    return figures
