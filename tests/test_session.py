"""Sessions against a real SSH server (in-process, executing for real) and this machine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shlex
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import asyncssh
import psutil
import pytest
from helpers import alive
from sshserver import SSHTestServer

from tui.core.command import shell_join
from tui.core.errors import (
    AgentError,
    AuthRefused,
    ConnectionLost,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    RemoteModuleMissing,
    RemotePythonMissing,
    SessionError,
)
from tui.core.profile import HostConfig
from tui.remote.agent_link import AgentTarget, call_agent, stream_agent
from tui.remote.interface import Session
from tui.remote.session import LocalSession, check_python, open_session

PY = sys.executable
ECHO_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"


def host_cfg(target: str, **overrides: Any) -> HostConfig:
    """The profile's [host], with a shorter connect timeout."""
    return HostConfig(target=target, **{"connect_timeout": 5.0, **overrides})


async def connect(server: SSHTestServer, target: str | None = None,
                  config: Path | None = None, **overrides: object) -> Session:
    return await open_session(host_cfg(target or server.alias, **overrides),
                              ssh_config=config or server.ssh_config)


async def refused(server: SSHTestServer, error: type[SessionError], target: str | None = None,
                  config: Path | None = None, **overrides: object) -> str:
    """Connect, expecting `error`; its message must be one line."""
    with pytest.raises(error) as caught:
        await connect(server, target, config, **overrides)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.fixture(params=["local", "ssh"])
async def session(request: pytest.FixtureRequest,
                  ssh_server: SSHTestServer) -> AsyncIterator[Session]:
    opened = LocalSession() if request.param == "local" else await connect(ssh_server)
    assert opened.is_local == (request.param == "local")
    yield opened
    await opened.close()



async def gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return not alive(pid)


# ----------------------------------------------------------------------------- both sessions


async def test_argv_arrives_literal(session: Session, ssh_server: SSHTestServer,
                                    tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    evil = [f"$(touch {marker})", f"`touch {marker}`", f"; touch {marker}",
            f"; rm -rf {victim}", f"&& rm -rf {victim} #", f"| touch {marker}", f"> {marker}",
            "it's", 'say "hi"', "line one\nline two", "$HOME", "~", "*", "", "  spaced  ",
            "back\\slash", "tab\there", "ünïcode"]
    argv = [PY, "-c", ECHO_ARGV, *evil]
    result = await session.run(argv)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == evil
    assert not marker.exists()
    assert (victim / "keep").exists()
    if not session.is_local:
        assert ssh_server.commands[-1] == shell_join(argv)  # the one command builder


async def test_stdin_round_trip(session: Session) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    result = await session.run(["cat"], stdin=data)
    assert (result.returncode, result.stdout, result.stderr) == (0, data, b"")
    assert (await session.run(["cat"], timeout=10)).stdout == b""  # EOF sent without stdin


async def test_exit_codes(session: Session) -> None:
    result = await session.run(["sh", "-c", "echo out; echo err >&2; exit 42"])
    assert (result.returncode, result.stdout, result.stderr) == (42, b"out\n", b"err\n")
    assert (await session.run(["false"])).returncode == 1
    # kill 0: the command's whole process group, so the host's own shell dies of it too
    assert (await session.run(["sh", "-c", "kill -TERM 0"])).returncode == -signal.SIGTERM
    missing = await session.run(["/nonexistent/tool", "arg"])
    assert missing.returncode == 127
    assert b"/nonexistent/tool" in missing.stderr


async def test_stream_lines_and_eof(session: Session) -> None:
    code = ("import sys\n"
            "for line in sys.stdin:\n"
            "    print(line.strip().upper(), flush=True)\n"
            "sys.stdout.write('tail')\n"
            "sys.stderr.write('bye\\n')\n"
            "sys.exit(3)\n")
    stream = await session.stream([PY, "-u", "-c", code], stdin=b"first\n")
    assert await stream.readline() == b"FIRST\n"
    stream.write(b"second\n")
    await stream.drain()
    assert await stream.readline() == b"SECOND\n"
    stream.close_stdin()
    assert await stream.readline() == b"tail"
    assert await stream.readline() == b""
    assert await stream.readline() == b""
    assert await stream.wait() == 3
    assert await stream.stderr_text() == "bye\n"
    stream.write(b"too late\n")  # to an ended command: dropped, no error
    await stream.drain()


async def test_terminate_ends_the_command_not_a_detached_child(session: Session) -> None:
    script = ("setsid sleep 60 >/dev/null 2>&1 </dev/null & echo $!; echo $$; "
              "exec sleep 60")
    stream = await session.stream(["sh", "-c", script])
    detached = int(await stream.readline())
    command = int(await stream.readline())
    try:
        while os.getsid(detached) != detached:  # until setsid(1) has run
            await asyncio.sleep(0.01)
        assert alive(command)
        stream.terminate()
        assert await asyncio.wait_for(stream.wait(), 5) == -signal.SIGTERM
        assert await gone(command)
        assert alive(detached)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(detached, signal.SIGKILL)


async def test_run_timeout_kills(session: Session, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    # long enough for sh to have started and said its pid, on a loaded machine too
    with pytest.raises(SessionError, match=r"did not finish within 3 s") as caught:
        await session.run(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 30"], timeout=3)
    assert type(caught.value) is SessionError
    assert await gone(int(pid_file.read_text()))


async def test_unstartable_stream(session: Session) -> None:
    stream = await session.stream(["/nonexistent/agent"], stdin=b"spec\n")
    assert await stream.readline() == b""
    assert await stream.wait() == 127
    assert "/nonexistent/agent" in await stream.stderr_text()


async def test_close_stops_running_commands(session: Session) -> None:
    stream = await session.stream(["sh", "-c", "echo $$; exec sleep 60"])
    pid = int(await stream.readline())
    await session.close()
    assert await gone(pid)


async def test_check_python_ok(session: Session) -> None:
    found = await check_python(session, PY)
    assert found["python"] == platform.python_version()
    assert found["psutil"] == psutil.__version__
    assert found["pynvml"] == version("nvidia-ml-py")


async def test_check_python_missing(session: Session, tmp_path: Path) -> None:
    path = str(tmp_path / "venv" / "bin" / "python")
    with pytest.raises(RemotePythonMissing) as caught:
        await check_python(session, path)
    message = str(caught.value)
    assert path in message and "set host.python" in message and "\n" not in message


async def test_check_python_without_psutil(session: Session, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "psutil.py").write_text("raise ImportError('psutil is hidden in this test')\n")
    wrapper = tmp_path / "python-without-psutil"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(shadow))} "
                       f"exec {shlex.quote(PY)} \"$@\"\n")
    wrapper.chmod(0o755)
    for python in (str(wrapper), ["env", f"PYTHONPATH={shadow}", PY]):
        with pytest.raises(RemoteModuleMissing) as caught:
            await check_python(session, python)
        message = str(caught.value)
        assert "cannot import psutil (ImportError: psutil is hidden in this test)" in message
        assert "point host.python at the server's venv, which has psutil and pynvml" in message
        assert "pynvml" not in message.split("(")[0] and "\n" not in message


