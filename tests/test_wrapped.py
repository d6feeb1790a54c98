"""Wrapper invariance over the whole corpus (tests/corpus/wrapped.py): every log, wrapped line by
line as seven real relays wrap it, keeps the verdict it gets bare; the share that does may not
drop below the recorded floor (tests/corpus/wrapped_floor.txt). And the live console, fed a
wrapped log in chunks of any size, says what `explain` says of the whole file."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from tui.core.explain import explain
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.state import LaunchMachine

CORPUS = Path(__file__).parent / "corpus"
sys.path.insert(0, str(CORPUS))
import wrapped  # noqa: E402  (tests/corpus/wrapped.py)


def test_the_floor_check_fails_below_the_floor_and_holds_at_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every log under every wrapper (no sample to tune to) is `bootstrap score`'s, run by
    .ci/run: `wrapped.py --check` exits 1 below the floor. Here, on a few logs, that check
    fails when the floor is above what they keep and passes at what they keep."""
    logs = sorted(random.Random(7).sample(wrapped.LOGS, 6))
    hits, n = wrapped.shares(list(wrapped.results(logs)))["all"]
    monkeypatch.setattr(wrapped, "LOGS", logs)
    monkeypatch.setattr(wrapped, "floor", lambda: 100 * hits / n + 0.01)
    assert wrapped.main(["--check"]) == 1
    monkeypatch.setattr(wrapped, "floor", lambda: 100 * hits / n)
    assert wrapped.main(["--check"]) == 0


def _said(ex: object) -> tuple[object, ...]:
    cause = ex.root_cause  # type: ignore[attr-defined]
    return (ex.outcome, ex.last_phase,  # type: ignore[attr-defined]
            None if cause is None else (cause.line, cause.offset, cause.missing))


_SAMPLE = sorted(random.Random(33).sample(wrapped.LOGS, 24))


@pytest.mark.parametrize("log", _SAMPLE, ids=[p.stem for p in _SAMPLE])
def test_a_wrapped_log_read_live_in_any_chunks_says_what_explain_says(log: Path) -> None:
    """The wrapper is learnt as lines arrive (one line at a time, or thousands): the same lines
    are peeled the same way whatever the chunks."""
    engine = json.loads(log.with_suffix(".json").read_text())["engine"]
    rng = random.Random(log.stem)
    for k, name in enumerate(wrapped.WRAPPERS):
        lines = wrapped.wrap(wrapped.bare_lines(log), name, k)
        whole = explain(lines, engine)
        machine = LaunchMachine(engine=engine, noise=NoiseFilter(builtin_rules(engine)))
        machine.started(1, 1000.0, 1000.0)
        offset, at = 0, 0
        while at < len(lines):
            step = rng.choice((1, 1, 2, 5, 33, 700))
            pairs = []
            for line in lines[at:at + step]:
                pairs.append((offset, line))
                offset += len(line.encode("utf-8", "replace")) + 1
            machine.feed_lines(pairs, 1000.0 + at)
            at += step
        assert _said(machine.verdict()) == _said(whole), name
