"""Attaching to a long log (issue 18): the agent sends its first and last bytes and one
`log_skipped` for the middle; the console's first screen is the end (the state, the death and
its cause), and the middle comes back a page at a time as the user scrolls up. Every line is
seen exactly once: streamed, or read back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import sim_profile, until

from tui.agent import logtail
from tui.console.app import PAGE_BYTES, ConsoleApp
from tui.console.widgets.logs import LogPane, LogView
from tui.core.profile import load_profile
from tui.core.protocol import LogChunk, LogSkipped, decode
from tui.core.state import LinesAdded, State
from tui.supervise import supervisor
from tui.supervise.supervisor import Supervisor

# a served request as vLLM 0.x logs it (the bulk of a week-long log), and the death at its end
ACCESS = ('INFO:     10.0.3.7:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
          "INFO 12-04 10:00:01 [loggers.py:123] Engine 000: Avg prompt throughput: 812.3 "
          "tokens/s, Avg generation throughput: 1450.2 tokens/s, Running: 12 reqs, Waiting: 0 "
          "reqs, GPU KV cache usage: 41.2%, Prefix cache hit rate: 63.0%\n")
DEATH = "".join(f"(EngineCore_DP0 pid={{pid}}) ERROR 12-04 11:02:03 [core.py:710] {text}\n"
                for text in (
    "EngineCore encountered a fatal error.", "Traceback (most recent call last):",
    '  File "/opt/vllm/vllm/v1/engine/core.py", line 701, in run_engine_core',
    "    engine_core.run_busy_loop()",
    "RuntimeError: CUDA error: an illegal memory access was encountered"))


def _starts(data: bytes) -> list[int]:
    return [0, *[i + 1 for i in range(len(data)) if data[i] == 10][:-1]]


def _skimmed(path: Path, skim: tuple[int, int], monkeypatch: pytest.MonkeyPatch,
             ) -> tuple[list[int], list[LogSkipped]]:
    """The line offsets the agent's LogTail sends, and its skips, reading `path` whole."""
    offsets: list[int] = []
    skips: list[LogSkipped] = []

    def emit(t: str, **fields: object) -> None:
        event = decode(json.dumps({"t": t, "v": 1, **fields}))
        if isinstance(event, LogChunk):
            at = event.off
            for line in event.lines:
                offsets.append(at)
                at += len(line.encode()) + 1
            assert at == event.end
        elif isinstance(event, LogSkipped):
            skips.append(event)

    monkeypatch.setattr(logtail, "emit", emit)
    tail = logtail.LogTail(str(path), 0, skim=skim)
    while tail.pump():
        pass
    return offsets, skips


def test_a_long_log_is_sent_as_its_head_and_tail_with_the_middle_skipped_at_line_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "server.log"
    data = b"".join(f"line {i} ".encode() + b"x" * (i % 97) + b"\n" for i in range(400_000))
    path.write_bytes(data)
    offsets, skips = _skimmed(path, (1 << 20, 2 << 20), monkeypatch)
    assert len(skips) == 1
    gap = skips[0]
    starts = _starts(data)
    assert gap.start in starts and gap.end in starts, "the middle is cut at line starts"
    assert gap.end - gap.start >= logtail.SKIM_MIN_GAP
    assert 1 << 20 <= gap.start < (1 << 20) + 200 and len(data) - gap.end <= 2 << 20
    assert offsets == [s for s in starts if s < gap.start or s >= gap.end], \
        "every line outside the middle once, in order"
    # the file grows: what is appended follows the tail, nothing is skipped again
    with path.open("ab") as f:
        f.write(b"appended\n")
    more, again = _skimmed_more(path, monkeypatch, len(data))
    assert more == [len(data)] and again == []


def _skimmed_more(path: Path, monkeypatch: pytest.MonkeyPatch, offset: int,
                  ) -> tuple[list[int], list[LogSkipped]]:
    offsets: list[int] = []
    skips: list[LogSkipped] = []

    def emit(t: str, **fields: object) -> None:
        event = decode(json.dumps({"t": t, "v": 1, **fields}))
        if isinstance(event, LogChunk):
            offsets.append(event.off)
        elif isinstance(event, LogSkipped):
            skips.append(event)

    monkeypatch.setattr(logtail, "emit", emit)
    tail = logtail.LogTail(str(path), offset, skim=(1 << 20, 2 << 20))
    while tail.pump():
        pass
    return offsets, skips


