"""Redraw screenshots/*.svg from the demo: `.venv/bin/python screenshots/make_screenshots.py`.

Each picture is the real console on the simulated engine (no GPU, no SSH), captured headless at
the moment it shows: loading, ready, serving (the readout after a few scrapes of /metrics),
dead, the kill confirmation, the 80x24 layout, the stacks pane (key d, py-spy of the simulated
engine's real processes), and the fleet of three demo runs (vLLM, SGLang, the story). Re-run it
whenever the look changes; the README shows these files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from textual.pilot import Pilot

from tui.console.app import ConsoleApp
from tui.console.screens.stacks import StacksScreen
from tui.core.phases import Phase
from tui.core.profile import Profile
from tui.core.state import State
from tui.sim.demo import demo_profile
from tui.supervise.runs import SingleRun
from tui.supervise.supervisor import Supervisor

HERE = Path(__file__).resolve().parent


async def _until(pilot: Pilot[str], check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit("the demo did not get there in time")
        await pilot.pause(0.1)


def _loading(app: ConsoleApp) -> bool:
    tl = app.sup.machine.timeline
    cur = tl.current if tl is not None else None
    return cur is not None and cur.phase is Phase.WEIGHTS and (cur.progress or 0) >= 0.4


async def shoot(scenario: str, size: tuple[int, int], shots: list[str]) -> None:
    app = ConsoleApp(Supervisor(demo_profile(scenario, 75.0)), demo=True, kill_grace=2.0)
    async with app.run_test(size=size) as pilot:
        state = app.sup.machine
        for shot in shots:
            if shot in ("loading", "narrow-80x24"):
                await _until(pilot, lambda: _loading(app))
            elif shot == "ready":
                await _until(pilot, lambda: state.state is State.READY)
            elif shot == "serving":
                await _until(pilot, lambda: len(state.serving.samples) >= 8)
            elif shot == "dead":
                await _until(pilot, lambda: state.state is State.DEAD)
            elif shot == "kill-confirm":
                await pilot.press("k")
            elif shot == "stacks":
                await _until(pilot, lambda: _loading(app))
                await pilot.press("d")
                await _until(pilot, lambda: isinstance(app.screen, StacksScreen)
                             and bool(app.screen.query("#stacks-body")))
            await pilot.pause(1.2)  # a procs and GPU sample after the moment
            path = app.save_screenshot(f"{shot}.svg", str(HERE))
            print(path)
            if shot == "kill-confirm":
                await pilot.press("n")
            if shot == "stacks":
                await pilot.press("escape")
        await pilot.press("q")
        await _until(pilot, lambda: state.state is State.STOPPED, 30)


def _own(profile: Profile, name: str, gpus: str) -> Profile:
    """A demo run under its own name, on its own fake GPUs (preflight refuses GPUs in use)."""
    assert profile.simulate is not None
    return dataclasses.replace(profile, name=name, simulate=dataclasses.replace(
        profile.simulate, gpu_state=gpus))


async def shoot_fleet() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sups = [Supervisor(_own(demo_profile(scenario, scale, engine), name, f"{tmp}/{name}"))
                for name, scenario, scale, engine in (
                    ("kimi-vllm", "ready", 150.0, "vllm"), ("kimi-sglang", "ready", 60.0, "sglang"),
                    ("kimi-patched", "syntax-error", 75.0, "vllm"))]
        app = ConsoleApp([SingleRun(s) for s in sups], demo=True, kill_grace=2.0)
        async with app.run_test(size=(120, 30)) as pilot:
            await _until(pilot, lambda: sups[0].machine.state is State.READY
                         and sups[2].machine.state is State.DEAD)
            await pilot.pause(1.2)
            print(app.save_screenshot("fleet.svg", str(HERE)))
            await pilot.press("q")
            await _until(pilot, lambda: all(not s.machine.state.live for s in sups), 30)


async def main() -> None:
    await shoot_fleet()
    await shoot("ready", (200, 50), ["loading", "ready", "serving", "kill-confirm"])
    await shoot("syntax-error", (200, 50), ["dead"])
    await shoot("ready", (80, 24), ["narrow-80x24"])
    await shoot("hang", (200, 50), ["stacks"])


if __name__ == "__main__":
    asyncio.run(main())
