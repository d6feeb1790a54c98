"""Preflight of a [container] profile against the real docker daemon: an absent image (one
line; pulled at launch, refused with pull = "never"), the shm rule, a leftover container of an
ended run holding the simulated GPUs (killed by --kill-leftovers: nothing of it remains), and
a container that is not specconsole's holding the port and a GPU (named by preflight)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import carriers, wait_for

from containers.conftest import ROOT, container_profile, containers_of
from tui.cli.exit_codes import EXIT_PREFLIGHT
from tui.sim import gpu_state

GIB = 2**30


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, env=dict(os.environ))


def _edit(profile: Path, old: str, new: str) -> Path:
    text = profile.read_text()
    assert old in text
    profile.write_text(text.replace(old, new, 1))
    return profile


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


@pytest.fixture
def started() -> Iterator[list[str]]:
    """Containers a test starts by hand (names), removed (force) whatever happened."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


def _sleeper(image: str, name: str, *options: str) -> int:
    """A container of the lane's image that sleeps; the host pid of its sleep (under --init)."""
    _docker("run", "-d", "--init", "--name", name, "-v", "/usr:/usr:ro", *options,
            "--entrypoint", "/usr/bin/sleep", image, "infinity")
    top = int(_docker("inspect", "-f", "{{.State.Pid}}", name))

    def child() -> int | None:
        kids = Path(f"/proc/{top}/task/{top}/children").read_text().split()
        return int(kids[0]) if kids else None
    return wait_for(child, 30, "the container's sleep")


def _hold_gpu(state: Path, pid: int, gpu: int) -> None:
    """The simulated GPUs say pid holds 2 GiB on `gpu` (as a simulated worker would)."""
    gpu_state.ensure_devices(str(state), 8)
    (state / f"holder-{pid}.json").write_text(json.dumps({"pid": pid, "gpu": gpu,
                                                          "used": 2 * GIB, "util": 0}))


def test_an_absent_image_is_one_line_pulled_at_launch_or_refused(tmp_path: Path,
                                                                 image: str) -> None:
    absent = "specconsole-lane:absent"
    profile = _edit(container_profile(tmp_path, "ready"), f'image = "{image}"',
                    f'image = "{absent}"')
    checked = _cli("check", str(profile))
    assert checked.returncode == 0, checked.stdout + checked.stderr  # a warning only
    assert (f"warn image: image {absent} is not on this host: the launch pulls it first "
            f"(`docker pull {absent}`)") in checked.stdout.splitlines()

    launched = _cli("launch", str(profile))  # returns as the pull starts
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert f"pulling image {absent} first" in launched.stdout
    waited = _cli("wait", str(profile), "--timeout", "60s")  # nothing can be pulled here
    assert waited.returncode == 3, waited.stdout + waited.stderr
    dead = [line for line in waited.stdout.splitlines() if f"cannot pull image {absent}: " in line]
    assert dead and "Traceback" not in waited.stdout, waited.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert f"docker pull {absent}" in (run_dir / "server.log").read_text()  # the pull's phase

    _edit(profile, "[container]\n", '[container]\npull = "never"\n')
    refused = _cli("check", str(profile))
    assert refused.returncode == EXIT_PREFLIGHT
    assert (f"FAIL image: image {absent} is not on this host and container.pull = \"never\": "
            f"pull it (`docker pull {absent}`) or fix the name") in refused.stdout.splitlines()


def test_shm_warning_unless_ipc_host_or_a_large_shm(tmp_path: Path, image: str) -> None:
    profile = container_profile(tmp_path, "ready")
    lines = _cli("check", str(profile)).stdout.splitlines()
    assert any(line.startswith('warn shm: neither ipc = "host" nor shm_size is set')
               for line in lines), lines
    _edit(profile, "[container]\n", '[container]\nshm_size = "16g"\n')
    assert "ok   shm: /dev/shm of 16g in the container" in \
        _cli("check", str(profile)).stdout.splitlines()


def test_a_leftover_container_holding_the_gpus_is_killed_by_kill_leftovers(
        tmp_path: Path, image: str, started: list[str], remove_containers: list[str],
        cleanup: list[str]) -> None:
    profile = container_profile(tmp_path, "ready")
    old = "leftover-20240101-000000-abcd"
    run_dir = tmp_path / "runs" / old
    run_dir.mkdir(parents=True)  # an ended run of this runs_dir: its exit is recorded
    (run_dir / "launch.json").write_text(json.dumps({"run_id": old, "started": time.time()}))
    (run_dir / "pid").write_text(json.dumps({"pid": None}))
    (run_dir / "exit.json").write_text(json.dumps({"pid": None, "code": 0, "time": 0}))
    name = f"specconsole-{old}"
    started.append(name)
    sleep = _sleeper(image, name, "--label", f"specconsole.run_id={old}",
                     "-e", f"SPECCONSOLE_RUN_ID={old}")
    _hold_gpu(tmp_path / "gpus", sleep, 0)

    checked = _cli("check", str(profile))
    assert checked.returncode == EXIT_PREFLIGHT, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert any(line.startswith(f"FAIL gpus_free: GPU 0: 2.0 GiB held by pid {sleep} (sleep) "
                               f"in container {name} ({image}, up ")
               and line.endswith(f" of run {old}, which has ended: a leftover")
               for line in lines), lines
    assert any(line.startswith(f"FAIL leftover containers: container {name} ({image}, up ")
               for line in lines), lines
    assert (f"leftovers of ended runs hold the GPUs (container {name}): `specconsole launch "
            f"{profile} --kill-leftovers` kills exactly them, then launches") in lines

    launched = _cli("launch", str(profile), "--kill-leftovers")
    out = launched.stdout + launched.stderr
    new = out.split("launched run ", 1)[1].split()[0] if "launched run " in out else None
    if new:
        cleanup.append(new)
        remove_containers.append(new)
    assert launched.returncode == 0, out
    assert f"killing leftovers of ended runs: container {name}" in out
    assert f"leftovers gone (container {name}); GPU memory released" in out
    assert containers_of(old) == [] and carriers(old) == []  # stopped, then removed
    assert not Path(f"/proc/{sleep}").exists()
    _cli("kill", str(profile), "--grace", "5")


def test_another_container_holding_the_port_and_a_gpu_is_named(
        tmp_path: Path, image: str, started: list[str]) -> None:
    profile = container_profile(tmp_path, "ready")
    port = int(next(line for line in profile.read_text().splitlines()
                    if line.startswith("port = ")).split("=")[1])
    name = f"not-specconsole-{os.getpid()}"
    started.append(name)
    sleep = _sleeper(image, name, "-p", f"{port}:{port}")
    _hold_gpu(tmp_path / "gpus", sleep, 3)

    checked = _cli("check", str(profile))
    assert checked.returncode == EXIT_PREFLIGHT, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    port_line = next(line for line in lines if line.startswith("FAIL port_free:"))
    assert f"(held by container {name} ({image}, up " in port_line, port_line
    gpu_line = next(line for line in lines if line.startswith("FAIL gpus_free:"))
    assert gpu_line.startswith(f"FAIL gpus_free: GPU 3: 2.0 GiB held by pid {sleep} (sleep) "
                               f"in container {name} ({image}, up "), gpu_line
    assert "leftover" not in checked.stdout and "--kill-leftovers" not in checked.stdout