@pytest.mark.parametrize("shape", ["short", "one huge line at the cut"])
def test_a_log_not_worth_skimming_is_sent_whole(tmp_path: Path, shape: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "server.log"
    if shape == "short":  # the middle would be under SKIM_MIN_GAP
        data = b"".join(b"%d\n" % i for i in range(2_000_000))[:(3 << 20) + (6 << 20)]
        data = data[:data.rfind(b"\n") + 1]
    else:  # the head's cut falls inside a line longer than the probe: no cut, no loss
        data = (b"a\n" * ((1 << 19) - 8) + b"y" * (logtail.LINE_PROBE * 2) + b"\n"
                + b"z\n" * (6 << 20))
    path.write_bytes(data)
    offsets, skips = _skimmed(path, (1 << 20, 2 << 20), monkeypatch)
    assert skips == []
    assert offsets == _starts(data)


@pytest.fixture
async def long_dead_run(tmp_path: Path, ssh_server: Any, monkeypatch: pytest.MonkeyPatch,
                        ) -> tuple[Any, Path]:
    """A simulated run over SSH that served, died, and left a log of 12 MiB whose last lines
    are the engine core's fatal traceback; the skim is made small (a 64 KiB head, a 256 KiB
    tail) so that the console's first page up already reads the skipped middle."""
    monkeypatch.setenv("SPECCONSOLE_SSH_CONFIG", str(ssh_server.ssh_config))
    monkeypatch.setattr(supervisor, "SKIM_HEAD", 64 << 10)
    monkeypatch.setattr(supervisor, "SKIM_TAIL", 256 << 10)
    profile = load_profile(sim_profile(tmp_path, "ready", target=ssh_server.alias,
                                       time_scale=300))
    first = Supervisor(profile)
    await first.launch(skip_preflight=True)
    assert first.run is not None
    deadline = time.monotonic() + 60
    while first.machine.state is not State.READY and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert first.machine.state is State.READY
    group = os.getpgid(first.run.pid)
    await first.close()
    os.killpg(group, signal.SIGKILL)
    log = Path(first.run.run_dir) / "server.log"
    while not (Path(first.run.run_dir) / "exit.json").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    block = ACCESS.encode() * 2000
    with log.open("ab") as f:
        for _ in range((12 << 20) // len(block) + 1):
            f.write(block)
        f.write(DEATH.format(pid=group).encode())
    return profile, log


async def test_attaching_to_a_long_dead_log_shows_its_end_and_cause_and_reads_the_middle_back(
        long_dead_run: tuple[Any, Path]) -> None:
    profile, log = long_dead_run
    data = log.read_bytes()
    starts = _starts(data)
    sup = Supervisor(profile)
    events = sup.subscribe()
    app = ConsoleApp(sup, launch=False)
    streamed: list[int] = []
    skips: list[LogSkipped] = []
    async with app.run_test(size=(200, 50)) as pilot:
        def drain() -> bool:
            while not events.empty():
                event = events.get_nowait()
                if isinstance(event, LinesAdded):
                    streamed.extend(event.chunk.offsets)
                elif isinstance(event, LogSkipped):
                    skips.append(event)
            return bool(streamed) and streamed[-1] == starts[-1]

        await until(pilot, drain, 60, "the log's last line")
        await until(pilot, lambda: sup.machine.state is State.DEAD, 30, "DEAD")
        await until(pilot, lambda: sup.machine.death is not None
                    and sup.machine.death.cause is not None
                    and "illegal memory access" in sup.machine.death.cause.line, 10,
                    "the cause from the log's end")
        assert len(skips) == 1
        gap = skips[0]
        assert streamed == [s for s in starts if s < gap.start or s >= gap.end]
        view = app.query_one(LogView)
        await until(pilot, lambda: (held := [e.offset for e in view.window.view(raw=True)])
                    and held[-1] == starts[-1] and held[0] >= gap.end, 10,
                    "the first screen: the end, contiguous after the skipped middle")
        header = str(app.query_one("#log-header").render())
        assert "unread" in header and "scroll up" in header, header
        # scrolling up reads the middle back, page by page, contiguous with what is held
        view.focus()
        for _ in range(2):
            before = view.window.start
            await pilot.press("home")
            await until(pilot, lambda b=before: view.window.start < b, 10, "an older page")
        page = [e.offset for e in view.window.view(raw=True)]
        assert view.window.start < gap.end - PAGE_BYTES, "two pages into the middle"
        assert page == [s for s in starts if view.window.start <= s <= page[-1]]
        assert "older lines" in str(app.query_one(LogPane).query_one("#log-header").render())
    # the whole middle, a page at a time as the console reads it: every line once
    read: list[int] = []
    at = gap.start
    while at < gap.end:
        end = min(gap.end, at + PAGE_BYTES)
        read.extend(e.offset for e in await sup.read_log(at - 1, end))
        at = end
    await sup.close()
    assert read == [s for s in starts if gap.start <= s < gap.end]


def test_the_runs_log_is_never_read_through_a_link(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A process of the run (a container's, say) that swaps server.log for a link makes the
    agent read nothing through it, and says why once; only an attached run's log, a link the
    agent made itself, is followed."""
    elsewhere = tmp_path / "host-file"
    elsewhere.write_bytes(b"a line of a file the run must not read\n")
    log = tmp_path / "server.log"
    log.symlink_to(elsewhere)
    said: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(logtail, "emit", lambda t, **fields: said.append((t, fields)))
    tail = logtail.LogTail(str(log), 0)
    assert tail.pump() is False and tail.pump() is False
    assert [t for t, _ in said] == ["error"], said
    assert said[0][1]["kind"] == "log_read" and str(log) in str(said[0][1]["message"])
    said.clear()
    assert logtail.LogTail(str(log), 0, follow=True).pump() is True
    assert [(t, f["lines"]) for t, f in said] == [
        ("log", ["a line of a file the run must not read"])]