NOISE = "\x1b]0;pwned\x07\x1b[1;31m[bold]gpu1[/bold] [/]\x1b[0m"


async def test_a_failing_agent_is_quoted_without_its_escapes(session: Session,
                                                             ssh_server: SSHTestServer,
                                                             tmp_path: Path) -> None:
    """The agent's last stderr line becomes the error: the words stay, the escapes go, over
    SSH with a shell start-up that greets in colour as locally."""
    ssh_server.startup = f"{NOISE} welcome\n".encode()
    python = tmp_path / "python-agent-fails"
    python.write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(NOISE + ' agent died')} >&2\n"
                      "exit 1\n")
    python.chmod(0o755)
    target = AgentTarget(str(python))
    with pytest.raises(AgentError) as called:
        await call_agent(session, target, "runs", {"runs_dir": str(tmp_path), "profile_key": "x"})
    with pytest.raises(AgentError) as streamed:
        async for _ in stream_agent(session, target, "watch", {}):
            pass
    for caught in (called, streamed):
        assert str(caught.value).endswith("agent failed: [bold]gpu1[/bold] [/] agent died")


# ----------------------------------------------------------------------------- ssh only


async def test_open_session_local() -> None:
    session = await open_session(host_cfg("local"))
    assert isinstance(session, LocalSession) and session.is_local
    await session.close()


async def test_alias_from_ssh_config(ssh_server: SSHTestServer) -> None:
    # The alias gives HostName, Port, User and IdentityFile: no other key exists.
    session = await connect(ssh_server)
    assert (session.host, session.is_local) == (ssh_server.alias, False)
    assert (await session.run(["echo", "hi"])).stdout == b"hi\n"
    assert ssh_server.usernames == [ssh_server.user]
    await session.close()
    session = await connect(ssh_server, f"someone@{ssh_server.alias}")  # user@alias wins
    await session.close()
    assert ssh_server.usernames[-1] == "someone"


