"""Fixtures of the container lane: simulated-engine profiles whose server runs in a docker
container of the lane's image (tests/containers/setup_docker.py), and container cleanup.

Every test here is marked `containers`, so the main suite never runs one; the lane is
`python3 -m tui.bootstrap containers` (it starts dockerd when needed and builds the image).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import sim_server

from containers.setup_docker import IMAGE

ROOT = Path(__file__).resolve().parent.parent.parent
FIGURES_ENV = "SPECCONSOLE_CONTAINERS_FIGURES"  # `bootstrap containers` prints what is there


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test in this directory `containers` before `-m` selects."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.containers)


def lane_image(lane: str = "containers") -> str:
    """The lane's image; fails (never skips) when `python3 -m tui.bootstrap LANE` did not set
    it up."""
    done = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"no image {IMAGE} (run `python3 -m tui.bootstrap {lane}`): "
                    f"{done.stderr.strip()}")
    return IMAGE


@pytest.fixture(scope="session")
def image() -> str:
    """The container lane's image (lane_image)."""
    return lane_image()


def container_profile(tmp: Path, scenario: str, *, time_scale: float = 300.0,
                      entrypoint: str = "image", run_args: tuple[str, ...] = (),
                      name: str | None = None, stall: str = "30s") -> Path:
    """A simulated profile whose engine runs in the lane's container: the host's /usr, its
    Python and this checkout bind-mounted read-only, `tmp` (the fake GPUs' state) read-write."""
    path = tmp / f"{name or scenario}.toml"
    tables = container_tables(tmp, entrypoint, run_args)
    path.write_text(f"""
[host]
target = "local"
python = "{sys.executable}"
runs_dir = "{tmp / 'runs'}"
{sim_server(tmp, scenario, time_scale, stall=stall)}{tables}""")
    return path


def container_tables(tmp: Path, entrypoint: str = "image", run_args: tuple[str, ...] = (),
                     python: str | None = None) -> str:
    """The [server.env] and [container] tables that run the simulated engine in the lane's
    image: the host's /usr, its Python and this checkout bind-mounted read-only, `tmp` (the
    fake GPUs' state) read-write; `python` is the image's Python (the host's by default)."""
    home = Path(sys.base_prefix)
    volumes = ["/usr:/usr:ro", f"{home}:{home}:ro", f"{ROOT}:{ROOT}:ro", f"{tmp}:{tmp}"]
    return f"""
[server.env]
PYTHONPATH = "{ROOT}"

[container]
runtime = "docker"
image = "{IMAGE}"
gpus = "none"
entrypoint = "{entrypoint}"
python = "{python or os.path.realpath(sys.executable)}"
volumes = {json.dumps(volumes)}
run_args = {json.dumps(list(run_args))}
"""


def containers_of(run_id: str) -> list[str]:
    """Every container (running or not) labelled with this run id."""
    return subprocess.run(["docker", "ps", "-aq", "--filter", f"label=specconsole.run_id={run_id}"],
                          capture_output=True, text=True, check=True).stdout.split()


@pytest.fixture
def remove_containers() -> Iterator[list[str]]:
    """Remove (force) the containers of the runs a test appends, whatever happened."""
    run_ids: list[str] = []
    yield run_ids
    for run_id in run_ids:
        remove_containers_of(run_id)


def remove_containers_of(run_id: str) -> None:
    """Force-remove every container labelled with this run id (a test's cleanup)."""
    for cid in containers_of(run_id):
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60)


def record_figure(name: str, value: object) -> None:
    """Keep a measured figure for `bootstrap containers` to print."""
    path = os.environ.get(FIGURES_ENV)
    if not path:
        return
    figures = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    figures[name] = value
    Path(path).write_text(json.dumps(figures))
