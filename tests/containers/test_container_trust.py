"""What the host trusts of a container, through the real daemon: code inside the container
rewrites or links every file it can reach and the host agent, `status` and `kill` still act on
the run's own processes alone; secret values never appear in what `docker inspect` prints; and
a daemon that dies under a running container is told in words, never as a death with an
unknown code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import alive, carriers, next_event, wait_for

from containers.conftest import (
    ROOT,
    container_profile,
    containers_of,
    lane_image,
    podman_ulimits,
)
from containers.setup_docker import IMAGE, ensure_daemon
from tui.core.profile import load_profile
from tui.core.state import Died, Ready
from tui.supervise.events import RunInfo
from tui.supervise.supervisor import Supervisor

HOSTILE = Path(__file__).resolve().parent / "hostile"
SECRET = "hf_lane_secret_value_31337"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, env=dict(os.environ))


def _decoy_container(runtime: str) -> str:
    """Another container on the host, not the run's: it must outlive the run's kill."""
    name = f"specconsole-decoy-{os.getpid()}-{runtime}"
    subprocess.run([runtime, "rm", "-f", name], capture_output=True)
    limits = podman_ulimits() if runtime == "podman" else []
    subprocess.run([runtime, "run", "-d", "--name", name, *limits, "-v", "/usr:/usr:ro",
                    "--entrypoint", "/usr/bin/sleep", IMAGE, "600"],
                   capture_output=True, text=True, check=True)
    return name


async def _launched_ready(sup: Supervisor, remove_containers: list[str],
                          cleanup: list[str]) -> RunInfo:
    """Launch the supervisor's profile (its container removed and its processes killed after
    the test, whatever happens) and wait for READY."""
    events = sup.subscribe()
    run = await sup.launch(skip_preflight=True)
    remove_containers.append(run.run_id)
    cleanup.append(run.run_id)
    await next_event(events, Ready, 60)
    return run


def _running(runtime: str, name: str) -> bool:
    done = subprocess.run([runtime, "inspect", "-f", "{{.State.Running}}", name],
                          capture_output=True, text=True)
    return done.stdout.strip() == "true"


async def test_a_container_that_rewrites_what_it_can_reach_moves_nothing_on_the_host(
        tmp_path: Path, runtime: str, remove_containers, cleanup) -> None:
    lane_image(runtime=runtime)
    decoy = _decoy_container(runtime)
    bystander = subprocess.Popen(["sleep", "600"])  # a host process of someone else's
    report = tmp_path / "report.json"
    profile = container_profile(tmp_path, "ready", time_scale=60.0, entrypoint="command",
                                runtime=runtime)
    text = profile.read_text().replace(
        f'PYTHONPATH = "{ROOT}"', f'PYTHONPATH = "{HOSTILE}:{ROOT}"\n'
        f'HOSTILE_REPORT = "{report}"\nHOSTILE_DECOY_BOX = "{decoy}"\n'
        f'HOSTILE_DECOY_PID = "{bystander.pid}"', 1)
    profile.write_text(text)
    sup = Supervisor(load_profile(profile))
    try:
        run = await _launched_ready(sup, remove_containers, cleanup)
        said = json.loads(report.read_text())
        # the run directory is not in the container: only its own log is
        assert said["found"] == ["server.log"], said
        assert said["server.log unlink"] != "done" and said["server.log replace"] != "done"
        run_dir = Path(run.run_dir)
        launch = json.loads((run_dir / "launch.json").read_text())
        assert launch["run_id"] == run.run_id and launch["container"]["name"] != decoy
        assert json.loads((run_dir / "pid").read_text())["pid"] != bystander.pid
        assert not (run_dir / "exit.json").exists()
        assert (run_dir / "server.log").is_file() and not (run_dir / "server.log").is_symlink()
        assert bystander.pid not in sup.machine.procs  # the console's processes are the run's
    finally:
        await sup.close()
    try:
        status = _cli("status", str(profile))
        assert status.returncode == 0 and run.run_id in status.stdout, status.stdout
        killed = _cli("kill", str(profile), "--grace", "5")
        assert killed.returncode == 0, killed.stdout + killed.stderr
        assert containers_of(run.run_id, runtime) == [] and carriers(run.run_id) == []
        assert _running(runtime, decoy), "the decoy container was stopped by the run's kill"
        assert alive(bystander.pid), "the bystander process was killed by the run's kill"
    finally:
        bystander.kill()
        bystander.wait()
        subprocess.run([runtime, "rm", "-f", decoy], capture_output=True)


async def test_secrets_are_not_in_what_inspect_shows_and_listen_is_the_published_address(
        tmp_path: Path, runtime: str, remove_containers, cleanup,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A loopback `listen` as written (the server inside listens on the container's every
    address, the port is published on the host's loopback alone) reaches READY; the secret
    is the server's and in no field `inspect` prints."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    profile = container_profile(tmp_path, "ready", time_scale=60.0, runtime=runtime)
    profile.write_text(profile.read_text().replace(
        "[server]\n", '[server]\nsecret_env = ["HF_TOKEN"]\nlisten = "127.0.0.1"\n', 1))
    sup = Supervisor(load_profile(profile))
    try:
        run = await _launched_ready(sup, remove_containers, cleanup)
        (cid,) = containers_of(run.run_id, runtime)
        port = sup.profile.server.port
        published = subprocess.run([runtime, "port", cid], capture_output=True, text=True,
                                   check=True).stdout.split()
        assert published[-1] == f"127.0.0.1:{port}", published
        shown = subprocess.run([runtime, "inspect", cid], capture_output=True, text=True,
                               check=True).stdout
        assert SECRET not in shown and "HF_TOKEN" not in shown
        # the server has it: its engine's environment on the host (the owner's to read)
        engine = next(p for p, n in sup.machine.names().items() if n == "EngineCore_DP0")
        environ = Path(f"/proc/{engine}/environ").read_bytes().split(b"\0")
        assert f"HF_TOKEN={SECRET}".encode() in environ
        held = subprocess.run([runtime, "exec", cid, "/usr/bin/cat",
                               "/run/specconsole/secrets.env"], capture_output=True, text=True)
        assert held.returncode == 0 and held.stdout == "", "the file is emptied once read"
        assert not (Path(run.run_dir) / "secrets.env").exists()
        assert SECRET not in (Path(run.run_dir) / "launch.json").read_text()
    finally:
        await sup.kill(2.0)
        await sup.close()


async def test_the_daemon_dying_under_a_running_container_is_told_in_words(
        tmp_path: Path, image: str, remove_containers, cleanup) -> None:
    """dockerd SIGKILLed while the container serves, then started again (it ends containers
    it finds running): the monitor's `docker wait` fails, it asks again once the daemon
    answers, and the run's end says the daemon restarted, with the container's exit code."""
    sup = Supervisor(load_profile(container_profile(tmp_path, "ready", time_scale=60.0)))
    events = sup.subscribe()
    try:
        run = await sup.launch(skip_preflight=True)
        remove_containers.append(run.run_id)
        cleanup.append(run.run_id)
        await next_event(events, Ready, 60)
        daemons = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True,
                                 text=True).stdout.split()
        assert daemons, "no dockerd process to restart"
        for pid in daemons:
            os.kill(int(pid), signal.SIGKILL)
        wait_for(lambda: not any(alive(int(p)) for p in daemons), 30, "dockerd gone")
        time.sleep(1.0)  # the monitor's wait has failed by now
        _restart_daemon()
        died = await next_event(events, Died, 120)
        assert died.death is not None
        exit_path = Path(run.run_dir) / "exit.json"
        wait_for(exit_path.exists, 120, "exit.json")
        ended = json.loads(exit_path.read_text())
        assert ended["error"].startswith("the docker daemon restarted; the container died "
                                         "with it (exit code "), ended
        assert isinstance(ended["code"], int), ended
        log = (Path(run.run_dir) / "server.log").read_text()
        assert "specconsole: the docker daemon restarted; the container died with it" in log
    finally:
        _restart_daemon()  # the lane goes on with a daemon that answers, whatever happened
        await sup.kill(2.0)
        await sup.close()


def _restart_daemon() -> None:
    """dockerd started again after a crash, as whoever restarts it does: the pid files its
    SIGKILLed self and its containerd left (their numbers may be taken by now) removed first."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return
    wait_for(lambda: subprocess.run(["pgrep", "-x", "containerd"], capture_output=True)
             .returncode != 0, 30, "dockerd's containerd gone with it")
    for stale in ("/var/run/docker.pid", "/var/run/docker/containerd/containerd.pid"):
        Path(stale).unlink(missing_ok=True)
    ensure_daemon()
