"""What the benchmarks share: percentiles, simulated runs under a Supervisor (locally or through
the in-process SSH server), the moment a simulated worker died, and a process's CPU cost."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE.parent), str(ROOT)]

from helpers import sim_profile  # noqa: E402
from sshserver import SSHTestServer  # noqa: E402

from tui.core.profile import Profile, load_profile  # noqa: E402
from tui.core.state import Died  # noqa: E402
from tui.remote.session import open_session  # noqa: E402
from tui.supervise.supervisor import Supervisor  # noqa: E402

T = TypeVar("T")
Figures = dict[str, Any]


def pct(samples: list[float], p: float) -> float:
    """Nearest-rank percentile (p99 of 50 samples is the largest: no interpolation)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def spread(samples: list[float], unit: str = "ms") -> str:
    return (f"p50 {statistics.median(samples):7.1f} {unit}  p99 {pct(samples, 99):7.1f} {unit}"
            f"  max {max(samples):7.1f} {unit}  (n={len(samples)})")


def say(text: str) -> None:
    print(text, flush=True)


def profile_for(tmp: Path, scenario: str, *, target: str = "local", time_scale: float = 40.0,
                args: tuple[str, ...] = (), tp: int | None = None) -> Profile:
    """A simulated-engine profile under `tmp`, with extra engine arguments and TP if given."""
    profile = load_profile(sim_profile(tmp, scenario, target=target, time_scale=time_scale))
    server = dataclasses.replace(profile.server, args=(*profile.server.args, *args))
    if tp is not None:
        server = dataclasses.replace(server, tensor_parallel_size=tp)
    return dataclasses.replace(profile, server=server)


def supervisor(profile: Profile, ssh_config: str | None) -> Supervisor:
    async def opener(host: object) -> object:
        return await open_session(host, ssh_config=ssh_config)

    return Supervisor(profile, opener=opener)  # type: ignore[arg-type]


def first_death(tmp: Path) -> float:
    """Epoch time a simulated worker stamped just before exiting (the first, if several)."""
    deaths = (tmp / "gpus" / "deaths.jsonl").read_text().splitlines()
    return min(json.loads(line)["time"] for line in deaths)


async def until_died(sup: Supervisor, queue: asyncio.Queue[Any], timeout: float = 60) -> Died:
    while not isinstance(event := await asyncio.wait_for(queue.get(), timeout), Died):
        pass
    return event


async def each_target(runs: int, one: Callable[[Path, str, str | None], Awaitable[T]],
                      targets: tuple[str, ...] = ("local", "ssh"),
                      ) -> AsyncIterator[tuple[str, list[T]]]:
    """`runs` measurements per target: locally, then through the in-process SSH server."""
    with tempfile.TemporaryDirectory() as base:
        server = SSHTestServer(Path(base) / "ssh")
        await server.start()
        try:
            for label in targets:
                target, cfg = (("local", None) if label == "local"
                               else (server.alias, str(server.ssh_config)))
                results = []
                for i in range(runs):
                    tmp = Path(base) / f"{label}{i}"
                    tmp.mkdir()
                    results.append(await one(tmp, target, cfg))
                yield label, results
        finally:
            await server.stop()


@asynccontextmanager
async def launched(sup: Supervisor) -> AsyncIterator[asyncio.Queue[Any]]:
    """The run launched (no preflight) and its events; killed and closed afterwards."""
    queue = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        yield queue
    finally:
        await sup.kill(1.0)
        await sup.close()


def agent_process() -> psutil.Process:
    """The watch agent this process started (locally it is a child: `python3 - … watch`)."""
    return next(p for p in psutil.Process().children(recursive=True)
                if p.cmdline()[-1:] == ["watch"])


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


@contextmanager
def cpu_share(proc: psutil.Process) -> Iterator[dict[str, float]]:
    """Fills in `pct` (percent of one core) and `rss_mib` over the `with` block."""
    out: dict[str, float] = {}
    cpu, start = cpu_seconds(proc), time.monotonic()
    yield out
    out["pct"] = 100 * (cpu_seconds(proc) - cpu) / (time.monotonic() - start)
    out["rss_mib"] = proc.memory_info().rss / 2**20
