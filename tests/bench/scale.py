"""5. Scale: one console process supervising 1, 4 and 16 launches at once (simulated engines,
TP=2 so 16 of them are 64 server processes on this machine, local sessions): the console's CPU
(percent of one core) and RSS growth while they all load, then the death latency of each (every
launch dies of the story's SyntaxError). The cost should grow no faster than the launches.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import psutil
from common import (
    Figures,
    cpu_share,
    first_death,
    launched,
    pct,
    profile_for,
    say,
    supervisor,
    until_died,
)

from tui.supervise.supervisor import Supervisor

SCALE = 2.5  # the workers die 23 simulated s after launch: 9.2 s
WINDOW = (3.0, 8.0)  # seconds after the launches: all loading, none dead yet


async def _died_at(sup: Supervisor, queue: asyncio.Queue[Any]) -> float:
    await until_died(sup, queue)
    return time.time()


async def _many(n: int) -> dict[str, float]:
    me = psutil.Process()
    rss0 = me.memory_info().rss
    with tempfile.TemporaryDirectory() as base:
        tmps = [Path(base) / f"run{i}" for i in range(n)]
        async with AsyncExitStack() as stack:
            for tmp in tmps:
                tmp.mkdir()
            sups = [supervisor(profile_for(tmp, "syntax-error", time_scale=SCALE, tp=2), None)
                    for tmp in tmps]
            start = time.monotonic()
            queues = await asyncio.gather(*(stack.enter_async_context(launched(s))
                                            for s in sups))
            await asyncio.sleep(max(0.0, start + WINDOW[0] - time.monotonic()))
            with cpu_share(me) as cost:
                await asyncio.sleep(max(0.0, start + WINDOW[1] - time.monotonic()))
            rss = (me.memory_info().rss - rss0) / 2**20
            seen = await asyncio.gather(*(_died_at(s, q)
                                          for s, q in zip(sups, queues, strict=True)))
            latencies = [(at - first_death(tmp)) * 1000 for at, tmp in zip(seen, tmps,
                                                                          strict=True)]
    return {"cpu_pct": cost["pct"], "rss_mib": rss, "death_p50_ms": statistics.median(latencies),
            "death_max_ms": pct(latencies, 100)}


async def run(counts: tuple[int, ...] = (1, 4, 16)) -> Figures:
    figures: Figures = {}
    for n in counts:
        r = await _many(n)
        say(f"{n:2d} launches: console CPU {r['cpu_pct']:5.1f} % of a core "
            f"({r['cpu_pct'] / n:.2f} % each), RSS +{r['rss_mib']:.0f} MiB; death -> DEAD "
            f"event: p50 {r['death_p50_ms']:.0f} ms, max {r['death_max_ms']:.0f} ms")
        figures |= {f"scale_{n}_{key}": value for key, value in r.items()}
    return figures
