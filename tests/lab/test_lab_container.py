"""The server in a docker container on a lab host, reached through the real sshd: the link
drops mid-load and comes back; every line once, the run never taken for dead, READY, then a
kill that leaves no container and no process.

The daemon is this machine's; a lab host (a network namespace) reaches its socket, which a
network namespace does not hide, so the agent's `docker run` over sshd makes a real container
of that daemon, in the lane's image (tests/containers/setup_docker.py; `bootstrap lab` builds
it). Its network: docker's host network is the daemon's, this machine's root namespace, and
`-p` publishes there too, while the agent probes 127.0.0.1:PORT on the lab host. So the
container runs with `--network host` (specconsole then publishes no port), as it would on a
real GPU host, and its Python is a wrapper that first joins the lab host's namespace (nsenter;
the container gets CAP_SYS_ADMIN and /run/netns): the server listens beside the agent, as it
would there, and the cut link breaks ssh only, not the agent's probe.
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

from containers.conftest import container_tables, containers_of, lane_image, remove_containers_of
from helpers import carriers

from lab.netlab import Lab
from lab.test_lab_link import ROOT, SHOW_LOST_S, finish_ready, watching
from tui.core.state import State, StateChanged

HOST = "gpu-a"
RUN_ARGS = ("--network", "host", "--cap-add", "SYS_ADMIN", "-v", "/run/netns:/run/netns:ro")
KILL_TIMEOUT_S = 120.0
FIGURE = "link down 10 s (a container on gpu-a)"


def netns_python(tmp: Path, netns: str) -> Path:
    """The container's Python: this machine's, run in the lab host's network namespace."""
    wrapper = tmp / "netns-python"
    wrapper.write_text(f"#!/bin/sh\nexec /usr/bin/nsenter --net=/run/netns/{netns} "
                       f"{os.path.realpath(sys.executable)} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def net_namespace(pid: int) -> int | None:
    """The inode of the process's network namespace; None once it has ended."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def running(container: str) -> bool:
    done = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", container],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip() == "true"


async def test_link_down_mid_load_in_a_container(lab: Lab, lab_profile: Callable[..., Path],
                                                  tmp_path: Path, cleanup: list[str],
                                                  lab_figures: dict[str, Any]) -> None:
    lane_image("lab")
    netns = lab.ns[HOST]
    python = netns_python(tmp_path, netns)
    profile = lab_profile(HOST, name="container", sections=container_tables(
        tmp_path, "command", RUN_ARGS, python=str(python)))
    run_ids: list[str] = []
    try:
        async with watching(profile, tmp_path) as w:
            run_ids.append(w.run_id)
            cleanup.append(w.run_id)
            states = w.sup.subscribe()
            (container,) = containers_of(w.run_id)
            # the server's processes are the container's, on the lab host's network
            # (the container's init, the run's top pid, stays in the daemon's: host network)
            lab_net = os.stat(f"/run/netns/{netns}").st_ino
            assert net_namespace(w.pid) != lab_net
            await w.until(lambda: (servers := [p for p in carriers(w.run_id) if p != w.pid])
                          and all(net_namespace(p) == lab_net for p in servers), 15,
                          "the server to run in the lab host's network namespace")
            _, healed = await w.outage(lambda: lab.link_down(HOST), lambda: lab.link_up(HOST))
            assert max(w.lost) < SHOW_LOST_S, w.lost
            await finish_ready(w, healed, FIGURE, lab_figures, tmp_path / "runs")
            seen: list[State] = []
            while not states.empty():
                event = states.get_nowait()
                if isinstance(event, StateChanged):
                    seen.append(event.state)
            assert State.READY in seen and State.DEAD not in seen, seen
            assert w.sup.machine.death is None and "DEAD" not in w.cli_text()
            assert containers_of(w.run_id) == [container] and running(container)
        started = time.monotonic()
        kill = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tui", "kill", str(profile), "--grace", "5", cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(kill.communicate(), KILL_TIMEOUT_S)
        assert kill.returncode == 0, out.decode()
        assert "no process of the run remains" in out.decode()
        lab_figures[FIGURE]["kill_grace_5_s"] = round(
            time.monotonic() - started, 2)
        assert containers_of(run_ids[0]) == [] and carriers(run_ids[0]) == []
    finally:
        for run_id in run_ids:
            remove_containers_of(run_id)
