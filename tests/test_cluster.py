"""Multi-host launches (issue 8): the `[[hosts]]` schema, the members and their command lines,
and a two-host run of the simulated engine where the head is this machine ("local") and the
worker host is the in-process SSH server (the lab lane repeats this over real sshd hosts)."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import async_wait_for, carriers, free_port, sim_server, until, until_event
from sshserver import SSHTestServer
from test_app import fake_tmux, tmux_calls
from test_bad_input import _opener

from tui.cli.exit_codes import EXIT_TIMEOUT
from tui.cli.follow import SeveralHosts, follow
from tui.console.app import ConsoleApp
from tui.console.widgets.fleet import FleetTable
from tui.core import cluster
from tui.core.cluster import members
from tui.core.errors import ProfileError, SpecconsoleError
from tui.core.profile import loads_profile
from tui.core.protocol import Killed
from tui.core.rootcause import RootCause
from tui.core.state import Death, Ready, State
from tui.supervise.group import CAUSE_ELSEWHERE_S, ClusterRun, Joined, MemberEvent, RunDied
from tui.supervise.supervisor import RunInfo

HOSTS = """\
[[hosts]]
role = "head"
target = "gpu-a"
address = "10.0.0.1"

[[hosts]]
role = "worker"
target = "gpu-b"
jump = "gpu-a"
"""
SERVER = """
[server]
engine = "vllm"
model = "/models/Kimi-K2.5"
tensor_parallel_size = 16
args = ["--max-model-len", "$(touch /tmp/pwned)"]
"""


def _load(text: str) -> Any:
    return loads_profile(text, "/p/multi.toml", environ={})


@pytest.mark.parametrize(("text", "message"), [
    (HOSTS + SERVER, "cluster: several hosts need a [cluster] table"),
    ('[host]\ntarget = "a"\n[cluster]\nbackend = "ray"\n' + SERVER,
     "cluster: [cluster] needs several hosts"),
    (HOSTS.replace('role = "worker"', 'role = "head"') + '[cluster]\nbackend = "ray"\n' + SERVER,
     'exactly one host must have role = "head", found 2'),
    (HOSTS.replace('role = "worker"', 'role = "wroker"') + SERVER,
     "multi.toml:7: hosts[1].role: unknown value 'wroker' (did you mean 'worker'?)"),
    (HOSTS.replace('"gpu-b"', '"gpu-a"') + '[cluster]\nbackend = "ray"\n' + SERVER,
     "hosts[1].target: host 'gpu-a' is listed twice"),
    (HOSTS + '[cluster]\nbackend = "native"\n' + SERVER.replace("16", "3"),
     "tensor_parallel_size 3 does not split over 2 hosts"),
    (HOSTS + '[cluster]\nbackend = "slurm"\n' + SERVER,
     "cluster.backend: unknown value 'slurm'"),
    (HOSTS + '[cluster]\nbackend = "ray"\n' + SERVER + '[simulate]\nfault_host = "gpu-c"\n',
     "simulate.fault_host: unknown host 'gpu-c' (did you mean 'gpu-b'?); the hosts are: "
     "gpu-a, gpu-b"),
    (SERVER, "missing required table 'host' (or [[hosts]] for several)"),
    (HOSTS + '[cluster]\nbackend = "ray"\n' + SERVER.replace('"vllm"', '"sglang"'),
     "server.engine: several hosts are launched with vLLM's multi-node shapes only"),
])
def test_bad_multi_host_profiles_are_one_line(text: str, message: str) -> None:
    with pytest.raises(ProfileError) as caught:
        _load(text)
    said = str(caught.value)
    assert "\n" not in said
    assert all(part in said for part in message.split("...")), said


def test_host_paths_in_hosts_tables_take_variables_and_an_unset_one_is_one_line() -> None:
    text = HOSTS.replace('jump = "gpu-a"', 'python = "${VENV}/bin/python"') + \
        '[cluster]\nbackend = "ray"\n' + SERVER
    profile = loads_profile(text, "/p/multi.toml", environ={"VENV": "/opt/v"})
    assert profile.nodes[1].host.python == "/opt/v/bin/python"
    with pytest.raises(ProfileError) as caught:
        _load(text)
    assert "hosts[1].python: ${VENV} is not set" in str(caught.value), caught.value


def test_ray_members_start_the_head_then_the_nodes_then_the_server() -> None:
    profile = _load(HOSTS + '[cluster]\nbackend = "ray"\nray = ["/opt/ray/bin/ray"]\n' + SERVER)
    assert profile.host.target == "gpu-a"
    got = [(m.name, m.host, m.joined is not None, m.profile.server.command)
           for m in members(profile)]
    assert got[0] == ("ray-head", "gpu-a", True, (
        "/opt/ray/bin/ray", "start", "--head", "--port=6379", "--node-ip-address=10.0.0.1",
        "--block"))
    assert got[1] == ("ray-node-1", "gpu-b", True, (
        "/opt/ray/bin/ray", "start", "--address=10.0.0.1:6379", "--node-ip-address=gpu-b",
        "--block"))
    name, host, waits, argv = got[2]
    assert (name, host, waits) == ("server", "gpu-a", False)
    assert argv[:3] == ("vllm", "serve", "/models/Kimi-K2.5")
    assert argv[-2:] == ("--distributed-executor-backend", "ray")
    assert "$(touch /tmp/pwned)" in argv  # an argv word, quoted by shlex on the way out
    assert "'$(touch /tmp/pwned)'" in shlex.join(argv)
    server = members(profile)[2].profile
    assert server.server.env["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert server.name == "multi" and members(profile)[0].profile.name == "multi.ray-head"
    # only the server's member checks the server's port; the head's Ray checks its own
    ports = [(m.profile.server.port, m.profile.preflight.port_free) for m in members(profile)]
    assert ports == [(6379, True), (8000, False), (8000, True)]


SIMULATE = ('[simulate]\nscenario = "syntax-error"\ngpus = 4\ngpu_state = "/g"\n'
            'fault_host = "gpu-b"\n')


def test_a_simulated_profile_runs_the_simulated_ray_unless_it_names_a_real_one() -> None:
    simulated = _load(HOSTS + '[cluster]\nbackend = "ray"\n' + SERVER + SIMULATE)
    assert not cluster.real_ray(simulated)
    head = members(simulated)[0].profile.server.command
    assert head[1:4] == ("-m", "tui.sim.ray", "start")
    assert cluster.REAL_RAY_ENV not in members(simulated)[2].profile.server.env

    real = _load(HOSTS + '[cluster]\nbackend = "ray"\nray = ["/v/bin/ray"]\n' + SERVER + SIMULATE)
    assert cluster.real_ray(real)
    head_m, node_m, server_m = members(real)
    # the real `ray start`, the host's simulated GPUs declared as Ray's
    assert head_m.profile.server.command == (
        "/v/bin/ray", "start", "--head", "--port=6379", "--node-ip-address=10.0.0.1",
        "--num-gpus=4", "--block")
    assert node_m.profile.server.command == (
        "/v/bin/ray", "start", "--address=10.0.0.1:6379", "--node-ip-address=gpu-b",
        "--num-gpus=4", "--block")
    # Ray's workers inherit the node's environment: the scenario each host plays goes there
    assert head_m.profile.server.env[cluster.SIM_SCENARIO_ENV] == "ready"
    assert node_m.profile.server.env[cluster.SIM_SCENARIO_ENV] == "syntax-error"
    assert (head_m.profile.simulate.gpu_state, node_m.profile.simulate.gpu_state) == (
        "/g/gpu-a", "/g/gpu-b")
    # the simulated engine core is the driver: told the Ray is real, its ranks become actors
    env = server_m.profile.server.env
    assert env["RAY_ADDRESS"] == "10.0.0.1:6379" and env[cluster.REAL_RAY_ENV] == "1"
    assert server_m.profile.server.command[1:3] == ("-m", "tui.sim.engine")
    assert "--distributed-executor-backend" in server_m.profile.server.command


def test_the_simulation_and_the_core_name_the_real_ray_switches_alike() -> None:
    from tui.sim import executor, ray_actors

    assert ray_actors.REAL_RAY_ENV == executor.REAL_RAY_ENV == cluster.REAL_RAY_ENV
    assert ray_actors.SCENARIO_ENV == cluster.SIM_SCENARIO_ENV


V = "/v/lib/python3.11/site-packages/"


@pytest.mark.parametrize(("argv", "comm", "name"), [
    ([V + "ray/core/src/ray/gcs/gcs_server", "--log_dir=/tmp/ray"], "gcs_server", "gcs_server"),
    ([V + "ray/core/src/ray/raylet/raylet", "--raylet_socket_name=x"], "raylet", "raylet"),
    (["/v/bin/python3", "/v/bin/ray", "start", "--head", "--block"], "ray", "ray start"),
    (["/v/bin/python3", "-u", V + "ray/_private/log_monitor.py", "--x"], "python3",
     "log_monitor"),
    (["/v/bin/python3", "-u", V + "ray/autoscaler/_private/monitor.py"], "python3", "monitor"),
    (["/v/bin/python3", V + "ray/dashboard/dashboard.py", "--host=127.0.0.1"], "python3",
     "dashboard"),
    (["/v/bin/python3", "-m", "ray.util.client.server", "--address=x"], "python3",
     "ray_client_server"),
    (["ray::DashboardAgent"], "ray::DashboardA", "DashboardAgent"),
    (["ray::RuntimeEnvAgent"], "ray::RuntimeEnv", "RuntimeEnvAgent"),
    (["ray::RayWorkerWrapper.run"], "ray::RayWorkerW", "RayWorkerWrapper"),
    (["ray-dashboard-NodeHead-0 (/v/bin/python3 -B -c 'from multiprocessing.forkserver "
      "import main; main(25, 27)')"], "ray-dashboard-N", "ray-dashboard-NodeHead-0"),
    (["/v/bin/python3", "-B", "-c", "from multiprocessing.forkserver import main; main(25, 27,"
      " ['ray', 'ray.dashboard.subprocesses.module'], **{})"], "python3",
     "ray-dashboard-forkserver"),
    # not Ray's: vLLM's own helpers keep their names
    (["/v/bin/python3", "-B", "-c", "from multiprocessing.forkserver import main; main(1)"],
     "python3", "mp-spawn"),
])
def test_rays_real_processes_are_named_as_ray_names_them(argv: list[str], comm: str,
                                                         name: str) -> None:
    """The process pane's names for a real `ray start` tree (Ray 2.60, read in the lab)."""
    from tui.agent.names import vllm_name

    assert vllm_name(argv, comm, False) == name


