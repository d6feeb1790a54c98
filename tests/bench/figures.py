"""Figures for the headless core, printed (not asserted): run `python tests/bench/figures.py`.

1. Death → DEAD event: a simulated worker dies of the story's SyntaxError (it writes the moment
   just before exiting); the time until the Supervisor emits Died, locally and over SSH on
   loopback through the in-process asyncssh server. N runs each; median and p90.
2. Death → DEAD banner drawn in the console (Textual, headless run_test), the same way.
3. The agent's CPU cost: CPU seconds per minute of the watch agent while it watches a running
   simulated launch (API server, engine core, 8 workers = 10 processes) with 8 fake GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from helpers import sim_profile  # noqa: E402
from sshserver import SSHTestServer  # noqa: E402

from tui.core.profile import load_profile  # noqa: E402
from tui.core.state import Died  # noqa: E402
from tui.remote.session import open_session  # noqa: E402
from tui.supervisor import Supervisor  # noqa: E402


def _spread(samples: list[float]) -> str:
    ordered = sorted(samples)
    return (f"median {statistics.median(ordered):6.1f} ms  p90 "
            f"{ordered[int(0.9 * (len(ordered) - 1))]:6.1f} ms  max {ordered[-1]:6.1f} ms ")


async def _one_death(tmp: Path, target: str, ssh_config: str | None) -> tuple[float, float]:
    profile = load_profile(sim_profile(tmp, "syntax-error", target=target, time_scale=20))

    async def opener(host: object) -> object:
        return await open_session(host, ssh_config=ssh_config)

    sup = Supervisor(profile, opener=opener)
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        while not isinstance(event := await asyncio.wait_for(events.get(), 30), Died):
            pass
        seen = time.time()
        deaths = [json.loads(x) for x in (tmp / "gpus" / "deaths.jsonl").read_text().splitlines()]
        died = min(d["time"] for d in deaths)
        return (seen - died) * 1000, (event.death.at - died) * 1000
    finally:
        await sup.kill(1.0)
        await sup.close()


async def _local_and_ssh(runs: int, one: Callable[[Path, str, str | None], Awaitable[T]],
                         ) -> AsyncIterator[tuple[str, list[T]]]:
    """`runs` measurements locally, then as many through the in-process SSH server."""
    with tempfile.TemporaryDirectory() as base:
        server = SSHTestServer(Path(base) / "ssh")
        await server.start()
        try:
            for label, target, cfg in (("local", "local", None),
                                       ("ssh", server.alias, str(server.ssh_config))):
                results = []
                for i in range(runs):
                    tmp = Path(base) / f"{label}{i}"
                    tmp.mkdir()
                    results.append(await one(tmp, target, cfg))
                yield label, results
        finally:
            await server.stop()


async def death_latency(runs: int) -> None:
    async for label, results in _local_and_ssh(runs, _one_death):
        at_agent = [agent for _, agent in results]
        print(f"death -> DEAD event, {label:5s}: {_spread([t for t, _ in results])} (n={runs}; "
              f"of which death -> agent's exit event: median {statistics.median(at_agent):.1f} "
              "ms)", flush=True)


async def _one_banner(tmp: Path, target: str, ssh_config: str | None) -> float:
    """Milliseconds from the worker's death to the DEAD banner's update in the console."""
    from tui.app import ConsoleApp
    from tui.widgets.banner import Banner

    profile = load_profile(sim_profile(tmp, "syntax-error", target=target, time_scale=20))

    async def opener(host: object) -> object:
        return await open_session(host, ssh_config=ssh_config)

    shown: list[float] = []
    original = Banner.show

    def show(self: Banner, kind: str, title: str, detail: str = "") -> None:
        original(self, kind, title, detail)
        if kind == "dead" and not shown:
            shown.append(time.time())

    Banner.show = show  # type: ignore[method-assign]
    sup = Supervisor(profile, opener=opener)
    app = ConsoleApp(sup, env={}, kill_grace=1.0)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            deadline = time.monotonic() + 30
            while not shown and time.monotonic() < deadline:
                await pilot.pause(0.05)
            await sup.kill(1.0)
    finally:
        Banner.show = original  # type: ignore[method-assign]
    deaths = [json.loads(x) for x in (tmp / "gpus" / "deaths.jsonl").read_text().splitlines()]
    return (shown[0] - min(d["time"] for d in deaths)) * 1000


async def banner_latency(runs: int) -> None:
    async for label, samples in _local_and_ssh(runs, _one_banner):
        print(f"death -> DEAD banner, {label:5s}: {_spread(samples)} (n={runs})", flush=True)


async def agent_cpu(seconds: float) -> None:
    with tempfile.TemporaryDirectory() as base:
        tmp = Path(base)
        profile = load_profile(sim_profile(tmp, "ready", time_scale=1.0))
        sup = Supervisor(profile)
        sup.subscribe()
        try:
            await sup.launch(skip_preflight=True)
            await asyncio.sleep(25)  # the simulated tree is complete ~16 s after launch
            agent = next(p for p in psutil.Process().children(recursive=True)
                         if p.cmdline()[-1:] == ["watch"])
            tree = len(psutil.Process(sup.run.pid).children(recursive=True)) + 1 if sup.run else 0
            before = sum(agent.cpu_times()[:2])
            await asyncio.sleep(seconds)
            used = sum(agent.cpu_times()[:2]) - before
            print(f"agent CPU while watching {tree} processes + 8 fake GPUs: "
                  f"{used / seconds * 60:.2f} CPU s/min = {used / seconds * 100:.2f} % of a core "
                  f"(over {seconds:.0f} s; RSS {agent.memory_info().rss / 2**20:.1f} MiB)")
        finally:
            await sup.kill(1.0)
            await sup.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cpu-seconds", type=float, default=60.0)
    args = parser.parse_args()
    asyncio.run(death_latency(args.runs))
    asyncio.run(banner_latency(args.runs))
    asyncio.run(agent_cpu(args.cpu_seconds))


if __name__ == "__main__":
    main()
