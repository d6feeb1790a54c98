"""The Slurm lane with the login node over SSH (the fault lab's gpu-a wired to the cluster:
sshlogin.py): the agent reaching the job's node over SSH through the login node (reach =
"ssh", real sshd on the node, host keys checked strictly), and the link between this machine
(the jump host) and the login node dropped mid-load under the default reach (a step of the job,
srun run on the login node): no line lost or shown twice, never DEAD for the link."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import carriers, count_lines, next_event, sim_server

from slurm.conftest import record_figure
from slurm.slurmlab import Cluster
from slurm.sshlogin import SshLogin
from slurm.test_slurm_jobs import _event, _launch, _ready, _worker, scontrol
from tui.core.errors import SessionError
from tui.core.profile import load_profile
from tui.core.state import Died, LinesAdded, Ready, State
from tui.remote import slurm as remote_slurm
from tui.supervise.events import JobAllocated, LinkLost, LinkRestored
from tui.supervise.supervisor import Supervisor

LINK_DOWN_S = 9.0  # the login node's link held down, mid-load
DOWN_AFTER_S = 3.0  # after the launch has found its run: the load lasts about 30 s


def login_profile(tmp: Path, login: SshLogin, *, reach: str, time_scale: float = 300.0,
                  name: str = "job", **host: str) -> Path:
    """The simulated engine through Slurm, [host] the login node over SSH (`host` overrides
    its keys)."""
    table = {**login.host_table(), "runs_dir": str(tmp / "runs"), **host}
    lines = "".join(f"{key} = {json.dumps(value)}\n" for key, value in table.items())
    path = tmp / f"{name}.toml"
    path.write_text(f"""