def _death(process: str, at: float, cause: str | None, said_by: str = "RayWorkerWrapper",
           ) -> Death:
    found = None if cause is None else RootCause(cause, said_by, 7, 0)
    return Death(7, process, None, None, at, at, None, found)


def test_a_death_without_a_cause_borrows_the_cause_of_the_next_death_elsewhere() -> None:
    """A Ray actor on gpu-b dies with no words on its host; the driver on the head dies a
    moment later with the actor's SyntaxError, which the log monitor relayed under the actor's
    name: the run's death is the actor's, with that cause. A death long after lends nothing,
    nor do words another process printed (the head's errors about a lost peer)."""
    run = ClusterRun(_load(HOSTS + '[cluster]\nbackend = "ray"\n' + SERVER))
    run.died = RunDied("ray-node-1", "gpu-b", _death("RayWorkerWrapper", 100.0, None))
    run.sups["ray-node-1"].machine.death = run.died.death
    run.sups["server"].machine.death = _death("EngineCore_DP0", 100.4, "SyntaxError: bad")
    member, death = run.death() or (None, None)
    assert member is not None and death is not None
    assert (member.name, death.process) == ("ray-node-1", "RayWorkerWrapper")
    assert death.cause is not None and death.cause.line == "SyntaxError: bad"
    run.sups["server"].machine.death = _death("EngineCore_DP0", 100.0 + CAUSE_ELSEWHERE_S + 1,
                                              "SyntaxError: bad")
    assert run.death() == (run.part("ray-node-1"), run.died.death)
    run.sups["server"].machine.death = _death("EngineCore_DP0", 100.4,
                                              "RuntimeError: Connection closed by peer",
                                              said_by="EngineCore_DP0")
    assert run.death() == (run.part("ray-node-1"), run.died.death)
    # killed by a signal: that is its cause, what the server prints after it a symptom
    killed = replace(run.died.death, signal=9)
    run.sups["ray-node-1"].machine.death = killed
    run.sups["server"].machine.death = _death("EngineCore_DP0", 100.4, "RuntimeError: peer gone")
    assert run.death() == (run.part("ray-node-1"), killed)


