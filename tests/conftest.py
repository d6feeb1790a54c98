"""Shared fixtures."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from helpers import carriers
from sshserver import SSHTestServer


@pytest.fixture
async def ssh_server(tmp_path: Path) -> AsyncIterator[SSHTestServer]:
    """A real SSH server on 127.0.0.1 (port 0) that executes what it receives.

    Its files (client key, known_hosts, ssh_config with `Host specconsole-test`) live in
    tmp_path/"ssh"; start another server in the same directory for a jump host.
    """
    server = SSHTestServer(tmp_path / "ssh")
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    """Kill whatever a test's runs (append their run ids) left, whatever happened."""
    run_ids: list[str] = []
    yield run_ids
    for run_id in run_ids:
        for pid in carriers(run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


@pytest.fixture(autouse=True, scope="session")
def private_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Launch history (sqlite) goes to a temporary directory, not the user's, for every test
    and every command a test runs."""
    saved = os.environ.get("SPECCONSOLE_DATA_DIR")
    os.environ["SPECCONSOLE_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    yield
    if saved is None:
        del os.environ["SPECCONSOLE_DATA_DIR"]
    else:
        os.environ["SPECCONSOLE_DATA_DIR"] = saved
