"""The Supervisor on real simulated runs: events in order, deaths after READY, kill, reattach."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

from helpers import async_wait_for, carriers, count_lines, next_event, sim_profile

from tui.core.logline import LogLine
from tui.core.profile import load_profile
from tui.core.state import Died, LinesAdded, Ready, State
from tui.remote import launcher
from tui.remote.session import LocalSession
from tui.supervise.supervisor import KillDone, LinkLost, LinkRestored, Supervisor


async def _offsets(events: asyncio.Queue, count: int, timeout: float = 30) -> list[int]:
    """Byte offsets of the first `count` log lines the supervisor emits."""
    async def collect() -> list[int]:
        out: list[int] = []
        while len(out) < count:
            event = await events.get()
            if isinstance(event, LinesAdded):
                out.extend(event.chunk.offsets)
        return out[:count]  # a chunk may carry more: the first `count`, as asked
    return await asyncio.wait_for(collect(), timeout)


async def test_engine_killed_while_serving_is_dead_although_vllm_exits_0(tmp_path: Path) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "engine-killed", time_scale=300)))
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        await next_event(events, Ready)
        died = await next_event(events, Died)
        assert died.death.process == "EngineCore_DP0"
        # its parent (the API server) may reap it before anyone else reads its status: then
        # the signal is unknown — but never wrong
        assert (died.death.signal, died.death.code) in ((9, None), (None, None))
        assert sup.machine.state is State.DEAD
        run_dir = Path(sup.run.run_dir)
        exit_json = run_dir / "exit.json"
        await async_wait_for(exit_json.exists, 60, "the monitor's exit.json")
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
        done = await next_event(events, KillDone)
        assert done.killed.remaining == () and done.killed.gpu_released is True
        assert carriers(run_id) == []
    finally:
        await second.close()


async def test_link_lost_mid_load_resumes_with_every_line_exactly_once(
        tmp_path: Path, ssh_server, monkeypatch) -> None:
    monkeypatch.setenv("SPECCONSOLE_SSH_CONFIG", str(ssh_server.ssh_config))
    profile = load_profile(sim_profile(tmp_path, "ready", target=ssh_server.alias,
                                       time_scale=150))
    sup = Supervisor(profile)
    events = sup.subscribe()
    lines: list[LogLine] = []
    try:
        await sup.launch(skip_preflight=True)

        async def collect(until: type | None, count: int = 0) -> object:
            while True:
                event = await events.get()
                if isinstance(event, LinesAdded):
                    chunk = event.chunk
                    lines.extend(chunk.line(i) for i in range(len(chunk)))
                    if until is None and len(lines) >= count:
                        return event
                elif until is not None and isinstance(event, until):
                    return event

        await asyncio.wait_for(collect(None, 30), 30)
        await ssh_server.stop()                      # sshd gone: every channel drops
        lost = await asyncio.wait_for(collect(LinkLost), 10)
        assert lost.host == ssh_server.alias
        log = Path(sup.run.run_dir) / "server.log"  # the server keeps logging meanwhile
        down = log.read_bytes().count(b"\n")
        await async_wait_for(lambda: log.read_bytes().count(b"\n") >= down + 5, 30,
                             "5 lines logged while the link is down")
        await ssh_server.start()
        await asyncio.wait_for(collect(LinkRestored), 30)
        await asyncio.wait_for(collect(None, len(lines) + 30), 30)
    finally:
        await sup.kill(1.0)
        await sup.close()
    count = count_lines(lines, Path(sup.run.run_dir) / "server.log")
    assert not count.out_of_order and count.duplicated == 0, "a line was shown twice"
    assert count.lost == 0 and count.stray == 0, "a line was lost"
    assert count.processes >= 8 and count.seq_faults == []


async def test_restart_kills_verifies_and_relaunches_as_a_new_run(tmp_path: Path) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "ready", time_scale=1000)))
    events = sup.subscribe()
    try:
        first = await sup.launch(skip_preflight=True)
        await next_event(events, Ready)
        old_machine = sup.machine
        second = await sup.restart(grace=2.0, skip_preflight=True)
        assert second.run_id != first.run_id
        assert carriers(first.run_id) == []
        assert sup.machine is not old_machine and sup.machine.state is State.STARTING
        assert sup.machine.timeline is not None and sup.machine.timeline.spans == []
        await next_event(events, Ready)
        assert sup.machine.state is State.READY and carriers(second.run_id)
    finally:
        await sup.kill(1.0)
        await sup.close()


async def test_gpu_checks_follow_the_gpus_free_switch(tmp_path: Path) -> None:
    profile = load_profile(sim_profile(tmp_path, "ready"))
    session = LocalSession()
    try:
        on = {c.check for c in await launcher.preflight(session, profile)}
        off_profile = replace(profile, preflight=replace(profile.preflight, gpus_free=False))
        off = {c.check for c in await launcher.preflight(session, off_profile)}
    finally:
        await session.close()
    assert {"gpus_free", "gpu_count"} <= on
    assert not {"gpus_free", "gpu_count"} & off  # a CPU-only profile is not warned about GPUs