def test_a_cluster_kill_marks_every_member_killing_before_the_first_is_killed() -> None:
    """Under Ray the server's end ends the actors: by then every member must be KILLING, so
    their processes ending is the kill, not a death sent in the middle of it."""
    run = ClusterRun(_load(HOSTS + '[cluster]\nbackend = "ray"\n' + SERVER))
    seen: list[list[str]] = []

    async def kill(name: str, grace: float) -> Killed:
        seen.append([m.name for m in run.parts
                     if run.sups[m.name].machine.state is State.KILLING])
        return Killed((), None, (), 0.0)

    for m in run.parts:  # each member's own kill (over SSH) replaced by one that records
        sup = run.sups[m.name]
        sup.run = RunInfo("r", "/run", 1, 0.0, attached=True)
        sup.machine.state = State.READY
        sup.kill = lambda grace, name=m.name: kill(name, grace)  # type: ignore[method-assign]
    asyncio.run(run.kill(1.0))
    assert seen[0] == ["ray-head", "ray-node-1", "server"], seen


def test_native_members_rank_the_hosts_and_the_others_run_headless() -> None:
    profile = _load(HOSTS + '[cluster]\nbackend = "native"\nport = 29600\n' + SERVER)
    head, node = members(profile)
    tail = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1",
            "--master-port", "29600"]
    assert list(head.profile.server.command[-8:]) == tail
    assert list(node.profile.server.command[-9:]) == [*tail[:3], "1", *tail[4:], "--headless"]
    assert head.joined is None and node.joined is not None
    # what vLLM 0.32's headless node printed in the lane (entrypoints/cli/serve.py); its
    # workers' first lines come before the node has reached the head, so they are no join
    assert node.joined.search(
        "(MainProcess pid=24394) INFO 12-04 18:22:24 [serve.py:224] Launching vLLM (v0.32.0) "
        "headless multiproc executor, with head node address 127.0.0.1:29511 for "
        "torch.distributed process group.")
    assert node.joined.search("INFO 05-01 10:00:00 [serve.py:240] Launching 2 data parallel "
                              "engine(s) in headless mode, with head node address tcp://a:1.")
    assert not node.joined.search("(Worker_TP8 pid=4242) INFO 12-04 10:00:00 ...")
    assert node.profile.host.jump == "gpu-a"
    assert head.profile.server.tensor_parallel_size == 8  # per host, for preflight's GPU count


