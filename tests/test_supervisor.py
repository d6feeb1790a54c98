"""The Supervisor on real simulated runs: events in order, deaths after READY, kill, reattach."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from helpers import carriers, sim_profile

from tui.core.profile import load_profile
from tui.core.state import Died, LineAdded, Ready, State
from tui.supervisor import KillDone, Supervisor


async def _until(events: asyncio.Queue, kind: type, timeout: float = 30) -> object:
    async def first() -> object:
        while not isinstance(event := await events.get(), kind):
            pass
        return event
    return await asyncio.wait_for(first(), timeout)


async def _offsets(events: asyncio.Queue, count: int, timeout: float = 30) -> list[int]:
    """Byte offsets of the first `count` log lines the supervisor emits."""
    async def collect() -> list[int]:
        out: list[int] = []
        while len(out) < count:
            event = await events.get()
            if isinstance(event, LineAdded):
                out.append(event.line.offset)
        return out
    return await asyncio.wait_for(collect(), timeout)


async def test_engine_killed_while_serving_is_dead_although_vllm_exits_0(tmp_path: Path) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "engine-killed", time_scale=300)))
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        await _until(events, Ready)
        died = await _until(events, Died)
        assert died.death.process == "EngineCore_DP0" and died.death.signal == 9
        assert sup.machine.state is State.DEAD
        run_dir = Path(sup.run.run_dir)
        exit_json = run_dir / "exit.json"
        for _ in range(200):
            if exit_json.exists():
                break
            await asyncio.sleep(0.05)
        assert json.loads(exit_json.read_text())["code"] == 0  # the API server's code lies
        assert sup.machine.state is State.DEAD and sup.machine.death.process == "EngineCore_DP0"
    finally:
        await sup.kill(1.0)
        await sup.close()


async def test_reattach_replays_the_whole_log_once_and_finds_the_phase(tmp_path: Path) -> None:
    profile = load_profile(sim_profile(tmp_path, "ready", time_scale=60))
    first = Supervisor(profile)
    first_events = first.subscribe()
    await first.launch(skip_preflight=True)
    seen = await _offsets(first_events, 40)
    await first.close()  # the console goes away; the server keeps running
    run_id = first.run.run_id
    assert carriers(run_id)

    second = Supervisor(profile)
    events = second.subscribe()
    try:
        run = await second.start(launch=False)
        assert run.attached and run.run_id == run_id
        offsets = await _offsets(events, 40)
        assert offsets == seen  # from the first byte, in order, nothing doubled
        assert len(set(offsets)) == len(offsets)
        assert second.machine.state in (State.LOADING, State.READY)
        await second.kill(2.0)
        done = await _until(events, KillDone)
        assert done.killed.remaining == () and done.killed.gpu_released is True
        assert carriers(run_id) == []
    finally:
        await second.close()
