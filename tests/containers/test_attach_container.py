"""`specconsole attach --container`: a container started by the test with plain `docker run`
or `podman run` (not by specconsole) is followed to READY; a worker SIGKILLed from the host
is DEAD with its container pid and host pid; its log, copied from `docker logs` (podman's),
has every line once across a re-attach; a kill without --yes is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_port, next_event, wait_for

from containers.conftest import ROOT, podman_ulimits
from containers.setup_docker import IMAGE
from tui.core.attach import attach_profile
from tui.core.profile import AttachTarget
from tui.core.state import Died, Ready, State
from tui.supervise.supervisor import Supervisor


@pytest.fixture
def colleagues(tmp_path: Path, runtime: str) -> Iterator[tuple[str, int, str]]:
    """`docker run -d` (or podman's) of the lane's image (its ENTRYPOINT: the simulated `vllm
    serve`), as a colleague would start it; removed (forced) whatever the test did."""
    port = free_port()
    home = Path(sys.base_prefix)
    name = f"colleague-{os.getpid()}-{port}"
    volumes = ["/usr:/usr:ro", f"{home}:{home}:ro", f"{ROOT}:{ROOT}:ro", f"{tmp_path}:{tmp_path}"]
    limits = podman_ulimits() if runtime == "podman" else []
    subprocess.run([runtime, "run", "-d", "--name", name, "--init", "--network", "host",
                    *limits, "-e", f"PYTHONPATH={ROOT}", "-e", "PYTHONUNBUFFERED=1",
                    *[a for v in volumes for a in ("-v", v)], IMAGE, "/models/Kimi-K2.5",
                    "--port", str(port), "--tensor-parallel-size", "4", "--sim-scenario",
                    "ready", "--sim-time-scale", "300", "--sim-gpus", "4", "--sim-gpu-state",
                    str(tmp_path / "gpus")], check=True, capture_output=True, timeout=120)
    try:
        yield name, port, runtime
    finally:
        subprocess.run([runtime, "rm", "-f", name], capture_output=True, timeout=60)


def _runtime_logs(runtime: str, name: str) -> bytes:
    done = subprocess.run([runtime, "logs", name], capture_output=True, timeout=60)
    return done.stdout + done.stderr


def _worker(top: int, name: str) -> int:
    """The host pid of the descendant of `top` titled VLLM::<name>."""
    family, found = {top}, 0
    changed = True
    while changed:
        changed = False
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                argv = Path(f"/proc/{entry}/cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if ppid in family and int(entry) not in family:
                family.add(int(entry))
                changed = True
                if argv.startswith(f"VLLM::{name}".encode()):
                    found = int(entry)
    return found


async def test_attach_container_ready_dead_worker_with_both_pids_log_once_across_reattach(
        tmp_path: Path, colleagues: tuple[str, int, str]) -> None:
    name, port, runtime = colleagues
    profile = attach_profile(AttachTarget(container=name, runtime=runtime), port=port,
                             runs_dir=str(tmp_path / "runs"), python=sys.executable)
    first = Supervisor(profile)
    events = first.subscribe()
    try:
        run = await first.start(launch=False)
        assert run.owner is not None and f"container {name}" in run.owner
        await next_event(events, Ready)
    finally:
        await first.close()  # detached: the helper goes on copying the log

    second = Supervisor(profile)  # the re-attach
    events = second.subscribe()
    try:
        again = await second.start(launch=False)
        assert again.run_id == run.run_id and again.pid == run.pid
        await next_event(events, Ready)
        refused = subprocess.run(
            [sys.executable, "-m", "tui", "kill", "--container", name, "--runtime", runtime,
             "--runs-dir",
             str(tmp_path / "runs"), "--python", sys.executable], cwd=ROOT, text=True,
            capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert refused.returncode == 2 and "--yes" in refused.stderr, refused.stderr
        worker = wait_for(lambda: _worker(run.pid, "Worker_TP3"), what="Worker_TP3")
        os.kill(worker, signal.SIGKILL)
        died = await next_event(events, Died)
        assert second.machine.state is State.DEAD
        assert died.death.process == "Worker_TP3" and died.death.pid == worker
        assert died.death.cpid is not None and died.death.cpid != worker
        assert f"pid {worker}, {died.death.cpid} in the container" in died.death.summary()
    finally:
        await second.close()
    exit_json = Path(run.run_dir) / "exit.json"
    subprocess.run([runtime, "stop", "--time", "5", name], capture_output=True, timeout=60)
    wait_for(exit_json.exists, 60, "the helper's exit.json once the container ended")
    copied = Counter((Path(run.run_dir) / "server.log").read_bytes().splitlines())
    # stdout's and stderr's lines, each stream in order
    logged = Counter(_runtime_logs(runtime, name).splitlines())
    assert sum((logged - copied).values()) == 0, "lines lost"
    assert sum((copied - logged).values()) == 0, "lines copied twice"
    assert sum(copied.values()) > 50