ClusterFactory = Callable[..., Path]


@pytest.fixture
def two_hosts(tmp_path: Path, ssh_server: SSHTestServer) -> ClusterFactory:
    """factory(backend, scenario, fault_host) -> a TP 8 simulated profile over "local" (head)
    and the SSH server (worker host), both at 127.0.0.1, 4 fake GPUs each."""
    def make(backend: str, scenario: str = "ready", fault_host: str | None = None) -> Path:
        hosts = ""
        for target, role in (("local", "head"), (ssh_server.alias, "worker")):
            hosts += (f'[[hosts]]\nrole = "{role}"\ntarget = "{target}"\n'
                      f'address = "127.0.0.1"\npython = "{sys.executable}"\n'
                      f'runs_dir = "{tmp_path / "runs"}"\n')
        fault = f'fault_host = "{fault_host}"\n' if fault_host else ""
        path = tmp_path / f"two-{backend}.toml"
        path.write_text(f'{hosts}\n[cluster]\nbackend = "{backend}"\nport = {free_port()}\n'
                        f'join_timeout = "30s"\n'
                        f'{sim_server(tmp_path, scenario, 300.0, gpus=4)}{fault}')
        return path
    return make


def _group(path: Path, server: SSHTestServer) -> ClusterRun:
    return ClusterRun(loads_profile(path.read_text(), str(path)), opener=_opener(server))


