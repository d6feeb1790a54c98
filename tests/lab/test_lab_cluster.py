"""One server over both lab hosts (issue 8): a Ray cluster and vLLM's own multi-node launch of
the simulated engine, gpu-a the head, gpu-b a worker host reached through gpu-a.

The hosts talk over their shared link (gpu-b reaches gpu-a at its peer address), so a link
that goes down cuts both the ssh session and the cluster's own connection, as on real nodes.
Each host keeps its fake GPUs in its own directory under the test's tmp_path.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import carriers, free_port, sim_server, until_event
from test_app import first_death

from lab.conftest import _toml
from lab.netlab import Lab
from tui.core.profile import load_profile
from tui.core.state import Ready
from tui.supervise.group import ClusterRun, Joined, MemberEvent, RunDied
from tui.supervise.supervisor import LinkLost, LinkRestored

pytestmark = pytest.mark.lab
SCALE = 75.0  # the simulated load lasts about 20 s
RAY = {"gpu-a": "ray-head", "gpu-b": "ray-node-1"}
NATIVE = {"gpu-a": "server", "gpu-b": "node-1"}

ClusterFactory = Callable[..., Path]


@pytest.fixture
def cluster_profile(tmp_path: Path, lab: Lab) -> ClusterFactory:
    """factory(backend, scenario="ready", fault_host=None, time_scale=SCALE) -> a profile of
    the simulated engine at TP 8 over gpu-a (head) and gpu-b, 4 fake GPUs each."""
    def make(backend: str, scenario: str = "ready", fault_host: str | None = None,
             time_scale: float = SCALE) -> Path:
        hosts = ""
        for host, role in (("gpu-a", "head"), ("gpu-b", "worker")):
            table = {"role": role, "address": lab.peer_address(host),
                     **lab.host_table(host), "runs_dir": str(tmp_path / "runs")}
            hosts += "[[hosts]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in table.items())
        fault = f"fault_host = {_toml(lab.address(fault_host))}\n" if fault_host else ""
        path = tmp_path / f"cluster-{backend}-{scenario}.toml"
        path.write_text(f"""{hosts}
