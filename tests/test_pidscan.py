"""NewPids: the pids a chunk names that the log has not shown before, found by Hyperscan's
complement of the known ones, say exactly what `re` over the whole chunk says."""

from __future__ import annotations

import random
import re

import pytest

from tui.core.pidscan import KNOWN_MAX, PID_RE, NewPids, hyperscan

BACKENDS = ["re", *(["hyperscan"] if hyperscan is not None else [])]
# digit runs that begin, extend or equal each other, and what may follow them
PIDS = ["7", "25", "255", "2552", "25527", "255270", "25704", "3", "30", "9999999", "0"]
AFTER = [")", ", ip=10.0.0.1)", " ", "", "\n", "x", "\u0663", "\u00e9", "7)"]


def _reference(chunks: list[str]) -> list[set[str]]:
    seen: set[str] = set()
    out = []
    for text in chunks:
        new = set(PID_RE.findall(text)) - seen
        seen |= new
        out.append(new)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_new_pids_are_what_re_finds_minus_those_seen(backend: str) -> None:
    rng = random.Random(33)
    for _ in range(60):
        chunks = []
        for _ in range(rng.randint(1, 8)):
            lines = [f"(Proc pid={rng.choice(PIDS)}{rng.choice(AFTER)} INFO x"
                     if rng.random() < 0.9 else rng.choice(["no prefix", " pid=", "pid=1)"])
                     for _ in range(rng.randint(1, 6))]
            chunks.append("\n".join(lines))
        finder = NewPids(backend)
        assert [finder.find(text) for text in chunks] == _reference(chunks), chunks


@pytest.mark.parametrize("backend", BACKENDS)
def test_past_the_known_limit_every_pid_is_still_found(backend: str) -> None:
    finder = NewPids(backend)
    many = "\n".join(f"(W pid={n}) x" for n in range(1000, 1000 + KNOWN_MAX + 5))
    assert len(finder.find(many)) == KNOWN_MAX + 5
    assert finder.find(many) == set()
    assert finder.find(many + "\n(W pid=77) y") == {"77"}


def test_the_complement_pattern_fires_only_off_the_known_ones() -> None:
    pytest.importorskip("hyperscan")
    finder = NewPids("hyperscan")
    finder.find("(A pid=25527) a\n(B pid=25704) b")
    for text, fires in ((" pid=25527)", False), (" pid=25704, ip", False), (" pid=x", False),
                        (" pid=2552)", True), (" pid=255271)", True), (" pid=25527\u0663", True),
                        (" pid=9", True), (" pid=25704", False)):
        assert finder._fires(text) is fires, text
        assert bool(set(re.findall(r" pid=(\d+)", text)) - finder.pids) is fires, text
