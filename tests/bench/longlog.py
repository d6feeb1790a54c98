"""7. A long log (1 GiB): `specconsole explain` on it, wall time and peak RSS, beside lnav's
own indexing of the same file (`lnav -n`, a query of its line count; grep -c when lnav is not
installed); and the console attaching over SSH (the in-process server on loopback) to a dead
run whose log is that long: the first screen (the log's last line drawn, DEAD and the cause on
the banner) and each page scrolled back (a page read from the host and drawn).

The log: a real vLLM 0.32 start-up, the serving firehose of `tui.sim.flood` up to the size,
then the engine core's fatal traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from common import ROOT, Figures, pct, profile_for, say, spread, supervisor
from sshserver import SSHTestServer

from tui.core.state import State
from tui.sim.flood import flood_lines

DEATH = "".join(f"(EngineCore_DP0 pid=25704) ERROR 12-04 11:02:03 [core.py:710] {text}\n"
                for text in (
                    "EngineCore encountered a fatal error.", "Traceback (most recent call last):",
                    '  File "/opt/vllm/vllm/v1/engine/core.py", line 701, in run_engine_core',
                    "    engine_core.run_busy_loop()",
                    "RuntimeError: CUDA error: an illegal memory access was encountered"))
CAUSE = "illegal memory access"


def grow(path: Path, size: int, *, startup: bool = True) -> None:
    """Append a real start-up (when asked), the firehose up to `size` bytes, the death."""
    block = "".join(f"{line}\n" for line in itertools.islice(
        flood_lines({"APIServer": 25527, "EngineCore_DP0": 25704}), 60_000)).encode()
    with path.open("ab") as f:
        if startup:
            f.write((ROOT / "tests" / "fixtures" / "vllm-real-startup.log").read_bytes())
        while f.tell() < size - len(DEATH):
            f.write(block[:size - len(DEATH) - f.tell()])
        f.write(DEATH.encode())


def _timed(argv: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB, sampled every 10 ms: the kernel's own peak of a child
    counts the memory of the parent it was forked from) and stdout of one command."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        watched = psutil.Process(proc.pid)
        while not done.is_set():
            with contextlib.suppress(psutil.Error):
                peak[0] = max(peak[0], watched.memory_info().rss / 2**20)
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    done.set()
    sampler.join()
    return time.perf_counter() - start, peak[0], out.decode(errors="replace")


def explain_figures(path: Path) -> Figures:
    size = path.stat().st_size
    specconsole = str(Path(sys.executable).with_name("specconsole"))
    wall, rss, out = _timed([specconsole, "explain", str(path)])
    found = CAUSE in out
    say(f"explain, {size / 2**30:.2f} GiB log: {wall:.1f} s, peak RSS {rss:.0f} MiB "
        f"({size / 2**20 / wall:.0f} MiB/s); the cause found: {found}")
    figures: Figures = {"explain_1gib_s": wall, "explain_1gib_rss_mib": rss,
                        "explain_1gib_found_cause": found, "explain_log_bytes": size}
    if shutil.which("lnav"):
        peer = ["lnav", "-n", "-q", "-c", ";SELECT lines FROM lnav_file", str(path)]
        name = "lnav -n (its line index, no format: it knows no vLLM log format)"
    else:
        peer, name = ["grep", "-c", "ERROR", str(path)], "grep -c ERROR (lnav not installed)"
    wall_p, rss_p, _ = _timed(peer)
    say(f"  peer {name}: {wall_p:.1f} s, peak RSS {rss_p:.0f} MiB")
    figures |= {"explain_peer": peer[0], "explain_peer_s": wall_p, "explain_peer_rss_mib": rss_p}
    return figures


async def attach_figures(base: Path, size: int, pages: int) -> Figures:
    from tui.console.app import ConsoleApp
    from tui.console.widgets.banner import Banner
    from tui.console.widgets.logs import LogView

    server = SSHTestServer(base / "ssh")
    await server.start()
    try:
        profile = profile_for(base, "ready", target=server.alias, time_scale=300)
        first = supervisor(profile, str(server.ssh_config))
        await first.launch(skip_preflight=True)
        assert first.run is not None
        while first.machine.state is not State.READY:
            await asyncio.sleep(0.05)
        group = os.getpgid(first.run.pid)
        await first.close()
        os.killpg(group, signal.SIGKILL)
        run_dir = Path(first.run.run_dir)
        while not (run_dir / "exit.json").exists():
            await asyncio.sleep(0.05)
        log = run_dir / "server.log"
        grow(log, size, startup=False)
        last = log.read_bytes()[-4096:].rstrip(b"\n").rsplit(b"\n", 1)[-1].decode()

        sup = supervisor(profile, str(server.ssh_config))
        reads: list[float] = []
        read_log = sup.read_log

        async def timed_read(begin: int, end: int) -> list[Any]:
            began = time.perf_counter()
            try:
                return await read_log(begin, end)
            finally:
                reads.append((time.perf_counter() - began) * 1000)

        sup.read_log = timed_read  # type: ignore[method-assign]
        app = ConsoleApp(sup, launch=False, env={})
        start = time.perf_counter()
        async with app.run_test(size=(200, 50)) as pilot:
            view, banner = app.query_one(LogView), app.query_one(Banner)

            def first_screen() -> bool:
                held = view.window.view(raw=False)
                return (bool(held) and held[-1].raw == last
                        and CAUSE in str(banner.render()) and "DEAD" in str(banner.render()))

            while not first_screen():
                if time.perf_counter() - start > 120:
                    raise AssertionError("no first screen after 120 s")
                await pilot.pause(0.01)
            first_s = time.perf_counter() - start
            view.focus()
            # a page: from the key reaching the view to the first refresh after the older
            # page is in (read from the host, classified, put in the window, drawn)
            keyed: list[float] = []
            drawn: list[float] = []
            prepend = view.prepend

            def timed_prepend(page: list[Any]) -> None:
                prepend(page)
                view.call_after_refresh(lambda: drawn.append(time.perf_counter()))

            view.prepend = timed_prepend  # type: ignore[method-assign]
            for _ in range(pages):
                before = view.window.start
                keyed.append(time.perf_counter())
                await pilot.press("home")
                while view.window.start >= before or len(drawn) < len(keyed):
                    await pilot.pause(0.002)
            samples = [(d - k) * 1000 for k, d in zip(keyed, drawn, strict=True)]
        await sup.close()
    finally:
        await server.stop()
    say(f"attach over SSH to a dead run with a {size / 2**30:.2f} GiB log: first screen (last "
        f"line, DEAD and the cause) {first_s:.2f} s")
    say(f"  a page scrolled back (home at the top, to the page drawn): {spread(samples)}; of "
        f"which the read from the host: p50 {statistics.median(reads):.1f} ms")
    return {"attach_1gib_first_screen_s": first_s,
            "attach_page_back_p50_ms": statistics.median(samples),
            "attach_page_back_p99_ms": pct(samples, 99),
            "attach_page_read_p50_ms": statistics.median(reads)}


def run(size: int, pages: int = 20) -> Figures:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        path = base / "long.log"
        grow(path, size)
        figures = explain_figures(path)
        path.unlink()
        figures |= asyncio.run(attach_figures(base, size, pages))
    return figures
