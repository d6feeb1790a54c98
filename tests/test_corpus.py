"""The real-log corpus (tests/corpus): every log is well formed, `explain` never raises on one,
and the live path says what `explain` says.

Live parity: each log is written to a file in random pieces, as a server's output grows, tailed
by the agent's own LogTail (complete lines only, a line split across reads held back), decoded
from the wire as the console decodes it, and fed to the LaunchMachine chunk by chunk, as the
supervisor feeds it. The machine's verdict must equal `explain` on the whole file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tui.agent import logtail
from tui.core.explain import explain
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.protocol import LogChunk, decode
from tui.core.state import LaunchMachine

CORPUS = Path(__file__).parent / "corpus"
LOGS = sorted((CORPUS / "logs").glob("*.log"))


def _meta(log: Path) -> dict[str, Any]:
    return json.loads(log.with_suffix(".json").read_text())


def test_the_corpus_is_well_formed_and_split() -> None:
    import sys

    sys.path.insert(0, str(CORPUS))
    import check  # tests/corpus/check.py

    assert [p for s in sorted((CORPUS / "logs").glob("*.json")) for p in check.problems(s)] == []
    import split as splitter  # tests/corpus/split.py

    split = json.loads((CORPUS / "split.json").read_text())
    assert sorted(split) == sorted(p.stem for p in LOGS)
    assert set(split.values()) <= set(splitter.PARTS)
    # a sealed batch is sealed whole: never tuned on, never counted as held out
    assert {i for i, part in split.items() if part == "sealed"} == splitter.sealed_ids()
    engines = [_meta(p)["engine"] for p in LOGS]
    assert len(LOGS) >= 100 and engines.count("vllm") >= 70 and engines.count("sglang") >= 30


def _tailed(log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            seed: int) -> list[list[tuple[int, str]]]:
    """The (offset, line) chunks the supervisor would feed, from the agent's LogTail reading a
    file that grows in random pieces."""
    sent: list[LogChunk] = []

    def emit(t: str, **fields: object) -> None:
        event = decode(json.dumps({"t": t, "v": 1, **fields}))
        if isinstance(event, LogChunk):
            sent.append(event)

    monkeypatch.setattr(logtail, "emit", emit)
    data = log.read_bytes()
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    tail = logtail.LogTail(str(path), 0)
    rng = random.Random(seed)
    at = 0
    while at < len(data):
        step = rng.choice((1, 7, 64, 300, 4096))
        with path.open("ab") as f:
            f.write(data[at:at + step])
        at += step
        tail.pump()
    tail.pump(final=True)
    chunks = []
    for chunk in sent:  # as Supervisor._lines gives them
        offset, pairs = chunk.off, []
        for line in chunk.lines:
            pairs.append((offset, line))
            offset += len(line.encode("utf-8", "replace")) + 1
        chunks.append(pairs)
    return chunks


def _said(ex: Any) -> tuple[Any, ...]:
    cause = ex.root_cause
    return (ex.outcome, ex.last_phase,
            None if cause is None else (cause.line, cause.offset, cause.missing, cause.process),
            None if ex.services is None else {k: v.outcome for k, v in ex.services.items()})


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_the_live_stream_says_what_explain_says(log: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _meta(log)["engine"]
    whole = explain(log.read_bytes().decode("utf-8", "replace").split("\n"),
                    engine)
    machine = LaunchMachine(engine=engine, noise=NoiseFilter(builtin_rules(engine)))
    machine.started(1, 1000.0, 1000.0)
    for i, pairs in enumerate(_tailed(log, tmp_path, monkeypatch, seed=len(log.stem))):
        machine.feed_lines(pairs, 1000.0 + i)
    assert _said(machine.verdict()) == _said(whole)