async def _start(group: ClusterRun, cleanup: list[str]) -> None:
    """Start every member; each member's run is killed after the test, whatever happens."""
    try:
        await group.start()
    finally:
        cleanup.extend(s.run.run_id for s in group.sups.values() if s.run is not None)


@pytest.mark.parametrize("backend", ["native", "ray"])
async def test_two_hosts_reach_ready_in_order_and_kill_leaves_nothing(
        two_hosts: ClusterFactory, ssh_server: SSHTestServer, cleanup: list[str],
        backend: str) -> None:
    group = _group(two_hosts(backend), ssh_server)
    events = group.subscribe()
    seen: list[Any] = []
    try:
        await _start(group, cleanup)
        await until_event(events, lambda e: isinstance(e, MemberEvent) and e.member == "server"
                          and isinstance(e.event, Ready), 60, "READY", seen)
        joined = [e.member for e in seen if isinstance(e, Joined)]
        assert joined == (["ray-head", "ray-node-1"] if backend == "ray" else ["node-1"])
        assert not any(isinstance(e, RunDied) for e in seen)
        runs = [s.run.run_id for s in group.sups.values() if s.run is not None]
        assert len(runs) == len(group.parts) and all(carriers(r) for r in runs)
        if backend == "native":  # restart: every host killed, then launched again, in order
            await group.restart(grace=2)
            assert not any(carriers(r) for r in runs)
            runs = [s.run.run_id for s in group.sups.values() if s.run is not None]
            cleanup.extend(runs)
            assert len(runs) == len(group.parts) and all(carriers(r) for r in runs)
            await until_event(events, lambda e: isinstance(e, MemberEvent)
                              and e.member == "server" and isinstance(e.event, Ready), 60,
                              "READY again", seen)
        killed = await group.kill(grace=2)
        assert not any(k.remaining for k in killed.values())
        assert not any(carriers(r) for r in runs)
    finally:
        await group.close()


async def test_a_death_on_the_worker_host_is_the_runs_death_with_its_cause(
        tmp_path: Path, two_hosts: ClusterFactory, ssh_server: SSHTestServer,
        cleanup: list[str]) -> None:
    group = _group(two_hosts("native", "syntax-error", fault_host=ssh_server.alias), ssh_server)
    events = group.subscribe()
    try:
        await _start(group, cleanup)
        died = await until_event(events, lambda e: isinstance(e, RunDied), 60, "the death")
        assert (died.member, died.host) == ("node-1", ssh_server.alias)
        # late lines sharpen the cause (how soon the death is said: tests/bench/death.py)
        found = await async_wait_for(
            lambda: (f := group.death()) is not None and f[1].cause is not None
            and "SyntaxError" in f[1].cause.line and f, 10, "the worker's SyntaxError as cause")
        assert found[0].host == ssh_server.alias
        await group.kill(grace=2)
    finally:
        await group.close()


async def test_the_console_holds_a_two_host_run_as_one_run_with_a_row_per_host(
        tmp_path: Path, two_hosts: ClusterFactory, ssh_server: SSHTestServer,
        cleanup: list[str]) -> None:
    group = _group(two_hosts("ray", "syntax-error", fault_host=ssh_server.alias), ssh_server)
    env, record = fake_tmux(tmp_path)
    app = ConsoleApp([group], env=env, kill_grace=1.0)
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: group.died is not None, 60, "the run's death")
        cleanup.extend(s.run.run_id for s in group.sups.values() if s.run is not None)
        table = app.query_one(FleetTable)
        cells = [[table.get_cell(f"member-{i}", c).plain for c in ("run / host", "role")]
                 for i in range(3)]
        assert cells == [["  └ local", "ray-head"], [f"  └ {ssh_server.alias}", "ray-node-1"],
                         ["  └ local", "server"]], cells
        await until(pilot, lambda: table.get_cell("member-1", "state").plain == "DEAD"
                    and "SyntaxError" in table.get_cell("member-1", "alert").plain, 10,
                    "the worker host's row DEAD with its cause")
        assert table.get_cell("run-0", "state").plain == "DEAD"
        await until(pilot, lambda: any("DEAD" in " ".join(c) for c in tmux_calls(record)), 5,
                    "the tmux window says DEAD")
        await pilot.press("down", "down", "enter")  # the worker host's panes
        assert app.sup is group.sups["ray-node-1"]
        assert any("RayWorkerWrapper" in e.line.plain for e in app.window.view(raw=True))
        await pilot.press("escape", "k")
        await pilot.press("y")
        await until(pilot, lambda: all(s.machine.state.value == "stopped"
                                       for s in group.sups.values() if s.run is not None), 30,
                    "every host killed")
        assert not any(carriers(r) for r in cleanup)