[host]
{lines}{sim_server(tmp, "ready", time_scale)}
[slurm]
partition = "batch"
time = "5"
job_name = "{name}"
reach = "{reach}"
""")
    return path


def _left_on_node(cluster: Cluster, node: str, job_id: str) -> list[str]:
    """What of the job (SLURM_JOB_ID in its environment) or of sshd's sessions still runs in
    the node's namespace (the lane's other tests' jobs are theirs to clean up)."""
    pids = subprocess.run(["ip", "netns", "pids", cluster.namespace(node)], capture_output=True,
                          text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        session = cmd.startswith("sshd: ") and "[listener]" not in cmd
        if session or f"SLURM_JOB_ID={job_id}".encode() in env:
            found.append(f"{pid} {cmd.strip()}")
    return found


async def test_reach_ssh_through_the_login_node_ready_then_a_worker_killed_then_nothing_left(
        tmp_path: Path, cluster: Cluster, ssh_login: SshLogin, jobs: list[str]) -> None:
    sup = Supervisor(load_profile(login_profile(tmp_path, ssh_login, reach="ssh")))
    events = sup.subscribe()
    node = ""
    try:
        to_running, to_ready = await _ready(sup, jobs)
        assert sup.job is not None and sup.job.node is not None
        node = sup.job.node
        assert isinstance(sup.session, remote_slurm.NodeSession)
        # the agent's link is SSH to the node at its NodeAddr, from the login node (the jump)
        index = cluster.nodes.index(node) + 1
        accepted = (ssh_login.lab.workdir / node / "sshd.log").read_text()
        assert f"Accepted publickey for root from {ssh_login.net}.{100 + index}.1" in accepted
        record_figure("reach ssh through the login node: submit -> running -> READY (s)",
                      f"{to_running:.2f} -> {to_ready:.2f}")
        victim = _worker(sup.run.run_id, "Worker_TP3")
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        died = await next_event(events, Died, 30)
        record_figure("reach ssh through the login node: worker SIGKILL -> DEAD (ms)",
                      round((time.monotonic() - killed_at) * 1000, 1))
        assert sup.machine.state is State.DEAD
        assert died.death.process == "Worker_TP3" and died.death.ended_by is None
    finally:
        if sup.run is not None:
            await sup.kill(2.0)
        await sup.close()
    assert carriers(sup.run.run_id) == []
    assert scontrol(jobs[0], cluster)["JobState"] in ("CANCELLED", "COMPLETED")
    deadline = time.monotonic() + 10  # sshd's session processes end as their link closes
    while (left := _left_on_node(cluster, node, jobs[0])) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert left == []


async def test_reach_ssh_checks_the_nodes_host_key_strictly_and_cancels_the_job(
        tmp_path: Path, cluster: Cluster, ssh_login: SshLogin, jobs: list[str]) -> None:
    """A known_hosts with the login node's key only: the node's unknown key refuses the launch
    in one line naming the node and how to add its key (scanned through the login node), and
    the job is cancelled rather than left running with nobody watching."""
    login = ssh_login.lab.address("gpu-a")
    known = tmp_path / "known_hosts"
    known.write_text("".join(line for line in ssh_login.lab.known_hosts.read_text().splitlines(
        keepends=True) if line.startswith(f"{login},")))
    sup = Supervisor(load_profile(login_profile(tmp_path, ssh_login, reach="ssh",
                                                known_hosts=str(known))))
    logs = {node: ssh_login.lab.workdir / node / "sshd.log" for node in cluster.nodes}
    before = {node: log.stat().st_size for node, log in logs.items()}
    try:
        events, launching, _ = await _launch(sup, jobs)
        allocated = await _event(events, JobAllocated, launching, 60)
        with pytest.raises(SessionError) as refused:
            await launching
    finally:
        await sup.close()
    said = str(refused.value)
    node = allocated.job.node
    address = cluster.address(node)
    assert "\n" not in said
    assert said.startswith(f"{node}: job {jobs[0]}'s node could not be reached, so the job was "
                           f"cancelled (scancel {jobs[0]}): {address}: host key unknown"), said
    assert f"ssh {login} ssh-keyscan -p 22 {address} >> {known}" in said, said
    assert scontrol(jobs[0], cluster)["JobState"] == "CANCELLED"
    assert b"Accepted" not in logs[node].read_bytes()[before[node]:]  # refused before login


async def test_the_login_nodes_link_dropped_mid_load_loses_no_line_and_is_never_dead(
        tmp_path: Path, cluster: Cluster, ssh_login: SshLogin, jobs: list[str]) -> None:
    sup = Supervisor(load_profile(login_profile(tmp_path, ssh_login, reach="step",
                                                time_scale=50.0)))
    seen: list[tuple[float, Any]] = []
    tap = sup.subscribe()

    async def record() -> None:
        while True:
            seen.append((time.monotonic(), await tap.get()))

    recorder = asyncio.create_task(record())
    try:
        events, launching, _ = await _launch(sup, jobs)
        await _event(events, JobAllocated, launching, 60)
        await launching
        await asyncio.sleep(DOWN_AFTER_S)
        assert sup.machine.state in (State.STARTING, State.LOADING)  # mid-load
        downed = time.monotonic()
        ssh_login.link_down()
        try:
            lost = await next_event(events, LinkLost, 15)
            lost_at = time.monotonic()
            await asyncio.sleep(downed + LINK_DOWN_S - time.monotonic())
        finally:
            ssh_login.link_up()
        healed = time.monotonic()
        await next_event(events, LinkRestored, 60)
        restored_at = time.monotonic()
        await next_event(events, Ready, 90)
        assert lost.host == ssh_login.host_table()["target"]
        assert not [e for _, e in seen if isinstance(e, Died)], "DEAD for a lost link"
        assert sup.machine.state is State.READY and sup.machine.death is None
        await asyncio.sleep(0.5)  # the last chunks of the load
        lines = [chunk.chunk.line(i) for _, chunk in seen if isinstance(chunk, LinesAdded)
                 for i in range(len(chunk.chunk))]
        count = count_lines(lines, Path(sup.run.run_dir) / "server.log")
        assert count.processes >= 8 and count.seq_faults == [], count.seq_faults
        assert count.stray == 0 and not count.out_of_order
        assert (count.lost, count.duplicated) == (0, 0), count
        record_figure(f"login node's link down {LINK_DOWN_S:g} s mid-load",
                      f"LOST shown {lost_at - downed:.1f} s after, reconnected "
                      f"{restored_at - healed:.1f} s after the link came back, "
                      f"{count.shown} lines: {count.lost} lost, {count.duplicated} twice")
    finally:
        recorder.cancel()
        if sup.run is not None:
            await sup.kill(2.0)
        await sup.close()
    assert carriers(sup.run.run_id) == []
