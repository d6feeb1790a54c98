"""Fixtures of the Slurm lane: the cluster `python3 -m tui.bootstrap slurm` started
(tests/slurm/slurmlab.py), found through $SPECCONSOLE_SLURM_CONF, and the lane's figures.

Every test here is marked `slurm`, so the main suite never runs one. Without the lane's cluster
a test fails saying how to start it: never a skip.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import keep_figure
from lab.netlab import Lab, missing_requirements

from slurm.slurmlab import Cluster
from slurm.sshlogin import SshLogin

CONF_ENV = "SPECCONSOLE_SLURM_CONF"
FIGURES_ENV = "SPECCONSOLE_SLURM_FIGURES"  # `bootstrap slurm` prints what the tests wrote


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test in this directory `slurm` before `-m` selects."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return lane_cluster()


def lane_cluster() -> Cluster:
    """The lane's running cluster; SLURM_CONF is set for this process (and what it starts)."""
    conf = os.environ.get(CONF_ENV)
    if not conf or not Path(conf).exists():
        pytest.fail(f"{CONF_ENV} names no slurm.conf (run the lane: python3 -m tui.bootstrap "
                    "slurm)")
    os.environ["SLURM_CONF"] = conf
    found = Cluster(Path(conf).parent)
    states = found.states()
    if not all(states.get(n) == "idle" for n in found.nodes):
        pytest.fail(f"the lane's nodes are not idle: {states}")
    return found


@pytest.fixture
def jobs(cluster: Cluster) -> Iterator[list[str]]:
    """Job ids a test submits; each is cancelled when the test ends, whatever happened, and the
    nodes are waited on until idle again so the next test starts on an empty cluster."""
    ids: list[str] = []
    yield ids
    end_jobs(cluster, ids)


def end_jobs(cluster: Cluster, ids: list[str]) -> None:
    """Cancel the jobs, and wait until the nodes are idle again."""
    if ids:
        subprocess.run(["scancel", *ids], env=cluster.env, capture_output=True)
    cluster.wait_idle(60)


@pytest.fixture(scope="session")
def ssh_login(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLogin]:
    """The login node over SSH (the fault lab's gpu-a, wired to the cluster) and sshd on each
    node; the lab's ssh_config (its client key) for this process's SSH sessions."""
    why = missing_requirements()
    if why is not None:
        pytest.fail(why)
    lab = Lab.up(tmp_path_factory.mktemp("lab"))
    login = SshLogin(cluster, lab)
    saved = os.environ.get("SPECCONSOLE_SSH_CONFIG")
    try:
        login.up()
        os.environ["SPECCONSOLE_SSH_CONFIG"] = str(lab.ssh_config)
        yield login
    finally:
        if saved is None:
            os.environ.pop("SPECCONSOLE_SSH_CONFIG", None)
        else:
            os.environ["SPECCONSOLE_SSH_CONFIG"] = saved
        login.down()
        lab.down()


def record_figure(name: str, value: object) -> None:
    """Keep a measured figure for `bootstrap slurm` to print."""
    keep_figure(FIGURES_ENV, name, value)
