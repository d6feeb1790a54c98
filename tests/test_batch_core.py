"""The chunk paths of the log pipeline (parse_lines, classify_all, feed_all) against the
line-by-line ones they stand for: same lines, same rules, same counts, same root cause."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from tui.core.logline import parse_line, parse_lines
from tui.core.noise import NoiseFilter, builtin_rules, rule_from_pattern
from tui.core.phases import detect_phase, phase_initials
from tui.core.rootcause import RootCauseTracker
from tui.sim.flood import flood_lines

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*.log"))
ODD = [
    "(APIServer pid=7) INFO 09-04 17:38:34 [utils.py:1] tab\there",
    "(APIServer pid=7) INFO 09-04 17:38:34 [utils.py:1] esc \x1b[31mred\x1b[0m",
    "(APIServer pid=7) INFO 09-04 17:38:34 [utils.py:1] bar 10%\rbar 90%",
    "(APIServer pid=7) INFO 09-04 17:38:34 [utils.py:1] syslog #033[0m escape",
    "(APIServer pid=7) INFO 09-04 17:38:34 [utils.py:1] trailing newline\n",
    "(APIServer pid=7) INFO 09-04 17:38:34 [utils.py:1] trailing blanks   ",
    "(APIServer pid=7) (EngineCore_DP0 pid=8) INFO 09-04 17:38:34 [core.py:1] nested",
    "(APIServer pid=7) WARN 09-04 17:38:34 [utils.py:1] warn is a warning",
    "(APIServer pid=7) INFO 09-04 17:38:34 utils.py:1] no bracket",
    "(APIServer pid=7) INFO 09-04 17:38:34.123 [utils.py:1] millis",
    "(APIServer pid=7) INFO 09-04 17:38:34 [utils.py:1]no space after",
    "(APIServer pid=7) INFO:     127.0.0.1:1 - \"GET /health HTTP/1.1\" 200 OK",
    "(APIServer pid=7) INFO:\t\tuvicorn with tabs",
    "(APIServer pid=7) INFO:no space: not a header",
    "(APIServer pid=7) INFORMATION 09-04 17:38:34 [a.py:1] not a level",
    "(APIServer pid=7) ",
    "(APIServer pid=7) \u00a0non-breaking space",
    "(APIServer pid=7) \x85c1 control",
    "(APIServer pid=7) INFO 09-04 17:38:34 [utils.py:1] ",
    "(APIServer pid=7) INFO 09-04 17:38:34 [utils.py:1] [x] ] after",
    "(Worker_TP3 pid=12) ERROR 09-04 17:38:35 [w.py:9] Traceback (most recent call last):",
    "(Worker_TP3 pid=12) ERROR 09-04 17:38:35 [w.py:9]   File \"x.py\", line 1, in f",
    "(Worker_TP3 pid=12) ERROR 09-04 17:38:35 [w.py:9] ValueError: boom",
    "(Worker_TP3 pid=12) INFO 09-04 17:38:35 [w.py:9] Worker proc x died unexpectedly",
    "",
    "   ",
]


def _corpus() -> list[str]:
    lines = [ln for path in FIXTURES for ln in path.read_text().splitlines()]
    lines += ODD * 2  # twice: the second time the prefix and header caches are warm
    lines += itertools.islice(flood_lines({"APIServer": 7, "Worker_TP": 10}), 500)
    return lines


CORPUS = _corpus()


def test_parse_lines_is_parse_line_on_each() -> None:
    pairs = [(i * 10, raw) for i, raw in enumerate(CORPUS)]
    assert parse_lines(pairs) == [parse_line(raw, offset) for offset, raw in pairs]


@pytest.mark.parametrize("extra", [
    [],
    [rule_from_pattern("mine", "hide", r"chat/completions", "my access lines")],
])
def test_classify_all_is_classify_on_each(extra) -> None:
    lines = [parse_line(raw) for raw in CORPUS]
    one, chunk = (NoiseFilter([*extra, *builtin_rules("vllm")]) for _ in range(2))
    assert chunk.classify_all(lines) == [one.classify(line) for line in lines]
    assert (chunk.hidden, chunk.harmless) == (one.hidden, one.harmless)
    assert chunk.hidden


def test_feed_all_is_feed_on_each() -> None:
    lines = [parse_line(raw, i) for i, raw in enumerate(CORPUS)]
    noise = NoiseFilter(builtin_rules("vllm"))
    one, chunk = RootCauseTracker(noise), RootCauseTracker(noise)
    for line in lines:
        one.feed(line)
    for start in range(0, len(lines), 97):
        chunk.feed_all(lines[start:start + 97])
    assert chunk.cause() == one.cause() is not None
    assert (chunk.last_symptom_offset, chunk.last_exception_offset) == (
        one.last_symptom_offset, one.last_exception_offset)


def test_a_line_outside_the_phase_initials_announces_no_phase() -> None:
    initials = phase_initials("vllm")
    for raw in CORPUS:
        line = parse_line(raw)
        if line.message[:1] not in initials:
            assert detect_phase(line) is None, raw
    assert re.search(r"\w", "".join(sorted(initials)))