async def test_a_host_that_does_not_join_in_time_is_named_and_nothing_is_left_running(
        two_hosts: ClusterFactory, ssh_server: SSHTestServer, cleanup: list[str]) -> None:
    path = two_hosts("ray")  # the head told it lives where nothing answers: it never joins
    path.write_text(path.read_text().replace('address = "127.0.0.1"', 'address = "192.0.2.1"', 1)
                    .replace('join_timeout = "30s"', 'join_timeout = "2s"'))
    group = _group(path, ssh_server)
    try:
        with pytest.raises(SpecconsoleError) as caught:
            await _start(group, cleanup)
        said = str(caught.value)
        assert said.startswith("local (ray-head) did not join within 2.0s"), said
        assert "--member ray-head" in said
        runs = [s.run.run_id for s in group.sups.values() if s.run is not None]
        assert len(runs) == 1, "nothing after the head was started"
        assert not any(carriers(r) for r in runs)
    finally:
        await group.close()


async def test_wait_follows_two_hosts_and_their_ready_timeout_kills_every_host(
        two_hosts: ClusterFactory, ssh_server: SSHTestServer, cleanup: list[str]) -> None:
    """`wait`'s one follow loop over several hosts: the joins, then the server's member given
    up on (its ready_timeout) and, with on_ready_timeout = "kill", every host killed."""
    path = two_hosts("native")
    path.write_text(path.read_text().replace("time_scale = 300.0", "time_scale = 60").replace(
        "[expect]\n", '[expect]\nready_timeout = "2s"\non_ready_timeout = "kill"\n'))
    group = _group(path, ssh_server)
    said: list[str] = []
    args = argparse.Namespace(launch=True, skip_preflight=False, kill_leftovers=False,
                              timeout=None)
    try:
        code = await follow(SeveralHosts(group), args, lambda text, **_: said.append(text))
    finally:
        cleanup.extend(s.run.run_id for s in group.sups.values() if s.run is not None)
        await group.close()
    assert code == EXIT_TIMEOUT, said
    assert said[0] == f"launching two-native on local (server), {ssh_server.alias} (node-1)"
    assert any(line.startswith(f"{ssh_server.alias} node-1: joined after ") for line in said)
    given_up = next(line for line in said if "TIMEOUT" in line)
    assert given_up.startswith("local server: TIMEOUT: not READY after 2.0s (ready_timeout), "
                               "still "), given_up
    assert given_up.endswith('killing the run (on_ready_timeout = "kill")'), given_up
    for where in (f"{ssh_server.alias} node-1", "local server"):
        assert f"{where}: killed: no process of the run remains; GPU memory released" in said
    assert cleanup and not any(carriers(r) for r in cleanup)


def test_wait_goes_on_past_a_death_the_scheduler_requeued() -> None:
    """A several-node job preempted and requeued: its first death is said, but the run is
    followed to the next allocation (ClusterRun._follow_requeue), so `wait` does not end there;
    any other first death ends it."""
    following = SeveralHosts(ClusterRun(_load(HOSTS + '[cluster]\nbackend = "native"\n' +
                                              SERVER)))
    death = _death("APIServer", 100.0, None)
    assert not following.is_death(RunDied("node-1", "gpu-b", death, requeued=True))
    assert following.is_death(RunDied("node-1", "gpu-b", death))
