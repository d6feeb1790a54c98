"""Fixtures of the fault lab: `lab` (real sshd hosts in namespaces) and `lab_profile`.

Every test under tests/lab is marked `lab`, so the default suite never runs one; the lane is
`python3 -m tui.bootstrap lab` (it installs sshd/nft/ip when missing, sets SPECCONSOLE_LAB=1).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ray_venv, sim_server

from lab.netlab import Lab, missing_requirements

LAB_ENV = "SPECCONSOLE_LAB"
FIGURES_ENV = "SPECCONSOLE_LAB_FIGURES"  # `bootstrap lab` prints what the tests wrote there
LOAD_TIME_SCALE = 50.0  # the simulated 1480 s launch lasts about 30 s


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test in this directory `lab` before `-m` selects (a file that forgets its
    pytestmark still stays out of the default suite)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One lab per pytest process: gpu-a, and gpu-b behind it. Skips, saying why, where it
    cannot run."""
    why = missing_requirements()
    if why is None and not os.environ.get(LAB_ENV):
        why = f"{LAB_ENV} is not set (run the lane: python3 -m tui.bootstrap lab)"
    if why is not None:
        pytest.skip(why)
    the_lab = Lab.up(tmp_path_factory.mktemp("lab"))
    saved = os.environ.get("SPECCONSOLE_SSH_CONFIG")
    os.environ["SPECCONSOLE_SSH_CONFIG"] = str(the_lab.ssh_config)
    try:
        yield the_lab
    finally:
        if saved is None:
            os.environ.pop("SPECCONSOLE_SSH_CONFIG", None)
        else:
            os.environ["SPECCONSOLE_SSH_CONFIG"] = saved
        the_lab.down()


@pytest.fixture(scope="session")
def lab_ray(lab: Lab) -> Path:
    """The lab hosts' Python for the Ray cases: the lanes' Ray venv."""
    return ray_venv()


@pytest.fixture(scope="session")
def lab_figures() -> Iterator[dict[str, Any]]:
    """Figures measured by the lab tests (name -> JSON value), merged at the end of the session
    into the file $SPECCONSOLE_LAB_FIGURES names, when it names one."""
    figures: dict[str, Any] = {}
    yield figures
    target = os.environ.get(FIGURES_ENV)
    if target and figures:
        path = Path(target)
        merged = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**merged, **figures}, indent=1, sort_keys=True))


@pytest.fixture(autouse=True)
def _faults_cleared(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the lab: links up, no nft rules or proxies, sshds up."""
    yield
    the_lab = request.node.funcargs.get("lab") if hasattr(request.node, "funcargs") else None
    if isinstance(the_lab, Lab):
        the_lab.reset()


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


ProfileFactory = Callable[..., Path]


@pytest.fixture
def lab_profile(tmp_path: Path, lab: Lab) -> ProfileFactory:
    """factory(host="gpu-a", scenario="ready", time_scale=50, stall_timeout=None, *,
    delayed=False, name=None, sections="", **host_keys) -> Path of a profile for the simulated
    engine on that lab host; the load lasts about 30 s at the default scale.

    `host_keys` override the lab's [host] table (a value of None drops the key), `sections` is
    TOML appended verbatim (e.g. "[alerts]..."), `delayed` reaches the host through its delay
    proxy (call lab.delay first). Runs and fake GPUs live under tmp_path.
    """
    def make(host: str = "gpu-a", scenario: str = "ready",
             time_scale: float = LOAD_TIME_SCALE, stall_timeout: str | None = None, *,
             delayed: bool = False, name: str | None = None, sections: str = "",
             **host_keys: Any) -> Path:
        table = {**lab.host_table(host, delayed=delayed), "runs_dir": str(tmp_path / "runs"),
                 **host_keys}
        host_toml = "".join(f"{k} = {_toml(v)}\n" for k, v in table.items() if v is not None)
        path = tmp_path / f"{name or f'{host}-{scenario}'}.toml"
        path.write_text(f"""\
[host]
{host_toml}{sim_server(tmp_path, scenario, time_scale, load_time="1m",
                       stall=stall_timeout or "5m")}{sections}
""")
        return path
    return make
