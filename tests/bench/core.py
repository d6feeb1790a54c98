"""2. The log core: lines per second through scan → decode → noise → phase → root cause
(`LaunchMachine.feed_lines`, chunks of 1000 lines as the agent sends them under load) on a
vLLM-shaped log: a real vLLM 0.32 start-up, then the serving firehose of `tui.sim.flood`. In the
same run and on the same file, `grep -v -e FutureWarning -e 'frozen importlib' -e deprecated`
as the baseline; the core with each scanner backend (Hyperscan, and the `re` fallback for
platforms without its wheel), and each stage alone: the scan that finds the lines worth
decoding, and decoding, noise and root cause on those lines; and the engines the scan could
use (Hyperscan, `str.find` per needle, one `re` alternation, google-re2's Set and
pyahocorasick where installed) on the same chunks.
"""

from __future__ import annotations

import gc
import itertools
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import ROOT, Figures, say

from tui.core.logchunk import ChunkReader
from tui.core.logline import parse_lines
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.rootcause import RootCauseTracker
from tui.core.scanner import Scanner, hyperscan
from tui.core.state import LaunchMachine
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


BACKENDS = ("hyperscan", "re") if hyperscan is not None else ("re",)


def _core(chunks: list[list[tuple[int, str]]], backend: str) -> None:
    machine = LaunchMachine(noise=NoiseFilter(builtin_rules("vllm")))
    machine.reader = ChunkReader("vllm", machine.noise, backend)
    machine.started(1, 0.0, 0.0)
    for chunk in chunks:
        machine.feed_lines(chunk, 1.0)


def _stages(chunks: list[list[tuple[int, str]]], repeats: int) -> dict[str, float]:
    """Seconds per stage over the whole log: where the core's time goes (decode, noise and
    root cause on the lines the scan picks; the scan on every line, per backend)."""
    noise = NoiseFilter(builtin_rules("vllm"))
    readers = {b: ChunkReader("vllm", noise, b) for b in BACKENDS}
    picked = [[chunk[i] for i in readers[BACKENDS[0]].scanner.lines([r for _, r in chunk])]
              for chunk in chunks]
    parsed = [parse_lines(p) for p in picked]
    _frozen()
    raws = [[r for _, r in chunk] for chunk in chunks]
    stages = {f"scan ({b})": _best(repeats, lambda b=b: [readers[b].scanner.lines(r)
                                                         for r in raws]) for b in BACKENDS}

    hidden = [[rule is not None and rule.kind == "hide" for rule in noise.match_all(lines)]
              for lines in parsed]

    def tracker() -> None:  # as the machine's diagnosis feeds it: hidden lines flagged
        rc = RootCauseTracker(noise)
        for lines, flags in zip(parsed, hidden, strict=True):
            rc.feed_all(lines, flags)

    stages |= {"decode": _best(repeats, lambda: [parse_lines(p) for p in picked]),
               "noise": _best(repeats, lambda: [noise.classify_all(p) for p in parsed]),
               "root cause": _best(repeats, tracker)}
    stages["picked"] = sum(map(len, picked))  # lines decoded, not seconds
    return stages


def _engines(chunks: list[list[tuple[int, str]]], needles: tuple[str, ...],
             repeats: int) -> dict[str, float]:
    """Seconds to find the lines holding any of the core's needles, per candidate engine (the
    ones installed): the choice the scanner made, measured on the same file in the same run."""
    raws = [[r for _, r in chunk] for chunk in chunks]
    texts = ["\n".join(r) for r in raws]
    out = {"hyperscan (the scanner)": None, "str.find per needle (the fallback)": None}
    for name, backend in (("hyperscan (the scanner)", "hyperscan"),
                          ("str.find per needle (the fallback)", "re")):
        if backend == "hyperscan" and hyperscan is None:
            continue
        scanner = Scanner(needles, backend)
        out[name] = _best(repeats, lambda s=scanner: [s.lines(r) for r in raws])
    pattern = re.compile("|".join(map(re.escape, needles)))
    out["re, one alternation, finditer"] = _best(
        repeats, lambda: [list(pattern.finditer(t)) for t in texts])
    try:
        import re2  # google-re2: its Set says which patterns match a text, not where
    except ImportError:
        re2 = None
    if re2 is not None:
        found = re2.Set.SearchSet(re2.Options())
        for needle in needles:
            found.Add(re.escape(needle))
        found.Compile()
        out["google-re2 Set, line by line"] = _best(
            repeats, lambda: [[i for i, r in enumerate(rs) if found.Match(r)] for rs in raws])
    try:
        import ahocorasick
    except ImportError:
        ahocorasick = None
    if ahocorasick is not None:
        automaton = ahocorasick.Automaton()
        for i, needle in enumerate(needles):
            automaton.add_word(needle, i)
        automaton.make_automaton()
        out["pyahocorasick, iter"] = _best(
            repeats, lambda: [list(automaton.iter(t)) for t in texts])
    return {name: t for name, t in out.items() if t is not None}


def run(lines: int, repeats: int = 3) -> Figures:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "server.log"
        pairs = write_log(path, lines)
        chunks = _chunks(pairs)
        _frozen()
        try:
            cores = {b: _best(repeats, lambda b=b: _core(chunks, b)) for b in BACKENDS}
            with open(Path(tmp) / "kept.log", "wb") as kept:  # not /dev/null: grep -q would
                grep = _best(repeats, lambda: subprocess.run(  # stop at the first line
                    [*GREP, str(path)], stdout=kept, check=False))
            stages = _stages(chunks, repeats)
            needles = ChunkReader("vllm", NoiseFilter(builtin_rules("vllm"))).scanner.needles
            engines = _engines(chunks, needles, repeats)
        finally:
            gc.unfreeze()
    size = len(pairs)
    core = cores[BACKENDS[0]]
    say(f"log core: {size / core:,.0f} lines/s ({BACKENDS[0]}) over {size:,} lines "
        f"({core / size * 1e9:.0f} ns a line); grep -v: {size / grep:,.0f} lines/s, "
        f"the core is {core / grep:.1f}x grep's time")
    for backend, seconds in cores.items():
        if backend != BACKENDS[0]:
            say(f"log core: {size / seconds:,.0f} lines/s ({backend}, the fallback)")
    picked = stages.pop("picked")
    say(f"  {picked / size:.0%} of the lines decoded; ns a line, over all lines: " + ", ".join(
        f"{name} {t / size * 1e9:.0f}" for name, t in stages.items()))
    say(f"  finding the lines that hold any of the {len(needles)} needles, lines/s: " + ", ".join(
        f"{name} {size / t:,.0f}" for name, t in engines.items()))
    return {"core_lines_per_s": size / core, "grep_lines_per_s": size / grep,
            "scan_lines_per_s_by_engine": {name: size / t for name, t in engines.items()},
            "core_vs_grep": core / grep,
            "core_lines_per_s_by_backend": {b: size / t for b, t in cores.items()},
            "core_ns_per_line": {name: t / size * 1e9 for name, t in stages.items()},
            "core_decoded_share": picked / size, "core_lines": size}
