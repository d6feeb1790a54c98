"""3. The firehose: the simulated engine, serving, writes `--sim-flood 20000` lines a second into
a running console (Textual, headless run_test, 200×50, following the log). Meanwhile:
- a key press (`f`, raw/filtered) every 250 ms: the time from the press to its action running;
- frozen frames: the console's event loop is watched by a task that asks to wake every 5 ms;
  a wake-up more than 100 ms late is a frame the console could not draw;
- the console's CPU and peak RSS, and whether it kept up (bytes read vs bytes written);
- the agent's CPU and RSS while it streams the firehose (item 4, under load);
- the full (generation 2) garbage collections in the window, and the longest (gc.callbacks),
  then what one full pass finds after it: the cyclic garbage the window left behind.
The console runs as `specconsole` runs it (tui/heap.py): Textual's caches untied, start-up heap
frozen, full collections only at quiet moments. For A/B comparisons, SPECCONSOLE_BENCH_GC=auto
leaves CPython's automatic full collections on, and =before also leaves Textual's caches tied
(the console before tui/heap.py: only the start-up heap frozen; run it alone, `--only firehose`,
as another bench's settle_heap unties them for the whole process).
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from common import Figures, agent_process, cpu_share, pct, profile_for, say, supervisor

from tui.console.heap import QuietCollector, settle_heap
from tui.core.state import State
from tui.supervise.supervisor import Supervisor

RATE = 20_000
FROZEN_MS = 100.0


async def _loop_lag(gaps: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(0.005)
        gaps.append((time.perf_counter() - start - 0.005) * 1000)


async def _rss_peak(proc: psutil.Process, peak: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss / 2**20)
        await asyncio.sleep(0.25)


class _Passes:
    """The garbage collections while it is open, by generation: each one's milliseconds and
    how many unreachable objects it freed."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.collected: dict[int, int] = {0: 0, 1: 0, 2: 0}
        self.started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.pauses[info["generation"]].append((time.perf_counter() - self.started) * 1000)
            self.collected[info["generation"]] += info["collected"]

    def __enter__(self) -> _Passes:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


async def _drive(app: Any, sup: Supervisor, seconds: float, acted: list[float]) -> Figures:
    """Wait for serving, then press keys for `seconds` while the watchers watch."""
    me = psutil.Process()
    async with app.run_test(size=(200, 50)) as pilot:
        deadline = time.monotonic() + 120
        while sup.machine.state is not State.READY and time.monotonic() < deadline:
            await pilot.pause(0.1)
        await pilot.pause(1.0)  # the flood starts with serving
        assert sup.run is not None
        log = Path(sup.run.run_dir) / "server.log"
        agent = agent_process()
        stop = asyncio.Event()
        gaps: list[float] = []
        peak = [0.0]
        watchers = [asyncio.ensure_future(_loop_lag(gaps, stop)),
                    asyncio.ensure_future(_rss_peak(me, peak, stop))]
        size0, read0 = log.stat().st_size, sup.log_end
        latencies: list[float] = []
        rss0 = me.memory_info().rss / 2**20
        with (cpu_share(me) as console, cpu_share(agent) as agent_cost,
              _Passes() as passes):
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                pressed = time.perf_counter()
                before = len(acted)
                await pilot.press("f")
                while len(acted) == before:
                    await asyncio.sleep(0.001)
                latencies.append((acted[before] - pressed) * 1000)
                await asyncio.sleep(0.25)
        size1, read1 = log.stat().st_size, sup.log_end
        rss1 = me.memory_info().rss / 2**20
        stop.set()
        await asyncio.gather(*watchers)
        t0 = time.perf_counter()
        found = gc.collect()  # the cyclic garbage the window left for a full pass
        found_ms = (time.perf_counter() - t0) * 1000
        await sup.kill(1.0)
    frozen = [g for g in gaps if g > FROZEN_MS]
    return {"firehose_key_p50_ms": statistics.median(latencies),
            "firehose_key_p99_ms": pct(latencies, 99), "firehose_key_presses": len(latencies),
            "firehose_frozen_frames": len(frozen), "firehose_longest_stall_ms": max(gaps),
            "firehose_stall_p99_ms": pct(gaps, 99),
            "firehose_console_cpu_pct": console["pct"], "firehose_rss_peak_mib": peak[0],
            "firehose_rss_start_mib": rss0, "firehose_rss_end_mib": rss1,
            "firehose_full_gcs": len(passes.pauses[2]),
            "firehose_full_gc_longest_ms": max(passes.pauses[2], default=0.0),
            "firehose_full_gc_freed": passes.collected[2],
            "firehose_young_gc_longest_ms": max(passes.pauses[0] + passes.pauses[1],
                                                default=0.0),
            "firehose_young_gc_freed": passes.collected[0] + passes.collected[1],
            "firehose_garbage_after": found, "firehose_garbage_after_ms": found_ms,
            "firehose_written_mib_s": (size1 - size0) / seconds / 2**20,
            "firehose_read_mib_s": (read1 - read0) / seconds / 2**20,
            "firehose_behind_kib": (size1 - read1) / 2**10,
            "agent_cpu_pct_flood": agent_cost["pct"], "agent_rss_mib_flood": agent_cost["rss_mib"]}


