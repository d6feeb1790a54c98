"""2. The log core: lines per second through decode → noise → phase → root cause
(`LaunchMachine.feed_lines`, chunks of 1000 lines as the agent sends them under load) on a
vLLM-shaped log: a real vLLM 0.32 start-up, then the serving firehose of `tui.sim.flood`. In the
same run and on the same file, `grep -v -e FutureWarning -e 'frozen importlib' -e deprecated`
as the baseline, and what bounds the core: each stage alone, and the floor CPython sets
(one `isprintable` pass and the two objects every line must become, a LogLine and a LineAdded).
"""

from __future__ import annotations

import gc
import itertools
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import ROOT, Figures, say

from tui.core.logline import LogLine, parse_lines
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.rootcause import RootCauseTracker
from tui.core.state import LaunchMachine, LineAdded
from tui.sim.flood import flood_lines

CHUNK = 1000
GREP = ["grep", "-v", "-e", "FutureWarning", "-e", "frozen importlib", "-e", "deprecated"]


def write_log(path: Path, lines: int) -> list[tuple[int, str]]:
    """The log file, and its (byte offset, line) pairs as the supervisor hands them over."""
    startup = (ROOT / "tests" / "fixtures" / "vllm-real-startup.log").read_text().splitlines()
    flood = flood_lines({"APIServer": 25527, "EngineCore_DP0": 25704})
    text = list(itertools.islice(itertools.chain(startup, flood), lines))
    path.write_text("".join(f"{line}\n" for line in text))
    pairs, offset = [], 0
    for line in text:
        pairs.append((offset, line))
        offset += len(line.encode()) + 1
    return pairs


def _frozen() -> None:
    """The input (a million lines held at once, which the console never does) is kept out of
    the garbage collector's way, or its passes over it would be counted as the core's time."""
    gc.collect()
    gc.freeze()


def _best(repeats: int, once: Callable[[], object]) -> float:
    """The median of `repeats` timings, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _chunks(pairs: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    return [pairs[i:i + CHUNK] for i in range(0, len(pairs), CHUNK)]


def _core(chunks: list[list[tuple[int, str]]]) -> None:
    machine = LaunchMachine(noise=NoiseFilter(builtin_rules("vllm")))
    machine.started(1, 0.0, 0.0)
    for chunk in chunks:
        machine.feed_lines(chunk, 1.0)


def _stages(chunks: list[list[tuple[int, str]]], repeats: int) -> dict[str, float]:
    """Seconds per stage over the whole log: where the core's time goes."""
    parsed = [parse_lines(chunk) for chunk in chunks]
    _frozen()
    noise = NoiseFilter(builtin_rules("vllm"))

    def decode() -> None:
        for chunk in chunks:
            parse_lines(chunk)

    def floor() -> None:
        for chunk in chunks:
            for offset, raw in chunk:
                raw.isprintable()
                LineAdded(LogLine(offset, raw, raw, None, None, None, raw), None)

    def tracker() -> None:
        rc = RootCauseTracker(noise)
        for lines in parsed:
            rc.feed_all(lines)

    return {"decode": _best(repeats, decode),
            "noise": _best(repeats, lambda: [noise.classify_all(p) for p in parsed]),
            "root cause": _best(repeats, tracker), "floor": _best(repeats, floor)}


def run(lines: int, repeats: int = 3) -> Figures:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "server.log"
        pairs = write_log(path, lines)
        chunks = _chunks(pairs)
        _frozen()
        try:
            core = _best(repeats, lambda: _core(chunks))
            with open(Path(tmp) / "kept.log", "wb") as kept:  # not /dev/null: grep -q would
                grep = _best(repeats, lambda: subprocess.run(  # stop at the first line
                    [*GREP, str(path)], stdout=kept, check=False))
            stages = _stages(chunks, repeats)
        finally:
            gc.unfreeze()
    size = len(pairs)
    say(f"log core: {size / core:,.0f} lines/s over {size:,} lines "
        f"({core / size * 1e9:.0f} ns a line); grep -v: {size / grep:,.0f} lines/s, "
        f"{grep / core:.3f}x the core's speed")
    say("  of which (ns a line): " + ", ".join(
        f"{name} {t / size * 1e9:.0f}" for name, t in stages.items() if name != "floor")
        + f"; CPython floor (isprintable + 2 objects a line): "
          f"{stages['floor'] / size * 1e9:.0f} ns = {size / stages['floor']:,.0f} lines/s")
    return {"core_lines_per_s": size / core, "grep_lines_per_s": size / grep,
            "core_vs_grep": grep / core, "core_floor_lines_per_s": size / stages["floor"],
            "core_ns_per_line": {name: t / size * 1e9 for name, t in stages.items()},
            "core_lines": size}
