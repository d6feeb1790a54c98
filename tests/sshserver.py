"""A real SSH server for tests, in-process: asyncssh on 127.0.0.1, port 0, no root needed.

It REALLY executes what it receives, as sshd does: `/bin/sh -c <command>` in a new session
(its own process group), stdin/stdout/stderr wired through, the exit status (or signal) sent
back once the command has exited and closed its stdout and stderr. When the client closes the
channel first, the command's process group gets SIGTERM (SIGKILL after a grace), so nothing
hangs on; a process that left the group with setsid survives, as on a real host.

Keys and files are written to one directory, shared by every server started in it: a client
key (authorized on all of them), one host key per server, a known_hosts file with each server's
entry, and an ssh_config with a `Host <alias>` block per server (HostName, Port, User,
IdentityFile, UserKnownHostsFile, IdentitiesOnly). A server also accepts direct-tcpip
forwarding, so it can serve as a jump host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import asyncssh

_GRACE = 2.0


def _write_key(path: Path) -> asyncssh.SSHKey:
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    key.write_public_key(str(path) + ".pub")
    return key


async def _feed(source: asyncssh.SSHReader[bytes], sink: asyncio.StreamWriter) -> None:
    """Client stdin -> command stdin, then EOF; a command that stopped reading ends it."""
    with contextlib.suppress(OSError, asyncssh.Error):
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    sink.close()


async def _pump(source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes]) -> None:
    """Command output -> channel, until the command closes it (or the channel goes)."""
    while chunk := await source.read(65536):
        try:
            sink.write(chunk)
            await sink.drain()
        except (OSError, asyncssh.Error):
            return


class _Server(asyncssh.SSHServer):
    def __init__(self, owner: SSHTestServer) -> None:
        self._owner = owner
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._owner.connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner.connections.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        self._owner.usernames.append(username)
        return True  # key authentication against the shared authorized_keys

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str,
                             orig_port: int) -> bool:
        self._owner.forwards.append((dest_host, dest_port))
        return True  # serve as a jump host


class SSHTestServer:
    """One server. `await start()`; `stop()` drops every connection (like killing sshd)."""

    host = "127.0.0.1"

    def __init__(self, directory: Path, alias: str = "specconsole-test",
                 user: str = "sshtest") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.alias = alias
        self.user = user
        self.port = 0
        self.client_key = directory / "client_ed25519"
        self.known_hosts = directory / "known_hosts"
        self.ssh_config = directory / "ssh_config"
        self.host_key = directory / f"host_{alias}"
        self.commands: list[str | None] = []
        self.usernames: list[str] = []
        self.forwards: list[tuple[str, int]] = []
        # what the user's shell start-up prints to stderr before each command (a .bashrc that
        # greets in colour, sets the window title)
        self.startup = b""
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self._procs: set[asyncio.subprocess.Process] = set()
        self._acceptor: asyncssh.SSHAcceptor | None = None
        if not self.client_key.exists():
            _write_key(self.client_key)
        self._host_key = _write_key(self.host_key)

    @property
    def env(self) -> dict[str, str]:
        """Environment for a subprocess (the CLI) that should use this server's ssh_config."""
        return {"SPECCONSOLE_SSH_CONFIG": str(self.ssh_config)}

    def known_hosts_line(self, key: asyncssh.SSHKey | None = None) -> str:
        algorithm, data = (key or self._host_key).export_public_key().decode().split()[:2]
        return f"[{self.host}]:{self.port} {algorithm} {data}\n"

    def config_block(self, alias: str | None = None, identity: Path | None = None,
                     **options: object) -> str:
        """A `Host` block for this server; options are extra ssh_config keywords."""
        lines = [f"Host {alias or self.alias}", f"    HostName {self.host}",
                 f"    Port {self.port}", f"    User {self.user}",
                 f"    IdentityFile {identity or self.client_key}", "    IdentitiesOnly yes",
                 f"    UserKnownHostsFile {self.known_hosts}"]
        lines += [f"    {name} {value}" for name, value in options.items()]
        return "\n".join(lines) + "\n\n"

    async def start(self) -> None:
        """Listen (on the port of the first start, after a stop)."""
        self._acceptor = await asyncssh.create_server(
            lambda: _Server(self), self.host, self.port, server_host_keys=[self._host_key],
            authorized_client_keys=str(self.client_key) + ".pub",
            process_factory=self._run_command, encoding=None)
        if not self.port:
            self.port = self._acceptor.get_port()
            with self.known_hosts.open("a") as file:
                file.write(self.known_hosts_line())
            with self.ssh_config.open("a") as file:
                file.write(self.config_block())

    async def stop(self) -> None:
        """Stop listening, drop every connection without a goodbye, end every command."""
        if self._acceptor is not None:
            self._acceptor.close()
            self._acceptor = None
        for conn in list(self.connections):
            conn.abort()
        self.connections.clear()
        await asyncio.gather(*(self._end(proc) for proc in list(self._procs)))

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def _end(self, proc: asyncio.subprocess.Process) -> None:
        for signum in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signum)
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), _GRACE)
                return
            except asyncio.TimeoutError:
                continue

    async def _run_command(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        self.commands.append(process.command)
        if process.command is None:
            process.stderr.write(b"this test server runs commands, not shells\n")
            process.exit(1)
            return
        if self.startup:
            process.stderr.write(self.startup)
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", process.command, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        assert proc.stdin and proc.stdout and proc.stderr
        self._procs.add(proc)

        async def finish() -> int:
            await asyncio.gather(_pump(proc.stdout, process.stdout),
                                 _pump(proc.stderr, process.stderr))
            return await proc.wait()

        feeding = asyncio.ensure_future(_feed(process.stdin, proc.stdin))
        finishing = asyncio.ensure_future(finish())
        closed = asyncio.ensure_future(process.wait_closed())
        try:
            await asyncio.wait({finishing, closed}, return_when=asyncio.FIRST_COMPLETED)
            if finishing.done() and not process.is_closing():
                code = finishing.result()
                if code < 0:
                    process.exit_with_signal(signal.Signals(-code).name[3:])
                else:
                    process.exit(code)
            else:
                await self._end(proc)
        finally:
            for task in (feeding, finishing, closed):
                task.cancel()
            if proc.returncode is None:  # this handler was cancelled: leave nothing behind
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            self._procs.discard(proc)
