"""One server over both lab hosts (issue 8): a Ray cluster and vLLM's own multi-node launch of
the simulated engine, gpu-a the head, gpu-b a worker host reached through gpu-a.

The Ray cases run the REAL Ray (issue 17): `ray start --head --block` on gpu-a and `ray start
--address ... --block` on gpu-b, from the lab's Ray environment (`lab_ray`, made by `python3
-m tui.bootstrap lab`), joined as Ray itself says so; the simulated engine's ranks are real Ray
actors on that cluster (`ray::RayWorkerWrapper`, tui/sim/ray_actors.py), because the real vLLM
CPU build refuses Ray (`ValueError: current platform cpu does not support ray.`; see the
README's "Several hosts in one launch").

The hosts talk over their shared link (gpu-b reaches gpu-a at its peer address), so a link
that goes down cuts both the ssh session and the cluster's own connection, as on real nodes.
Each host keeps its fake GPUs in its own directory under the test's tmp_path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import carriers, free_port, sim_server, until_event
from test_app import first_death
from test_leftovers import holders

from lab.conftest import _toml
from lab.netlab import Lab
from tui.core.profile import load_profile
from tui.core.state import Died, Ready
from tui.supervise.group import ClusterRun, Joined, MemberEvent, RunDied
from tui.supervise.supervisor import LinkLost, LinkRestored

pytestmark = pytest.mark.lab
SCALE = 75.0  # the simulated load lasts about 20 s
RAY = {"gpu-a": "ray-head", "gpu-b": "ray-node-1"}
NATIVE = {"gpu-a": "server", "gpu-b": "node-1"}

ClusterFactory = Callable[..., Path]


# Ray's own processes, by the names the agent gives them (tui/agent/names.py)
RAY_HEAD_DAEMONS = {"ray start", "gcs_server", "raylet", "log_monitor", "DashboardAgent",
                    "RuntimeEnvAgent"}
RAY_NODE_DAEMONS = {"ray start", "raylet", "log_monitor", "DashboardAgent", "RuntimeEnvAgent"}
# any process of Ray, by its name or command line (what must be gone after a kill)
RAY_PROCESS = re.compile(r"raylet|gcs_server|plasma_store|ray::|ray-dashboard|log_monitor"
                         r"|ray/dashboard|ray/autoscaler|ray\.util\.client|/bin/ray start")


@pytest.fixture
def cluster_profile(tmp_path: Path, lab: Lab, request: pytest.FixtureRequest) -> ClusterFactory:
    """factory(backend, scenario="ready", fault_host=None, time_scale=SCALE) -> a profile of
    the simulated engine at TP 8 over gpu-a (head) and gpu-b, 4 fake GPUs each. Ray's is the
    real Ray of the lab's Ray environment (its Python runs everything on both hosts)."""
    def make(backend: str, scenario: str = "ready", fault_host: str | None = None,
             time_scale: float = SCALE) -> Path:
        ray_env: Path | None = request.getfixturevalue("lab_ray") if backend == "ray" else None
        python = {"python": str(ray_env / "bin" / "python")} if ray_env else {}
        hosts = ""
        for host, role in (("gpu-a", "head"), ("gpu-b", "worker")):
            table = {"role": role, "address": lab.peer_address(host),
                     **lab.host_table(host), "runs_dir": str(tmp_path / "runs"), **python}
            hosts += "[[hosts]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in table.items())
        fault = f"fault_host = {_toml(lab.address(fault_host))}\n" if fault_host else ""
        ray = f"ray = [{_toml(str(ray_env / 'bin' / 'ray'))}]\n" if ray_env else ""
        # Ray's usage statistics would be sent out of the lab: never
        env = '\n[server.env]\nRAY_USAGE_STATS_ENABLED = "0"\n' if ray_env else ""
        path = tmp_path / f"cluster-{backend}-{scenario}.toml"
        path.write_text(f"""{hosts}
[cluster]
backend = "{backend}"
port = {free_port()}
join_timeout = "60s"
{ray}{sim_server(tmp_path, scenario, time_scale, load_time="1m", stall="5m", gpus=4)}\
{fault}{env}""")
        return path
    return make