async def run(seconds: float, rate: int = RATE) -> Figures:
    from tui.console.app import ConsoleApp

    arm = os.environ.get("SPECCONSOLE_BENCH_GC", "quiet")
    automatic = arm in ("auto", "before")
    heap = None if automatic else QuietCollector()
    with tempfile.TemporaryDirectory() as base:
        sup = supervisor(profile_for(Path(base), "ready", time_scale=1000,
                                     args=("--sim-flood", str(rate))), None)
        app = ConsoleApp(sup, env={}, kill_grace=1.0, heap=heap)
        acted: list[float] = []
        original = app.action_toggle_raw

        def toggle_raw() -> None:
            acted.append(time.perf_counter())
            original()

        app.action_toggle_raw = toggle_raw  # type: ignore[method-assign]
        if arm == "before":
            gc.collect()
            gc.freeze()
        else:
            settle_heap()  # as `specconsole` does before it runs the console
        try:
            if heap is None:
                f = await _drive(app, sup, seconds, acted)
            else:
                with heap:
                    f = await _drive(app, sup, seconds, acted)
        finally:
            gc.unfreeze()
    say(f"firehose {rate:,} lines/s for {seconds:.0f} s: key -> action: p50 "
        f"{f['firehose_key_p50_ms']:.1f} ms, p99 {f['firehose_key_p99_ms']:.1f} ms "
        f"(n={f['firehose_key_presses']})")
    say(f"  frozen frames (> {FROZEN_MS:.0f} ms): {f['firehose_frozen_frames']}, longest loop "
        f"stall {f['firehose_longest_stall_ms']:.0f} ms (p99 {f['firehose_stall_p99_ms']:.1f} "
        f"ms); console CPU {f['firehose_console_cpu_pct']:.0f} % of a core, peak RSS "
        f"{f['firehose_rss_peak_mib']:.0f} MiB; read {f['firehose_read_mib_s']:.2f} of "
        f"{f['firehose_written_mib_s']:.2f} MiB/s written, {f['firehose_behind_kib']:.0f} KiB "
        "behind at the end")
    say(f"  full garbage collections ({arm}: {'automatic' if automatic else 'at quiet moments'}): "
        f"{f['firehose_full_gcs']} in {seconds:.0f} s, the longest "
        f"{f['firehose_full_gc_longest_ms']:.0f} ms, freeing {f['firehose_full_gc_freed']:,} "
        f"objects; young ones: the longest {f['firehose_young_gc_longest_ms']:.0f} ms, freeing "
        f"{f['firehose_young_gc_freed']:,}")
    say(f"  RSS {f['firehose_rss_start_mib']:.0f} -> {f['firehose_rss_end_mib']:.0f} MiB over "
        f"the window; one full pass after it freed {f['firehose_garbage_after']:,} objects in "
        f"{f['firehose_garbage_after_ms']:.0f} ms (the cyclic garbage left for it)")
    say(f"  the agent streaming it: {f['agent_cpu_pct_flood']:.1f} % of a core, "
        f"RSS {f['agent_rss_mib_flood']:.0f} MiB")
    return f
