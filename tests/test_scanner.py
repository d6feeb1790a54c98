"""The one-pass chunk reader (issue 18): it decodes only the lines a rule cares about, yet says
exactly what decoding every line says; Hyperscan and the `re` fallback pick the same lines."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from tui.core.explain import explain
from tui.core.logchunk import ChunkReader
from tui.core.noise import NoiseFilter, builtin_rules, rule_from_pattern
from tui.core.scanner import Scanner, hyperscan, required_literal
from tui.core.state import LaunchMachine, PhaseChanged, ProgressChanged
from tui.sim.flood import flood_lines

ROOT = Path(__file__).parent
LOGS = sorted((ROOT / "corpus" / "logs").glob("*.log")) + sorted(
    (ROOT / "fixtures").glob("*.log"))
FLOOD = list(itertools.islice(flood_lines({"APIServer": 7, "EngineCore_DP0": 8}), 5000))


def _lines(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8", "replace").split("\n")


def _engine(path: Path) -> str:
    return "sglang" if path.name.startswith("sglang") else "vllm"


@pytest.mark.skipif(hyperscan is None, reason="no hyperscan wheel on this platform")
@pytest.mark.parametrize("log", [*LOGS, None], ids=[p.stem for p in LOGS] + ["flood"])
def test_hyperscan_and_the_re_fallback_pick_the_same_lines(log: Path | None) -> None:
    raws = FLOOD if log is None else _lines(log)
    readers = [ChunkReader("vllm", NoiseFilter(builtin_rules("vllm")), b)
               for b in ("hyperscan", "re")]
    for start in range(0, len(raws), 700):
        chunk = raws[start:start + 700]
        fast, fallback = (r.scanner.scan(chunk) for r in readers)
        assert fast == fallback


class _Everything(ChunkReader):
    """The reference: every line decoded, as before the scanner."""

    def __init__(self, engine: str, noise: NoiseFilter) -> None:
        super().__init__(engine, noise)
        self.everything = True


def _machine_said(lines: list[str], engine: str, everything: bool) -> tuple[object, ...]:
    noise = NoiseFilter(builtin_rules(engine))
    m = LaunchMachine(engine=engine, noise=noise)
    if everything:
        m.reader = _Everything(engine, noise)
    m.started(1, 1000.0, 1000.0)
    events = []
    offset = 0
    for start in range(0, len(lines), 333):
        pairs = []
        for raw in lines[start:start + 333]:
            pairs.append((offset, raw))
            offset += len(raw.encode("utf-8", "replace")) + 1
        events += [e for e in m.feed_lines(pairs, 1001.0)
                   if isinstance(e, (PhaseChanged, ProgressChanged))]
    v = m.verdict()
    cause = v.root_cause
    return (v.outcome, v.last_phase, cause and (cause.line, cause.offset, cause.process),
            v.symptoms, dict(noise.hidden), dict(noise.harmless), events, m.log_names,
            m.spec_decode, m.reported_codes)


@pytest.mark.parametrize("log", [*LOGS, None], ids=[p.stem for p in LOGS] + ["flood"])
def test_reading_only_the_lines_that_matter_says_what_reading_all_says(log: Path | None) -> None:
    lines = FLOOD if log is None else _lines(log)
    engine = "vllm" if log is None else _engine(log)
    assert _machine_said(lines, engine, False) == _machine_said(lines, engine, True)


def test_a_serving_log_decodes_few_lines() -> None:
    reader = ChunkReader("vllm", NoiseFilter(builtin_rules("vllm")))
    read = reader.read(list(enumerate(FLOOD[:1000])), open_traceback=False)
    assert len(read.indices) < 0.2 * len(FLOOD[:1000])  # the flood's noise, one stats line...
    assert len(read.chunk.raws) == 1000 and read.chunk.line(999).raw == FLOOD[999]  # ...on demand


@pytest.mark.parametrize(("pattern", "needle"), [
    (r"Failed to import Triton kernels", "Failed to import Triton kernels"),
    (r"^\s+warnings\.warn\(", "warnings.warn("),
    (r"(?:Future|Deprecation)Warning:", "Warning:"),
    (r"foo|bar", ""),
    (r"a.b", ""),
    (re.compile(r"triton", re.IGNORECASE), ""),
])
def test_a_profiles_rule_is_guarded_by_the_literal_it_requires(pattern: object,
                                                              needle: str) -> None:
    compiled = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)
    assert required_literal(compiled) == needle


def test_a_rule_without_a_literal_makes_every_line_count() -> None:
    rule = rule_from_pattern("hide:x", "hide", r"\d+ms$", "timings")
    reader = ChunkReader("vllm", NoiseFilter([rule, *builtin_rules("vllm")]))
    assert reader.everything
    verdict = explain(["(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] took 12ms"],
                      extra_rules=[rule])
    assert verdict.hidden == {"hide:x": 1}


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scanner backend"):
        Scanner(["x"], "grep")


def test_a_process_first_seen_gets_its_line_read_whatever_the_pids_known_before() -> None:
    """The chunk is searched only for pids not yet seen: one that begins with a known one's
    digits (255 after 25527) is new, and each new one's first line is read, once."""
    reader = ChunkReader("vllm", NoiseFilter(builtin_rules("vllm")))
    quiet = "(APIServer pid={}) INFO 09-04 17:38:34 [api.py:1] request {} done"
    first = reader.read(list(enumerate([quiet.format(25527, i) for i in range(5)])), False)
    assert first.indices == [0]
    later = [quiet.format(25527, 0), quiet.format(255, 1), quiet.format(25527, 2),
             quiet.format(2552, 3), quiet.format(255, 4),
             "(RayWorkerWrapper pid=9, ip=10.0.0.1) INFO 09-04 17:38:34 [w.py:1] nothing"]
    second = reader.read(list(enumerate(later, 5)), False)
    assert second.indices == [1, 3, 5]
    again = reader.read(list(enumerate(later, 11)), False)
    assert again.indices == []


@pytest.mark.skipif(hyperscan is None, reason="no hyperscan wheel on this platform")
@pytest.mark.parametrize("edge", ["", "  ", "\r", " \t\r", "step 1", "step 1 \r", "(Worker pid=3)",
                                  "[12:00:01Z]", "\x1b[0m", "| ", "plain words", "a:"])
def test_the_blank_pattern_is_asked_alike_first_last_and_between(edge: str) -> None:
    """Hyperscan finds a maybe-blank line by the bytes before its newline; the first and the
    last line of a chunk have none on one side, and the `re` fallback asks each line itself."""
    readers = [ChunkReader("vllm", NoiseFilter(builtin_rules("vllm")), b)
               for b in ("hyperscan", "re")]
    words = "nothing to see here"
    for chunk in ([edge], [edge, words], [words, edge], [words, edge, words], [edge, edge],
                  [words, edge, edge, words], [edge, "", edge]):
        fast, fallback = (r.scanner.scan(chunk) for r in readers)
        assert fast == fallback, chunk