[cluster]
backend = "{backend}"
port = {free_port()}
join_timeout = "60s"
{sim_server(tmp_path, scenario, time_scale, load_time="1m", stall="5m", gpus=4)}{fault}""")
        return path
    return make


def _ready(event: Any) -> bool:
    return (isinstance(event, MemberEvent) and event.member == "server"
            and isinstance(event.event, Ready))


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())


def _gpu_dir(tmp: Path, lab: Lab, host: str) -> Path:
    return tmp / "gpus" / lab.address(host)


@pytest.mark.parametrize("backend", ["ray", "native"])
async def test_two_host_launch_reaches_ready_and_kill_leaves_nothing(
        tmp_path: Path, lab: Lab, cluster_profile: ClusterFactory, backend: str,
        lab_figures: dict[str, Any]) -> None:
    path = cluster_profile(backend)
    members = RAY if backend == "ray" else NATIVE
    group = ClusterRun(load_profile(path))
    events = group.subscribe()
    seen: list[Any] = []
    try:
        started = time.monotonic()
        await group.start()
        await until_event(events, _ready, 90, "READY from the head's server", seen)
        ready_after = time.monotonic() - started
        joins = [e for e in seen if isinstance(e, Joined)]
        assert [(j.host, j.member) for j in joins] == [
            (group.part(m).host, m) for m in members.values() if m != "server"], joins
        worker_host = group.sups[members["gpu-b"]]
        await asyncio.sleep(1.5)  # a procs snapshot of the serving tree
        names = worker_host.machine.names()
        runs = {m: s.run.run_id for m, s in group.sups.items() if s.run is not None}
        if backend == "ray":
            ray_workers = [p for p, n in names.items() if "RayWorkerWrapper" in n]
            assert len(ray_workers) == 4, names  # ranks 4..7 on gpu-b
            top_group = os.getpgid(worker_host.run.pid)
            assert all(os.getpgid(p) != top_group for p in ray_workers), \
                "Ray's workers left the launch's process group: found by the run's marker"
        else:
            assert sum(n.startswith("Worker_TP") for n in names.values()) == 4, names
        assert all(carriers(run) for run in runs.values())
        # a second client sees the same run ready, then kills it on every host
        waited = _cli("wait", str(path), "--timeout", "60s")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert "attached to" in waited.stdout
        killing = time.monotonic()
        killed = _cli("kill", str(path), "--grace", "3")
        assert killed.returncode == 0, killed.stdout + killed.stderr
        lab_figures[f"two hosts, {backend}: ready, then kill"] = {
            "joined_after_s": {j.member: round(j.after, 2) for j in joins},
            "ready_after_s": round(ready_after, 1),
            "kill_cli_s": round(time.monotonic() - killing, 1)}
        for host in ("gpu-a", "gpu-b"):
            assert f"{lab.address(host)} {members[host]}: no process of the run remains" \
                in killed.stdout, killed.stdout
        for member, run in runs.items():
            assert not carriers(run), f"{member} left processes behind"
    finally:
        await group.close()


@pytest.mark.parametrize("backend", ["native", "ray"])
async def test_a_worker_dying_on_the_second_host_is_the_runs_death_within_1s(
        tmp_path: Path, lab: Lab, cluster_profile: ClusterFactory, backend: str,
        lab_figures: dict[str, Any]) -> None:
    path = cluster_profile(backend, "syntax-error", fault_host="gpu-b")
    members = RAY if backend == "ray" else NATIVE
    group = ClusterRun(load_profile(path))
    events = group.subscribe()
    try:
        await group.start()
        died = await until_event(events, lambda e: isinstance(e, RunDied), 90, "the death")
        seen = time.time()
        stamp = first_death(_gpu_dir(tmp_path, lab, "gpu-b"))
        assert seen - stamp["time"] < 1.0, f"DEAD {seen - stamp['time']:.2f}s after the death"
        lab_figures[f"two hosts, {backend}: worker on gpu-b dies"] = {
            "run_dead_after_ms": round((seen - stamp["time"]) * 1000)}
        assert (died.host, died.member) == (lab.address("gpu-b"), members["gpu-b"])
        await asyncio.sleep(1.0)  # late lines name the cause
        found = group.death()
        assert found is not None
        member, death = found
        assert member.host == lab.address("gpu-b")
        assert death.cause is not None and "SyntaxError" in death.cause.line, death
        assert "Worker" in death.process, death
        assert not (_gpu_dir(tmp_path, lab, "gpu-a") / "deaths.jsonl").exists(), \
            "only gpu-b plays the fault"
        await group.kill(grace=3)
        for sup in group.sups.values():
            if sup.run is not None:
                assert not carriers(sup.run.run_id)
    finally:
        await group.close()


async def test_the_second_host_losing_its_link_is_that_host_lost_not_a_death(
        tmp_path: Path, lab: Lab, cluster_profile: ClusterFactory,
        lab_figures: dict[str, Any]) -> None:
    group = ClusterRun(load_profile(cluster_profile("native", time_scale=40.0)))
    events = group.subscribe()
    seen: list[Any] = []
    try:
        await group.start()
        lab.link_down("gpu-b")
        down = time.monotonic()
        lost = await until_event(events, lambda e: isinstance(e, MemberEvent)
                                 and isinstance(e.event, LinkLost), 8, "gpu-b lost", seen)
        lost_after = time.monotonic() - down
        assert lost.host == lab.address("gpu-b") and lost_after < 6
        await asyncio.sleep(max(0.0, 8 - (time.monotonic() - down)))
        lab.link_up("gpu-b")
        up = time.monotonic()
        await until_event(events, lambda e: isinstance(e, MemberEvent)
                          and isinstance(e.event, LinkRestored), 30, "gpu-b back", seen)
        lab_figures["two hosts, native: gpu-b link down 8 s"] = {
            "host_lost_after_s": round(lost_after, 1),
            "back_after_link_up_s": round(time.monotonic() - up, 1)}
        await until_event(events, _ready, 90, "READY after the outage", seen)
        assert not any(isinstance(e, RunDied) for e in seen), "a lost link is not a death"
        assert not any(isinstance(e, MemberEvent) and isinstance(e.event, LinkLost)
                       and e.host != lab.address("gpu-b") for e in seen)
        await group.kill(grace=3)
    finally:
        await group.close()
