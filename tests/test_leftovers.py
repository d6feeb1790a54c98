"""Leftovers: processes of an earlier, ended run that still hold GPU memory (issue 4, item 8).

An orphaned worker is made as real vLLM makes one: the simulated engine runs with
`--sim-orphans` (its engine core and workers outlive the API server, as vLLM's do), and the
API server is SIGKILLed mid-load. Preflight then refuses the relaunch naming each holder (pid,
vLLM's name, run id) and says how to clear them; `--kill-leftovers` (CLI) or K (console)
kills exactly those, checks they are gone and their GPU memory released, then launches.
Real processes, real signals, the real agent; only the GPUs are the fake NVML.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from helpers import alive, carriers, sim_profile, until
from sshserver import SSHTestServer

from tui.console.app import ConsoleApp
from tui.console.screens.confirm import ConfirmScreen
from tui.console.widgets.banner import Banner
from tui.core.errors import PreflightFailed
from tui.core.profile import HostConfig, load_profile
from tui.core.protocol import GpuHolder
from tui.core.state import State
from tui.remote import launcher
from tui.remote.interface import Session
from tui.remote.session import open_session
from tui.supervise.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent


def with_args(profile: Path, *args: str) -> Path:
    """The simulated engine's fault options go in `server.args` (passed to it as they are)."""
    text = profile.read_text()
    profile.write_text(text.replace("tensor_parallel_size = 8\n",
                                    f"tensor_parallel_size = 8\nargs = {json.dumps(list(args))}\n",
                                    1))
    return profile


