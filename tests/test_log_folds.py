"""The filtered view from launch to READY (issue 19): start-up chatter folded, nothing dropped.
A run of INFO records of one kind of process within one phase is one row (vLLM's route table
as `API routes: N (…)`), a progress bar's updates one row at its latest; every WARNING, ERROR
and traceback line and every line that moves the launch to a new phase stays a row's head."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from helpers import sim_profile

from tui.core.logline import parse_line
from tui.core.logwindow import Fold, LogWindow, entries
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.phases import Phase, detect_phase
from tui.core.profile import load_profile
from tui.core.state import LaunchMachine, LinesAdded, State
from tui.supervise.supervisor import Supervisor

FIXTURES = Path(__file__).parent / "fixtures"
MOST_ROWS = 60
READY_LINE = "Application startup complete"


def _to_ready(text: str) -> list[tuple[int, str]]:
    pairs, offset = [], 0
    for raw in text.split("\n")[:-1]:
        pairs.append((offset, raw))
        offset += len(raw.encode()) + 1
        if READY_LINE in raw:
            break
    return pairs


def _window(pairs: list[tuple[int, str]], chunk: int = 7) -> LogWindow:
    """The console's window fed as the live stream would feed it, in small chunks."""
    machine = LaunchMachine(noise=NoiseFilter(builtin_rules("vllm")))
    machine.started(1, 0.0, 0.0)
    window = LogWindow()
    for at in range(0, len(pairs), chunk):
        for event in machine.feed_lines(pairs[at:at + chunk], 1.0):
            if isinstance(event, LinesAdded):
                window.append(entries(event.chunk))
    return window


def _must_show(pairs: list[tuple[int, str]]) -> tuple[set[int], set[int]]:
    """Offsets of the lines a reader must see: WARNING/ERROR/CRITICAL records and traceback
    lines no rule hides, and the lines where the launch entered a new phase."""
    noise = NoiseFilter(builtin_rules("vllm"))
    loud, phases = set(), set()
    furthest: Phase | None = None
    for offset, raw in pairs:
        line = parse_line(raw, offset)
        if noise.match(line) is None and (
                line.level in ("WARNING", "ERROR", "CRITICAL") or "Traceback" in line.message
                or line.message.lstrip().startswith('File "')):
            loud.add(offset)
        hit = detect_phase(line)
        if hit is not None and (furthest is None or hit.phase > furthest):
            furthest = hit.phase
            phases.add(offset)
    return loud, phases


def _check(pairs: list[tuple[int, str]]) -> tuple[int, int, int]:
    window = _window(pairs)
    rows = list(window.view(raw=False))
    assert len(window.view(raw=True)) == len(pairs), "the raw view keeps every line"
    heads = {row.offset for row in rows}
    inside = {m.offset for row in rows if isinstance(row, Fold) for m in row.members[1:]}
    shown = [e for e in window.view(raw=True) if e.shown]
    assert len(heads) + len(inside) == len(shown), "every shown line is a row or in one"
    loud, phases = _must_show(pairs)
    assert loud <= heads - inside, sorted(loud - heads)
    assert len(phases) >= 4 and phases <= heads, sorted(phases - heads)
    assert len(rows) <= MOST_ROWS, [row.raw[:100] for row in rows]
    return len(pairs), len(rows), len(loud)


@pytest.mark.parametrize("name", ["vllm-real-startup.log", "vllm-startup-ready.log"])
def test_a_real_start_up_to_ready_fits_in_sixty_rows_with_every_warning_and_phase(
        name: str) -> None:
    raw, rows, loud = _check(_to_ready((FIXTURES / name).read_text(errors="replace")))
    assert rows < raw and loud >= 2


def test_the_route_table_is_one_row_saying_how_many_routes() -> None:
    pairs = _to_ready((FIXTURES / "vllm-real-startup.log").read_text(errors="replace"))
    rows = list(_window(pairs).view(raw=False))
    routes = [r for r in rows if isinstance(r, Fold) and "API routes: " in r.summary()]
    assert len(routes) == 1
    assert "API routes: 35 (/openapi.json, /docs, /docs/oauth2-redirect" in routes[0].summary()
    bars = [r for r in rows if isinstance(r, Fold) and r.bar]
    assert bars and all("100%" in r.summary() for r in bars), "a bar shows its latest"


async def test_the_simulated_start_up_to_ready_fits_in_sixty_rows(tmp_path: Path,
                                                                  cleanup: list[str]) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "ready", time_scale=300)))
    try:
        await sup.launch(skip_preflight=True)
        cleanup.append(sup.run.run_id)
        deadline = time.monotonic() + 60
        while sup.machine.state is not State.READY and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sup.machine.state is State.READY
        text = (Path(sup.run.run_dir) / "server.log").read_text(errors="replace")
    finally:
        await sup.kill(1.0)
        await sup.close()
    raw, rows, _ = _check(_to_ready(text))
    assert raw > rows
