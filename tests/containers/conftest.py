"""Fixtures of the container lane: simulated-engine profiles whose server runs in a docker or
podman container of the lane's image (tests/containers/setup_docker.py builds it in each
runtime's store), and container cleanup.

Every test here is marked `containers`, so the main suite never runs one; the lane is
`python3 -m tui.bootstrap containers` (it starts dockerd when needed and builds the image).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import keep_figure, sim_server

from containers.setup_docker import IMAGE

ROOT = Path(__file__).resolve().parent.parent.parent
FIGURES_ENV = "SPECCONSOLE_CONTAINERS_FIGURES"  # `bootstrap containers` prints what is there
RUNTIMES = ("docker", "podman")
# podman as root gives a container nofile and nproc limits of 1048576 (docker: its daemon's);
# without CAP_SYS_RESOURCE (this lane's machine is itself a sandbox) runc cannot raise them and
# the container never starts ("error setting rlimit type 7"). podman's own process (and so
# conmon and runc) runs with nproc at most 32768; what the host allows is given instead.
PODMAN_NPROC = 32768


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test in this directory `containers` before `-m` selects."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.containers)


def lane_image(lane: str = "containers", runtime: str = "docker") -> str:
    """The lane's image in `runtime`'s store; fails (never skips) when `python3 -m
    tui.bootstrap LANE` did not set it up."""
    done = subprocess.run([runtime, "image", "inspect", IMAGE], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"no {runtime} image {IMAGE} (run `python3 -m tui.bootstrap {lane}`): "
                    f"{done.stderr.strip()}")
    return IMAGE


@pytest.fixture(scope="session")
def image() -> str:
    """The container lane's image (lane_image) in docker's store."""
    return lane_image()


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    """Each runtime in turn, its lane image there (lane_image)."""
    lane_image(runtime=request.param)
    return request.param


def container_profile(tmp: Path, scenario: str, *, time_scale: float = 300.0,
                      entrypoint: str = "image", run_args: tuple[str, ...] = (),
                      name: str | None = None, stall: str = "30s",
                      runtime: str = "docker") -> Path:
    """A simulated profile whose engine runs in the lane's container: the host's /usr, its
    Python and this checkout bind-mounted read-only, `tmp` (the fake GPUs' state) read-write."""
    path = tmp / f"{name or scenario}.toml"
    tables = container_tables(tmp, entrypoint, run_args, runtime=runtime)
    path.write_text(f"""
[host]
target = "local"
python = "{sys.executable}"
runs_dir = "{tmp / 'runs'}"
{sim_server(tmp, scenario, time_scale, stall=stall)}{tables}""")
    return path


def podman_ulimits() -> list[str]:
    """`--ulimit` options within what this host lets podman's runc set (PODMAN_NPROC)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], PODMAN_NPROC)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def container_tables(tmp: Path, entrypoint: str = "image", run_args: tuple[str, ...] = (),
                     python: str | None = None, runtime: str = "docker") -> str:
    """The [server.env] and [container] tables that run the simulated engine in the lane's
    image: the host's /usr, its Python and this checkout bind-mounted read-only, `tmp` (the
    fake GPUs' state) read-write; `python` is the image's Python (the host's by default).
    GPUs are none: the lane's GPUs are simulated (podman's CDI devices are argv-tested only)."""
    home = Path(sys.base_prefix)
    volumes = ["/usr:/usr:ro", f"{home}:{home}:ro", f"{ROOT}:{ROOT}:ro", f"{tmp}:{tmp}"]
    if runtime == "podman":
        run_args = (*podman_ulimits(), *run_args)
    return f"""
[server.env]
PYTHONPATH = "{ROOT}"

[container]
runtime = "{runtime}"
image = "{IMAGE}"
gpus = "none"
entrypoint = "{entrypoint}"
python = "{python or os.path.realpath(sys.executable)}"
volumes = {json.dumps(volumes)}
run_args = {json.dumps(list(run_args))}
"""


def containers_of(run_id: str, runtime: str = "docker") -> list[str]:
    """Every container (running or not) of `runtime` labelled with this run id."""
    return subprocess.run([runtime, "ps", "-aq", "--filter", f"label=specconsole.run_id={run_id}"],
                          capture_output=True, text=True, check=True).stdout.split()


@pytest.fixture
def remove_containers() -> Iterator[list[str]]:
    """Remove (force) the containers of the runs a test appends, whatever happened."""
    run_ids: list[str] = []
    yield run_ids
    for run_id in run_ids:
        remove_containers_of(run_id)


def remove_containers_of(run_id: str) -> None:
    """Force-remove every container labelled with this run id, of each runtime installed (a
    test's cleanup)."""
    for runtime in RUNTIMES:
        if shutil.which(runtime) is None:
            continue
        for cid in containers_of(run_id, runtime):
            with contextlib.suppress(subprocess.SubprocessError):
                subprocess.run([runtime, "rm", "-f", cid], capture_output=True, timeout=60)


def record_figure(name: str, value: object) -> None:
    """Keep a measured figure for `bootstrap containers` to print."""
    keep_figure(FIGURES_ENV, name, value)