def holders(gpu_dir: Path) -> dict[int, int]:
    """pid -> GPU of every live process the fake NVML counts."""
    out = {}
    for path in gpu_dir.glob("holder-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if alive(data["pid"]):
            out[data["pid"]] = data["gpu"]
    return out


async def make_leftovers(tmp: Path, cleanup: list[str], target: str = "local",
                         opener: Callable[[HostConfig], Awaitable[Session]] = open_session,
                         ) -> tuple[Path, str, list[int]]:
    """Launch run 1, kill its API server with SIGKILL once the workers hold GPU memory: the
    workers live on as orphans. The profile, run 1's id, the orphaned workers' pids."""
    profile = with_args(sim_profile(tmp, "ready", target=target, time_scale=300, name="left"),
                        "--sim-orphans")
    first = Supervisor(load_profile(profile), opener=opener)
    try:
        run = await first.launch(skip_preflight=True)
    finally:
        await first.close()
    cleanup.append(run.run_id)
    deadline = time.monotonic() + 30
    while len(holders(tmp / "gpus")) < 8:
        assert time.monotonic() < deadline, "the workers never held GPU memory"
        await asyncio.sleep(0.05)
    os.kill(run.pid, signal.SIGKILL)
    exit_json = Path(run.run_dir) / "exit.json"
    while not exit_json.exists():
        assert time.monotonic() < deadline, "the monitor never recorded the API server's end"
        await asyncio.sleep(0.05)
    workers = sorted(holders(tmp / "gpus"))
    assert len(workers) == 8 and set(workers) <= set(carriers(run.run_id))
    return profile, run.run_id, workers


async def acli(*args: str, env: dict[str, str] | None = None, timeout: float = 90
               ) -> subprocess.CompletedProcess[str]:
    """`specconsole` as a subprocess while this event loop serves the in-process SSH server."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tui", *args, cwd=ROOT, env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return subprocess.CompletedProcess(list(args), proc.returncode or 0, out.decode(),
                                       err.decode())


def launched_run(stdout: str) -> str:
    line = next(line for line in stdout.splitlines() if "launched run " in line)
    return line.split("launched run ", 1)[1].split()[0]


def assert_refusal_names(text: str, run_id: str, workers: list[int]) -> None:
    for rank, pid in enumerate(workers):  # the workers start in rank order
        assert f"held by pid {pid} (Worker_TP{rank}) of run {run_id}, which has ended" in text
    assert "--kill-leftovers" in text and "Traceback" not in text


async def test_wait_refuses_naming_leftovers_then_kill_leftovers_launches(
        tmp_path: Path, cleanup: list[str]) -> None:
    profile, run_id, workers = await make_leftovers(tmp_path, cleanup)
    refused = await acli("wait", str(profile), "--launch", "--timeout", "60s")
    assert refused.returncode == 6, refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1
    assert_refusal_names(refused.stderr, run_id, workers)
    assert f"pids {', '.join(map(str, workers))}" in refused.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_id]  # nothing launched
    assert all(alive(pid) for pid in workers)  # and nothing killed without the flag

    result = await acli("wait", str(profile), "--launch", "--kill-leftovers", "--timeout", "60s")
    assert result.returncode == 0, result.stdout + result.stderr
    second = launched_run(result.stdout)
    cleanup.append(second)
    out = result.stdout
    assert f"leftovers TERM: {', '.join(map(str, workers))}" in out
    assert "leftovers gone" in out and "GPU memory released" in out
    assert out.index("leftovers gone") < out.index("launched run")
    assert "READY after" in out
    assert not any(alive(pid) for pid in workers)
    assert not set(workers) & set(holders(tmp_path / "gpus"))
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted([run_id, second])
    killed = await acli("kill", str(profile), "--grace", "2")
    assert killed.returncode == 0, killed.stdout + killed.stderr


async def test_launch_kill_leftovers_over_ssh(tmp_path: Path, ssh_server: SSHTestServer,
                                              cleanup: list[str]) -> None:
    async def opener(host: HostConfig) -> Session:
        return await open_session(host, ssh_config=ssh_server.ssh_config)

    profile, run_id, workers = await make_leftovers(tmp_path, cleanup, ssh_server.alias, opener)
    check = await acli("check", str(profile), env=ssh_server.env)
    assert check.returncode == 6, check.stdout + check.stderr
    assert_refusal_names(check.stdout, run_id, workers)
    result = await acli("launch", str(profile), "--kill-leftovers", env=ssh_server.env)
    assert result.returncode == 0, result.stdout + result.stderr
    cleanup.append(launched_run(result.stdout))
    assert f"leftovers TERM: {', '.join(map(str, workers))}" in result.stdout
    assert "GPU memory released" in result.stdout
    assert not any(alive(pid) for pid in workers)
    killed = await acli("kill", str(profile), "--grace", "2", env=ssh_server.env)
    assert killed.returncode == 0, killed.stdout + killed.stderr


def banner_text(app: ConsoleApp) -> str:
    return str(app.query_one(Banner).render())


def footer_keys(app: ConsoleApp) -> set[str]:
    return {b.binding.action for b in app.screen.active_bindings.values() if b.enabled
            and b.binding.show and app.check_action(b.binding.action, ()) is True}


async def test_console_key_kills_the_leftovers_then_launches(tmp_path: Path,
                                                             cleanup: list[str]) -> None:
    profile, run_id, workers = await make_leftovers(tmp_path, cleanup)
    sup = Supervisor(load_profile(profile))
    app = ConsoleApp(sup, kill_grace=2.0)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: "PREFLIGHT REFUSED" in banner_text(app), 20, "the refusal")
        text = banner_text(app)
        for rank, pid in enumerate(workers):
            assert f"pid {pid} (Worker_TP{rank}) of run {run_id}" in text
        assert "press K to kill exactly them" in text
        assert "kill_leftovers" in footer_keys(app)
        assert sup.run is None and all(alive(pid) for pid in workers)
        await pilot.press("K")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # no: nothing is killed
        assert all(alive(pid) for pid in workers) and sup.run is None
        await pilot.press("K")
        await pilot.press("y")
        await until(pilot, lambda: sup.run is not None and sup.machine.state.live, 30,
                    "the new run")
        cleanup.append(sup.run.run_id)
        assert sup.run.run_id != run_id and not sup.run.attached
        assert not any(alive(pid) for pid in workers)
        assert "kill_leftovers" not in footer_keys(app)  # gone with the refusal
        await until(pilot, lambda: sup.machine.state is State.READY, 60, "READY")
        await sup.kill(1.0)


async def test_only_the_named_processes_are_killed(tmp_path: Path) -> None:
    """Preflight offers only holders of ended runs; the kill signals a target only while it is
    the process preflight saw (start time) and still holds GPU memory."""
    runs, gpus = tmp_path / "runs", tmp_path / "gpus"
    ended = runs / "old-run"
    ended.mkdir(parents=True)
    (ended / "launch.json").write_text(json.dumps({"run_id": "old-run", "profile_key": "x"}))
    (ended / "exit.json").write_text(json.dumps({"pid": 1, "code": 0, "time": 0}))

    def sleeper(run_id: str | None) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k != "SPECCONSOLE_RUN_ID"}
        if run_id:
            env["SPECCONSOLE_RUN_ID"] = run_id
        return subprocess.Popen(["sleep", "60"], env=env)

    leftover, foreign, idle = sleeper("old-run"), sleeper(None), sleeper("old-run")
    live_top = sleeper(None)
    live = runs / "live-run"
    live.mkdir()
    (live / "launch.json").write_text(json.dumps({"run_id": "live-run", "profile_key": "x"}))
    (live / "pid").write_text(json.dumps({"pid": live_top.pid,
                                          "start_ticks": _ticks(live_top.pid)}))
    of_live = sleeper("live-run")
    procs = [leftover, foreign, idle, live_top, of_live]
    try:
        gpus.mkdir()
        (gpus / "devices.json").write_text(json.dumps(
            {"count": 8, "name": "NVIDIA H200 (simulated)", "total": 141 * 2**30}))
        for gpu, p in enumerate((leftover, foreign, of_live)):
            (gpus / f"holder-{p.pid}.json").write_text(json.dumps(
                {"pid": p.pid, "gpu": gpu, "used": 2**30, "util": 0}))
        profile = load_profile(sim_profile(tmp_path, "ready"))
        sup = Supervisor(profile)
        try:
            with pytest.raises(PreflightFailed) as refused:
                await sup.run_preflight()
            text = str(refused.value)
            assert f"held by pid {leftover.pid} (sleep) of run old-run, which has ended" in text
            assert f"held by pid {foreign.pid} (sleep)" in text
            assert f"pid {of_live.pid} (sleep) of run live-run, which is still running" in text
            offered = sup.leftovers()
            assert [h.pid for h in offered] == [leftover.pid]
            # a foreign holder with the wrong start time (as a recycled pid would have), and a
            # process of the ended run that holds no GPU memory: neither is signalled
            impostor = GpuHolder(foreign.pid, 1, 2**30, "sleep", "old-run",
                                 _ticks(foreign.pid) - 1, True)
            not_holding = GpuHolder(idle.pid, 3, None, "sleep", "old-run",
                                    _ticks(idle.pid), True)
            steps, killed = await launcher.kill_holders(
                await sup.connect(), profile, [*offered, impostor, not_holding], 1.0)
        finally:
            await sup.close()
        by_step = {s.step: list(s.pids) for s in steps}
        assert by_step["SKIP"] == sorted([foreign.pid, idle.pid])
        assert by_step["TERM"] == [leftover.pid] and by_step["KILL"] == []
        assert killed.remaining == () and killed.gpu_released is True
        assert leftover.wait(5) == -signal.SIGTERM
        assert all(p.poll() is None for p in (foreign, idle, live_top, of_live))
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