async def test_ssh_config_from_environment(ssh_server: SSHTestServer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCONSOLE_SSH_CONFIG", str(ssh_server.ssh_config))
    session = await open_session(host_cfg(ssh_server.alias))
    assert (await session.run(["true"])).returncode == 0
    await session.close()


async def test_default_ssh_files(ssh_server: SSHTestServer, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # No config given: ~/.ssh/config and ~/.ssh/known_hosts, as ssh would use them.
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SPECCONSOLE_SSH_CONFIG", raising=False)
    (home / ".ssh" / "config").write_text(
        f"Host gpu-7\n    HostName 127.0.0.1\n    Port {ssh_server.port}\n"
        f"    User {ssh_server.user}\n    IdentityFile {ssh_server.client_key}\n")
    with pytest.raises(HostKeyUnknown) as caught:
        await open_session(host_cfg("gpu-7"))
    assert str(caught.value) == (
        "gpu-7: host key unknown — not in ~/.ssh/known_hosts; verify it and add it with: "
        f"ssh-keyscan -p {ssh_server.port} 127.0.0.1 >> ~/.ssh/known_hosts")
    (home / ".ssh" / "known_hosts").write_text(ssh_server.known_hosts_line())
    session = await open_session(host_cfg("gpu-7"))
    assert (await session.run(["true"])).returncode == 0
    await session.close()


async def test_unknown_host_key(ssh_server: SSHTestServer, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    message = await refused(ssh_server, HostKeyUnknown, known_hosts=str(empty))
    assert message == (f"{ssh_server.alias}: host key unknown — not in {empty}; verify it and "
                       f"add it with: ssh-keyscan -p {ssh_server.port} 127.0.0.1 >> {empty}")
    missing = tmp_path / "nowhere" / "known_hosts"  # a missing file trusts nothing
    await refused(ssh_server, HostKeyUnknown, known_hosts=str(missing))


async def test_changed_host_key(ssh_server: SSHTestServer, tmp_path: Path) -> None:
    other = tmp_path / "known_hosts"
    impostor = asyncssh.generate_private_key("ssh-ed25519")
    other.write_text(ssh_server.known_hosts_line(impostor))
    message = await refused(ssh_server, HostKeyChanged, known_hosts=str(other))
    assert message.startswith(f"{ssh_server.alias}: host key changed — ")
    assert f"ssh-keygen -R '[127.0.0.1]:{ssh_server.port}' -f {other}" in message
    assert f"ssh-keyscan -p {ssh_server.port} 127.0.0.1 >> {other}" in message


async def test_accept_new_when_not_strict(ssh_server: SSHTestServer, tmp_path: Path) -> None:
    fresh = tmp_path / "known_hosts"
    session = await connect(ssh_server, known_hosts=str(fresh), strict_host_keys=False)
    await session.close()
    assert fresh.read_text() == ssh_server.known_hosts_line()
    session = await connect(ssh_server, known_hosts=str(fresh))  # now strict, and known
    await session.close()
    fresh.write_text(ssh_server.known_hosts_line(asyncssh.generate_private_key("ssh-ed25519")))
    await refused(ssh_server, HostKeyChanged, known_hosts=str(fresh), strict_host_keys=False)


@pytest.mark.parametrize("user_files", ["user", "system user", ""])
async def test_accept_new_never_writes_a_system_file(
        ssh_server: SSHTestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        user_files: str) -> None:
    # ssh_config names a system-wide file as a second source (GlobalKnownHostsFile, and even
    # among the UserKnownHostsFile list): accept-new writes the user's file, never that one.
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    system = tmp_path / "etc" / "ssh_known_hosts"
    system.parent.mkdir()
    other_host = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    system.write_text(f"gpu-other {other_host.split()[0]} {other_host.split()[1]}\n")
    user = tmp_path / "user_known_hosts"
    names = {"user": str(user), "system": str(system)}
    listed = " ".join(names[name] for name in user_files.split())
    written = user if listed else home / ".ssh" / "known_hosts"  # ssh's default user file
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpu-7\n    HostName 127.0.0.1\n    Port {ssh_server.port}\n"
        f"    User {ssh_server.user}\n    IdentityFile {ssh_server.client_key}\n"
        + (f"    UserKnownHostsFile {listed}\n" if listed else "")
        + f"    GlobalKnownHostsFile {system}\n")
    before = system.read_bytes(), system.stat().st_mtime_ns

    session = await connect(ssh_server, "gpu-7", config, strict_host_keys=False)
    await session.close()
    assert written.read_text() == ssh_server.known_hosts_line()
    assert (system.read_bytes(), system.stat().st_mtime_ns) == before
    session = await connect(ssh_server, "gpu-7", config)  # strict now, and known from the user's
    await session.close()

    # A changed key, even one only the system file holds, stays refused and nothing is written.
    written.unlink()
    impostor = ssh_server.known_hosts_line(asyncssh.generate_private_key("ssh-ed25519"))
    system.write_text(impostor)
    before = system.read_bytes(), system.stat().st_mtime_ns
    message = await refused(ssh_server, HostKeyChanged, "gpu-7", config, strict_host_keys=False)
    assert f"-f {system}" in message
    assert not written.exists()
    assert (system.read_bytes(), system.stat().st_mtime_ns) == before


async def test_wrong_client_key(ssh_server: SSHTestServer, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(wrong))
    config = tmp_path / "ssh_config"
    config.write_text(ssh_server.config_block(identity=wrong))
    message = await refused(ssh_server, AuthRefused, config=config)
    assert f"authentication refused for user {ssh_server.user}" in message


async def test_closed_port(ssh_server: SSHTestServer, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "empty_config"
    config.write_text("")
    message = await refused(ssh_server, HostUnreachable, f"someone@127.0.0.1:{port}", config)
    assert message == (f"someone@127.0.0.1:{port}: connection refused by 127.0.0.1 port {port}"
                       " — is sshd running there, and is the port right?")


async def test_silent_port_times_out(ssh_server: SSHTestServer, tmp_path: Path) -> None:
    accepted: list[asyncio.StreamWriter] = []
    silent = await asyncio.start_server(lambda _r, w: accepted.append(w), "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    config = tmp_path / "empty_config"
    config.write_text("")
    try:
        message = await refused(ssh_server, HostUnreachable, f"127.0.0.1:{port}", config,
                                connect_timeout=0.3)
    finally:
        for writer in accepted:
            writer.close()
        silent.close()
    assert message.endswith(f"no SSH answer from 127.0.0.1 port {port} within 0.3 s "
                            "(host.connect_timeout)")


@pytest.mark.parametrize("how", ["profile jump", "ProxyJump"])
async def test_jump_host(ssh_server: SSHTestServer, tmp_path: Path, how: str) -> None:
    jump = SSHTestServer(ssh_server.directory, alias="specconsole-jump")
    await jump.start()
    try:
        if how == "ProxyJump":
            with ssh_server.ssh_config.open("a") as file:
                file.write(ssh_server.config_block("via-jump", ProxyJump=jump.alias))
            target, extra = "via-jump", {}
        else:
            target, extra = ssh_server.alias, {"jump": jump.alias}
        session = await connect(ssh_server, target, **extra)
        assert (await session.run(["echo", "through"])).stdout == b"through\n"
        assert jump.forwards == [("127.0.0.1", ssh_server.port)]
        assert jump.commands == []
        await session.close()
        empty = tmp_path / "known_hosts"
        empty.write_text("")
        message = await refused(ssh_server, HostKeyUnknown, target, known_hosts=str(empty),
                                **extra)
        assert message.startswith(f"{jump.alias} (jump host): host key unknown")
        empty.write_text(jump.known_hosts_line())  # jump known, target not: scan via the jump
        message = await refused(ssh_server, HostKeyUnknown, target, known_hosts=str(empty),
                                **extra)
        assert message.startswith(f"{target}: host key unknown")
        assert (f"ssh {jump.alias} ssh-keyscan -p {ssh_server.port} 127.0.0.1 >> {empty}"
                in message)
    finally:
        await jump.stop()


async def test_connection_lost_then_server_back(ssh_server: SSHTestServer) -> None:
    session = await connect(ssh_server)
    stream = await session.stream(["sh", "-c", "echo $$; exec sleep 60"])
    pid = int(await stream.readline())
    await ssh_server.stop()
    with pytest.raises(ConnectionLost) as caught:
        await asyncio.wait_for(stream.readline(), 5)
    assert str(caught.value).startswith(f"{ssh_server.alias}: connection lost")
    assert "\n" not in str(caught.value)
    with pytest.raises(ConnectionLost):
        await session.run(["true"])
    assert await gone(pid)
    await session.close()
    await ssh_server.start()
    session = await connect(ssh_server)
    assert (await session.run(["true"])).returncode == 0
    await session.close()
