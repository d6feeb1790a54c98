"""The pull of an absent image, through specconsole against real process trees and the real
docker daemon, with one stand-in: nothing can be pulled here, so a `docker` shim first on the
agent's PATH answers `docker pull IMAGE` by printing docker's non-terminal pull lines (the
shapes cited in tests/test_pull_phase.py) slowly, then `docker tag`s the lane's image as IMAGE
with the real docker (or, for an image named `...:nosuch`, prints the daemon's refusal and
fails). Every other docker call (image inspect, run, wait, stop, rm) is the real docker.

Real: the agent's launch returning while the pull runs, the monitor piping and counting the
pull, the watch and the phase "pulling image" in `wait`, the kill TERMing the monitor and the
monitor ending the pull's process group, the container started (or not) by real docker, exit.json
and the one-line cause. The shim: the pull's output and its duration.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import carriers, wait_for

from containers.conftest import ROOT, container_profile, containers_of
from tui.agent.rundir import STARTING

PULLED = "specconsole-lane:pulltest"
SHIM = """#!/bin/bash
# a stand-in for `docker pull` (see tests/containers/test_container_pull.py); the rest is docker
if [ "$1" = pull ]; then
    echo "${2##*:}: Pulling from ${2%%:*}"
    for id in 1427991e2f34 d37470673b78 7197601ade72; do echo "$id: Pulling fs layer"; done
    echo "7197601ade72: Waiting"
    for id in 1427991e2f34 d37470673b78 7197601ade72; do
        sleep "$PULL_STEP"; echo "$id: Verifying Checksum"; echo "$id: Download complete"
        sleep "$PULL_STEP"; echo "$id: Pull complete"
    done
    case "$2" in *:nosuch)
        echo "Error response from daemon: manifest for $2 not found: manifest unknown" >&2
        exit 1;;
    esac
    echo "Digest: sha256:990e1f57798f433364379cf2583702d843defb7630d8d1bb12dcdc6ce3d91ddb"
    echo "Status: Downloaded newer image for $2"
    exec "$REAL_DOCKER" tag specconsole-lane:sim "$2" >/dev/null
fi
exec "$REAL_DOCKER" "$@"
"""


@pytest.fixture
def shim_env(tmp_path: Path, image: str) -> dict[str, str]:
    """The CLI's (so the local agent's) environment with the shim first on PATH."""
    bin_dir = tmp_path / "shim"
    bin_dir.mkdir()
    shim = bin_dir / "docker"
    shim.write_text(SHIM)
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    real = subprocess.run(["which", "docker"], capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run(["docker", "rmi", PULLED], capture_output=True)
    yield {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REAL_DOCKER": real,
           "PULL_STEP": "1"}
    subprocess.run(["docker", "rmi", PULLED], capture_output=True)


def _profile(tmp_path: Path, scenario: str, image: str) -> Path:
    path = container_profile(tmp_path, scenario)
    path.write_text(path.read_text().replace('image = "specconsole-lane:sim"',
                                             f'image = "{image}"'))
    assert f'image = "{image}"' in path.read_text()
    return path


def _cli(env: dict[str, str], *args: str, timeout: float = 120,
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, env=env)


def _run_dir(tmp_path: Path, stdout: str) -> Path:
    run_id = re.search(r"launched run (\S+)", stdout).group(1)
    return tmp_path / "runs" / run_id


def _shim_processes(shim_dir: Path) -> list[int]:
    """Live processes started from the shim (bash running it, its sleeps)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if str(shim_dir).encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                found.append(int(name))
        except OSError:
            continue
    return found


def test_the_launch_returns_as_the_pull_starts_and_the_pull_is_a_phase(
        tmp_path: Path, shim_env: dict[str, str], remove_containers, cleanup) -> None:
    profile = _profile(tmp_path, "ready", PULLED)
    launched = _cli(shim_env, "launch", str(profile), "--skip-preflight")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    run_dir = _run_dir(tmp_path, launched.stdout)
    remove_containers.append(run_dir.name)
    cleanup.append(run_dir.name)
    assert f"pulling image {PULLED} first" in launched.stdout
    # returned while the pull runs: no container yet, the image not there yet
    marker = json.loads((run_dir / STARTING).read_text())  # the monitor says it pulls
    assert marker["pulling"] is True and containers_of(run_dir.name) == []
    waited = _cli(shim_env, "wait", str(profile), "--timeout", "90s")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    phases = [line.split("phase: ", 1)[1].split(" (at")[0]
              for line in waited.stdout.splitlines() if "phase: " in line]
    assert phases[:2] == ["pulling image", "launching"], waited.stdout
    log = (run_dir / "server.log").read_text()
    assert "specconsole: pulling image specconsole-lane:pulltest: 3/3 layers" in log
    killed = _cli(shim_env, "kill", str(profile), "--grace", "5")
    assert "no process of the run remains" in killed.stdout, killed.stdout + killed.stderr
    assert containers_of(run_dir.name) == [] and carriers(run_dir.name) == []


def test_a_kill_during_the_pull_ends_it_and_leaves_nothing(
        tmp_path: Path, shim_env: dict[str, str], remove_containers, cleanup) -> None:
    profile = _profile(tmp_path, "ready", PULLED)
    launched = _cli({**shim_env, "PULL_STEP": "5"}, "launch", str(profile), "--skip-preflight")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    run_dir = _run_dir(tmp_path, launched.stdout)
    remove_containers.append(run_dir.name)
    cleanup.append(run_dir.name)
    log = run_dir / "server.log"
    wait_for(lambda: "Pulling fs layer" in log.read_text(), 30, "the pull's first lines")
    assert _shim_processes(tmp_path / "shim"), "the pull runs"
    killed = _cli(shim_env, "kill", str(profile), "--grace", "5")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "no process of the run remains" in killed.stdout, killed.stdout
    exit_info = json.loads((run_dir / "exit.json").read_text())
    assert exit_info["signal"] == 15
    assert exit_info["error"] == f"killed while pulling image {PULLED}"
    assert not (run_dir / STARTING).exists()
    assert _shim_processes(tmp_path / "shim") == []
    assert containers_of(run_dir.name) == [] and carriers(run_dir.name) == []
    assert subprocess.run(["docker", "image", "inspect", PULLED],
                          capture_output=True).returncode != 0, "the pull did not finish"


def test_a_failed_pull_is_dead_in_the_phase_pulling_image_with_one_line(
        tmp_path: Path, shim_env: dict[str, str], remove_containers, cleanup) -> None:
    image = "specconsole-lane:nosuch"
    profile = _profile(tmp_path, "ready", image)
    waited = _cli({**shim_env, "PULL_STEP": "0.2"}, "wait", str(profile), "--launch",
                  "--skip-preflight", "--timeout", "60s")
    run_dir = _run_dir(tmp_path, waited.stdout)
    remove_containers.append(run_dir.name)
    cleanup.append(run_dir.name)
    assert waited.returncode == 3, waited.stdout + waited.stderr
    said = (f"cannot pull image {image}: Error response from daemon: manifest for {image} "
            "not found: manifest unknown")
    assert said in waited.stdout and "pulling image" in waited.stdout, waited.stdout
    exit_info = json.loads((run_dir / "exit.json").read_text())
    assert exit_info["error"] == said and exit_info["pid"] is None
    assert containers_of(run_dir.name) == []
