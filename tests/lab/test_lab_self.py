"""The lab itself: both hosts answer over real SSH (gpu-b only through gpu-a), faults bite."""

from __future__ import annotations

import asyncio
import time

import asyncssh
import pytest

from lab.netlab import Lab

pytestmark = pytest.mark.lab


def _options(lab: Lab) -> dict[str, object]:
    return {"username": "root", "client_keys": [str(lab.client_key)],
            "known_hosts": str(lab.known_hosts), "connect_timeout": 5}


async def test_hosts_answer_and_gpu_b_only_through_gpu_a(lab: Lab) -> None:
    async with asyncssh.connect(lab.address("gpu-a"), **_options(lab)) as a:
        assert (await a.run("hostname", check=True)).stdout.strip() == "gpu-a"
        async with asyncssh.connect(lab.address("gpu-b"), tunnel=a, **_options(lab)) as b:
            assert (await b.run("hostname", check=True)).stdout.strip() == "gpu-b"
    with pytest.raises(OSError):  # no route from here: the unreachable route, not a leak
        await asyncio.wait_for(asyncio.open_connection(lab.address("gpu-b"), 22), 5)


async def test_a_lab_host_runs_commands_without_this_machines_login_files(lab: Lab) -> None:
    """A fresh host: bash run by sshd reads ~/.bashrc, and this machine's is not the host's
    (a stale lock in its `pyenv rehash` once made every lab command wait a minute)."""
    read = "wc -c < ~/.bashrc 2>/dev/null || echo 0; echo ${PYENV_ROOT:-unset}"
    async with asyncssh.connect(lab.address("gpu-a"), **_options(lab)) as a:
        started = time.monotonic()
        size, pyenv = (await a.run(read, check=True)).stdout.split()
    assert (size, pyenv) == ("0", "unset")
    assert time.monotonic() - started < 5


async def test_faults_bite_and_reset_undoes_them(lab: Lab) -> None:
    lab.link_down("gpu-a")
    with pytest.raises(OSError):
        await asyncio.wait_for(asyncio.open_connection(lab.address("gpu-a"), 22), 5)
    lab.link_up("gpu-a")
    lab.partition("gpu-a")
    with pytest.raises((OSError, asyncio.TimeoutError)):
        await asyncio.wait_for(asyncio.open_connection(lab.address("gpu-a"), 22), 2)
    lab.heal("gpu-a")
    lab.kill_sshd("gpu-a")
    assert lab.sshd_pids("gpu-a") == []
    with pytest.raises(OSError):
        await asyncio.wait_for(asyncio.open_connection(lab.address("gpu-a"), 22), 5)
    lab.reset()
    lab.delay("gpu-a", 100)
    table = lab.host_table("gpu-a", delayed=True)
    host, port = table["target"].split(":")
    started = time.monotonic()
    async with asyncssh.connect(host, int(port), **_options(lab)) as a:
        await a.run("true", check=True)
    assert time.monotonic() - started > 0.4  # a handshake of several 200 ms round trips
    assert lab.run_in("gpu-a", ["hostname", "-I"]).stdout.split()[0] == lab.address("gpu-a")
