"""The Slurm lane: a real Ray cluster started inside a two-node job's allocation, as the HPC
centres' vLLM guides do it (`ray start --head` on the first node, `ray start --address` on the
second, then `vllm serve --distributed-executor-backend ray` on the head): the simulated engine
on the real Ray of the lanes' Ray venv, each member started by the agent the job script started
on its node and watched through a step of the job."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import carriers, ray_venv

from slurm.conftest import record_figure
from slurm.slurmlab import Cluster
from slurm.test_slurm_jobs import (
    _queued,
    scontrol,
    sigkill_is_the_runs_death,
    two_node_profile,
    two_node_ready,
)
from tui.core.profile import load_profile
from tui.supervise.group import ClusterRun

# any process of Ray, by its name or command line (what must be gone after the kill)
RAY_PROCESS = re.compile(rb"raylet|gcs_server|plasma_store|ray::|ray-dashboard|log_monitor"
                         rb"|ray/dashboard|ray/autoscaler|/bin/ray start")
# Ray's head and the server on the first node, a Ray node on the second, in launch order
RAY_LAYOUT = (("ray-head", 0), ("ray-node-1", 1), ("server", 0))


def ray_profile(tmp: Path) -> Path:
    """The simulated engine at TP 8 on a real Ray cluster over a two-node job, 4 fake GPUs per
    node; every member's Python is the Ray venv's (it imports this checkout)."""
    venv = ray_venv()
    return two_node_profile(
        tmp, 'mem = "3G"', backend="ray", python=str(venv / "bin" / "python"),
        server_extra='[server.env]\nRAY_USAGE_STATS_ENABLED = "0"\n',
        cluster_extra=f'ray = ["{venv / "bin" / "ray"}"]')


def _in_namespace(pid: int) -> list[tuple[int, bytes]]:
    """Live processes in `pid`'s network namespace: (pid, command line)."""
    ns = os.readlink(f"/proc/{pid}/ns/net")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "net") != ns:
                continue
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            comm = (entry / "comm").read_bytes().strip()
        except OSError:
            continue
        if state not in (b"Z", b"X"):
            found.append((int(entry.name), comm + b" " + cmd))
    return found


def ray_left(cluster: Cluster, nodes: tuple[str, ...]) -> list[str]:
    """Ray's processes still on the nodes (their slurmd's namespaces), by name and command."""
    out = []
    for node in nodes:
        slurmd = cluster.slurmd_pid(node)
        assert slurmd is not None, f"slurmd on {node} is gone"
        out += [f"{node} {pid} {cmd[:100].decode(errors='replace')}"
                for pid, cmd in _in_namespace(slurmd) if RAY_PROCESS.search(cmd)]
    return out


@pytest.mark.timeout(400)
async def test_ray_inside_a_two_node_job_ready_then_an_actor_killed_then_nothing_left(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """One job of two nodes: Ray's head and the server on the first, a Ray node on the second,
    each in its node's namespace; the four actors on the second node are its member's (they
    carry its run id outside the launch's process group, as Ray starts them). One actor
    SIGKILLed on the second node is the run's death within 1 s, naming it and that node. The
    kill then leaves nothing of the run and nothing of Ray on either node, and the job out of
    the queue."""
    group = ClusterRun(load_profile(ray_profile(tmp_path)))
    events = group.subscribe()
    seen: list[Any] = []
    try:
        nodes = await two_node_ready(group, events, seen, cluster, jobs, RAY_LAYOUT,
                                     ("ray-head", "ray-node-1"), "two-node job, Ray inside it")
        node = group.sups["ray-node-1"]
        assert node.run is not None

        def actors() -> list[int]:
            return [p for p, n in node.machine.names().items() if n == "RayWorkerWrapper"]

        deadline = time.monotonic() + 30
        while len(actors()) != 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert len(actors()) == 4, node.machine.names()
        top_group = os.getpgid(node.run.pid)
        for pid in actors():
            assert os.getpgid(pid) != top_group, "Ray starts its actors outside the launch"
            assert node.run.run_id in Path(f"/proc/{pid}/environ").read_text(errors="replace")
        died, after = await sigkill_is_the_runs_death(events, seen, actors()[0], "ray-node-1",
                                                      nodes[1])
        assert died.death.process == "RayWorkerWrapper"
        record_figure("two-node job, Ray inside it: actor SIGKILL on the second node -> DEAD "
                      "(ms)", round(after * 1000, 1))
        runs = [s.run.run_id for s in group.sups.values() if s.run is not None]
        assert len(runs) == len(RAY_LAYOUT)
        await group.kill(3.0)
        for run_id in runs:
            assert not carriers(run_id), f"{run_id} left processes behind"
        assert ray_left(cluster, nodes) == []
        assert scontrol(jobs[-1], cluster)["JobState"] == "CANCELLED"
        assert _queued(jobs[-1], cluster) == ""
    finally:
        await group.close()
