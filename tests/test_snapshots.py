"""SVG snapshots of the console (pytest-textual-snapshot): loading, ready, dead, the kill
confirmation and the 80x24 layout, from replayed agent streams with pinned clocks and pids.

Update after an intended change of the look: `pytest tests/test_snapshots.py --snapshot-update`,
look at the SVGs it wrote, and re-run `screenshots/make_screenshots.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from replay import (
    ReplaySupervisor,
    Script,
    dead_script,
    loading_script,
    ready_script,
    serving_script,
)
from textual.pilot import Pilot

from tui.console.app import ConsoleApp
from tui.core.profile import load_profile

PROFILE = Path(__file__).parent.parent / "profiles" / "kimi-k25-eagle3.toml"


def console(script: Callable[[], Script]) -> ConsoleApp:
    sup = ReplaySupervisor(load_profile(PROFILE), script())
    return ConsoleApp(sup, clock=sup.pinned, env={}, profile_arg="kimi-k25-eagle3")


async def settle(pilot: Pilot[str]) -> None:
    await pilot.pause(0.3)
    await pilot.wait_for_scheduled_animations()


@pytest.mark.parametrize(("name", "script", "size"), [
    ("loading", loading_script, (200, 50)),
    ("ready", ready_script, (200, 50)),
    ("serving", serving_script, (200, 50)),
    ("dead", dead_script, (200, 50)),
    ("loading-80x24", loading_script, (80, 24)),
    ("serving-160x45", serving_script, (160, 45)),
    ("dead-160x45", dead_script, (160, 45)),
])
def test_console_snapshot(snap_compare, name: str, script, size: tuple[int, int]) -> None:
    assert snap_compare(console(script), terminal_size=size, run_before=settle)


def test_kill_confirmation_snapshot(snap_compare) -> None:
    async def ask(pilot: Pilot[str]) -> None:
        await settle(pilot)
        await pilot.press("k")
        await settle(pilot)

    assert snap_compare(console(loading_script), terminal_size=(200, 50), run_before=ask)