def ray_processes(lab: Lab, host: str) -> list[str]:
    """Ray's processes still in the host's namespace, by name and command line."""
    out = []
    for pid in Lab._pids(lab.ns[host]):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X") and (RAY_PROCESS.search(comm) or RAY_PROCESS.search(cmd)):
            out.append(f"{pid} {comm} {cmd[:120]}")
    return out


async def _close(group: ClusterRun) -> None:
    """Stop watching; a run a failed test left behind is killed first (a real Ray left in a
    lab host's namespace would outlive the test and the next test's count of Ray's
    processes)."""
    if any(s.run is not None and carriers(s.run.run_id) for s in group.sups.values()):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(group.kill(grace=3), 60)
    await group.close()


def _names_on(group: ClusterRun, member: str) -> dict[int, str]:
    return group.sups[member].machine.names()


async def _poll(check: Callable[[], Any], timeout: float, what: str,
                seen: Callable[[], Any] | None = None) -> Any:
    """check() until truthy; `seen()`: what there was instead, said when it never is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        await asyncio.sleep(0.2)
    instead = f"; instead: {seen()!r}" if seen is not None else ""
    raise AssertionError(f"no {what} within {timeout:g}s{instead}")


def _nothing_of_ray_left(lab: Lab, tmp: Path, runs: dict[str, str]) -> dict[str, int]:
    """After a kill: no process of any member (by SPECCONSOLE_RUN_ID), no Ray process on either
    host (by name), no fake GPU memory held; what was found, as figures."""
    left = {"by run id": sum(len(carriers(run)) for run in runs.values()),
            "by name": sum(len(ray_processes(lab, h)) for h in ("gpu-a", "gpu-b")),
            "gpu holders": sum(len(holders(_gpu_dir(tmp, lab, h))) for h in ("gpu-a", "gpu-b"))}
    for member, run in runs.items():
        assert not carriers(run), f"{member} left processes behind: {carriers(run)}"
    for host in ("gpu-a", "gpu-b"):
        assert not ray_processes(lab, host), f"Ray left on {host}: {ray_processes(lab, host)}"
        assert holders(_gpu_dir(tmp, lab, host)) == {}, f"fake GPU memory held on {host}"
    return left


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
            # Ray's real processes, by their real names, in each host's process pane
            def actors(member: str) -> list[int]:
                return [p for p, n in _names_on(group, member).items()
                        if n == "RayWorkerWrapper"]
            await _poll(lambda: len(actors("ray-node-1")) == 4 and len(actors("ray-head")) == 4,
                        10, "4 RayWorkerWrapper actors on each host")
            # each host's daemons, polled as the actors are (a slower box starts log_monitor
            # after its raylet registered the actors)
            await _poll(lambda: set(_names_on(group, "ray-head").values()) >= RAY_HEAD_DAEMONS
                        and set(worker_host.machine.names().values()) >= RAY_NODE_DAEMONS,
                        30, "Ray's daemons on each host")
            names = worker_host.machine.names()
            head_names = set(_names_on(group, "ray-head").values())
            assert head_names >= RAY_HEAD_DAEMONS, head_names
            assert set(names.values()) >= RAY_NODE_DAEMONS, names
            assert "gcs_server" not in names.values(), "the GCS runs on the head only"
            ray_workers = actors("ray-node-1")  # ranks 4..7 on gpu-b
            top_group = os.getpgid(worker_host.run.pid)
            assert all(os.getpgid(p) != top_group for p in ray_workers), \
                "Ray's workers left the launch's process group: found by the run's marker"
            assert all(worker_host.run.run_id in Path(f"/proc/{p}/environ").read_text(
                errors="replace") for p in ray_workers), "Ray's workers carry the node's run id"
            assert len(holders(_gpu_dir(tmp_path, lab, "gpu-b"))) == 4, \
                "each actor on gpu-b holds its fake GPU"
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
        kill_s = time.monotonic() - killing
        for host in ("gpu-a", "gpu-b"):
            assert f"{lab.address(host)} {members[host]}: no process of the run remains" \
                in killed.stdout, killed.stdout
        figures: dict[str, Any] = {
            "joined_after_s": {j.member: round(j.after, 2) for j in joins},
            "ready_after_s": round(ready_after, 1), "kill_cli_s": round(kill_s, 1)}
        if backend == "ray":
            figures["processes_left_after_kill"] = _nothing_of_ray_left(lab, tmp_path, runs)
            figures["ray_processes_while_serving"] = {
                m: sorted(set(_names_on(group, m).values())) for m in ("ray-head", "ray-node-1")}
        lab_figures[f"two hosts, {backend}: ready, then kill"] = figures
        for member, run in runs.items():
            assert not carriers(run), f"{member} left processes behind"
    finally:
        await _close(group)


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
        assert "Worker" in death.process, death
        if backend == "ray":
            # a Ray worker's output goes to Ray's log files on gpu-b and reaches the driver's
            # log (the server on gpu-a) through Ray's log monitor: the cause is read there
            stamps = (_gpu_dir(tmp_path, lab, "gpu-b") / "deaths.jsonl").read_text()
            assert death.process == "RayWorkerWrapper" and f'"pid": {death.pid},' in stamps, \
                death  # gpu-b's ranks fail together: one of them, as the agent saw them die
            server = group.sups["server"].machine
            await _poll(lambda: server.death is not None and server.death.cause is not None
                        and "SyntaxError" in server.death.cause.line, 15,
                        "the SyntaxError as the driver's cause", lambda: server.death)
            assert server.death is not None and server.death.cause is not None
            # the run's death (what wait and the banner say): the actor's, with that cause
            found = group.death()
            assert found is not None and found[1].process == "RayWorkerWrapper"
            assert found[1].cause is not None and "SyntaxError" in found[1].cause.line, found
            lab_figures["two hosts, ray: worker on gpu-b dies"] = {
                "run_dead_after_ms": round((seen - stamp["time"]) * 1000),
                "cause_in_the_drivers_log": server.death.cause.line[:120],
                "cause_named_process": server.death.cause.process}
        else:
            assert death.cause is not None and "SyntaxError" in death.cause.line, death
        assert not (_gpu_dir(tmp_path, lab, "gpu-a") / "deaths.jsonl").exists(), \
            "only gpu-b plays the fault"
        await group.kill(grace=3)
        for sup in group.sups.values():
            if sup.run is not None:
                assert not carriers(sup.run.run_id)
    finally:
        await _close(group)


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
        await _close(group)


async def test_a_ray_actor_sigkilled_on_the_second_host_is_the_runs_death_within_1s(
        tmp_path: Path, lab: Lab, cluster_profile: ClusterFactory,
        lab_figures: dict[str, Any]) -> None:
    """Serving on the real Ray cluster, one `ray::RayWorkerWrapper` on gpu-b gets SIGKILL:
    gpu-b's member is DEAD within 1 s naming that actor and the signal; the driver on the head
    hears of it from Ray (ActorDiedError); `specconsole kill` then leaves nothing of Ray."""
    path = cluster_profile("ray")
    group = ClusterRun(load_profile(path))
    events = group.subscribe()
    seen: list[Any] = []
    try:
        await group.start()
        await until_event(events, _ready, 120, "READY from the head's server", seen)
        runs = {m: s.run.run_id for m, s in group.sups.items() if s.run is not None}
        actors = await _poll(lambda: sorted(p for p, n in _names_on(group, "ray-node-1").items()
                                            if n == "RayWorkerWrapper"), 10, "gpu-b's actors")
        victim = actors[0]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        died = await until_event(events, lambda e: isinstance(e, RunDied), 10, "the death", seen)
        after = time.time() - killed_at
        assert after < 1.0, f"DEAD {after:.2f}s after the SIGKILL"
        assert (died.host, died.member) == (lab.address("gpu-b"), "ray-node-1"), died
        death = died.death
        assert (death.pid, death.process) == (victim, "RayWorkerWrapper"), death
        # the raylet, its parent, reaps it at once: the agent sees the death (its pidfd) but
        # not always the status; Ray's own account reaches the driver's log
        assert death.signal in (None, signal.SIGKILL), death
        found = group.death()
        assert found is not None and found[0].host == lab.address("gpu-b")
        # the driver (the engine core on gpu-a) learns it from Ray itself, and so the server's
        # member has the cause in words: Ray's report of the worker killed
        log = tmp_path / "runs" / runs["server"] / "server.log"
        await _poll(lambda: any(f"pid={victim}" in line and "ActorDiedError" in line
                                for line in log.read_text(errors="replace").splitlines()), 15,
                    "the engine core's word on the dead actor")
        server = group.sups["server"].machine
        await _poll(lambda: server.death is not None and server.death.cause is not None, 15,
                    "the server's death with a cause", lambda: server.death)
        assert server.death is not None and server.death.cause is not None
        cause = server.death.cause.line
        killing = time.monotonic()
        await group.kill(grace=3)
        kill_s = time.monotonic() - killing
        left = _nothing_of_ray_left(lab, tmp_path, runs)
        lab_figures["two hosts, ray: actor SIGKILLed on gpu-b"] = {
            "run_dead_after_ms": round(after * 1000), "kill_s": round(kill_s, 1),
            "signal_seen": death.signal, "server_cause": cause[:160],
            "processes_left_after_kill": left}
    finally:
        await _close(group)


async def test_the_ray_heads_host_losing_its_link_is_that_host_lost_not_a_death(
        tmp_path: Path, lab: Lab, cluster_profile: ClusterFactory,
        lab_figures: dict[str, Any]) -> None:
    """gpu-a (the Ray head, and the jump host to gpu-b) loses its link to the console for 8 s
    mid-load: its members are LOST, then back; the Ray cluster (gpu-a to gpu-b) is untouched;
    no death; the same run READY."""
    group = ClusterRun(load_profile(cluster_profile("ray", time_scale=40.0)))
    events = group.subscribe()
    seen: list[Any] = []
    try:
        await group.start()
        lab.link_down("gpu-a")
        down = time.monotonic()
        await until_event(events, lambda e: isinstance(e, MemberEvent)
                                 and isinstance(e.event, LinkLost)
                                 and e.host == lab.address("gpu-a"), 8, "gpu-a lost", seen)
        lost_after = time.monotonic() - down
        assert lost_after < 6
        await asyncio.sleep(max(0.0, 8 - (time.monotonic() - down)))
        lab.link_up("gpu-a")
        up = time.monotonic()
        await until_event(events, lambda e: isinstance(e, MemberEvent)
                          and isinstance(e.event, LinkRestored)
                          and e.host == lab.address("gpu-a"), 30, "gpu-a back", seen)
        back_after = time.monotonic() - up
        await until_event(events, _ready, 120, "READY after the outage", seen)
        assert not any(isinstance(e, RunDied) for e in seen), "a lost link is not a death"
        assert not any(isinstance(e, MemberEvent) and isinstance(e.event, Died) for e in seen)
        lost_hosts = sorted({e.host for e in seen if isinstance(e, MemberEvent)
                             and isinstance(e.event, LinkLost)})
        lab_figures["two hosts, ray: gpu-a (head) link down 8 s"] = {
            "host_lost_after_s": round(lost_after, 1), "back_after_link_up_s": round(back_after, 1),
            "hosts_lost": lost_hosts}
        await group.kill(grace=3)
    finally:
        await _close(group)
