"""SSH sessions: the GPU host over asyncssh, through jump hosts, with strict host keys.

Imported only when a profile's host is remote (`tui.remote.session.open_session`), so that a
local run, `explain` and `--help` start without loading asyncssh.  asyncssh's and the OS's
exceptions are translated here into the typed one-line errors of `tui.core.errors`, naming the
host and the fix.  Host keys are always checked against a known_hosts file (never
`known_hosts=None`); every remote command is `tui.core.command.shell_join(argv)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shlex
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from tui.core.command import shell_join
from tui.core.errors import (
    AuthRefused,
    ConnectionLost,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    SessionError,
)
from tui.remote.interface import CommandResult, Session, Stream, one_line, stderr_tail

SSH_CONFIG_ENV = "SPECCONSOLE_SSH_CONFIG"
"""An ssh_config file to use instead of ~/.ssh/config (tests, or a console-only config)."""
_MAX_HOPS = 8  # a ProxyJump loop in ~/.ssh/config stops here instead of recursing forever


def _display(path: Path | str) -> str:
    """A path as a user would type it in a shell: ~ for the home directory, quoted if needed."""
    text = str(path)
    home = str(Path.home())
    if text.startswith(home + os.sep):
        return "~/" + shlex.quote(text[len(home) + 1:])
    return shlex.quote(text)


class _Client(asyncssh.SSHClient):
    """Watches one connection: host-key decisions (for the error message) and its loss."""

    def __init__(self, known_hosts: asyncssh.SSHKnownHosts, strict: bool) -> None:
        self._known_hosts = known_hosts
        self._strict = strict
        self.host_had_entry: bool | None = None
        self.accepted_key: tuple[str, int, asyncssh.SSHKey] | None = None
        self.lost: Exception | None = None
        self.closed = False

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        """Called only for a key known_hosts does not trust: refuse, or accept-new when lax."""
        host_keys, ca_keys, revoked = self._known_hosts.match(host, addr, port)[:3]
        self.host_had_entry = bool(host_keys or ca_keys or revoked)
        if self._strict or self.host_had_entry:
            return False
        self.accepted_key = (host, port, key)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc


def _split_target(target: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` (or `[v6addr]:port`) -> (user, host, port)."""
    user, _, hostport = target.rpartition("@")
    host, port = hostport, ""
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
    if not host or (port and not port.isdigit()):
        raise SessionError(target, "not an SSH target; use an alias from ~/.ssh/config, "
                                   "host, user@host or user@host:port")
    return user or None, host, int(port) if port else None


def _config_paths(explicit: str | os.PathLike[str] | None) -> list[str]:
    """The ssh_config files to read: the given one, $SPECCONSOLE_SSH_CONFIG, or ~/.ssh/config."""
    chosen = explicit or os.environ.get(SSH_CONFIG_ENV)
    if chosen:
        return [str(Path(chosen).expanduser())]
    default = Path("~/.ssh/config").expanduser()
    return [str(default)] if os.access(default, os.R_OK) else []


_DEFAULT_USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
_DEFAULT_GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


def _known_hosts_files(profile_value: str | None, config: Any) -> tuple[Path, list[Path]]:
    """(the user's file, every file checked): what accept-new may write, and what is trusted.

    The profile's file alone, when set. Otherwise ssh's rule: the UserKnownHostsFile list
    (default ~/.ssh/known_hosts), then the GlobalKnownHostsFile list (default
    /etc/ssh/ssh_known_hosts). Only the first user file is ever written; the global ones are
    system files, read and never written.
    """
    if profile_value:
        user = Path(profile_value).expanduser()
        return user, [user]

    def listed(option: str, default: str) -> list[Path]:
        value = config.get(option, None) if config is not None else None
        names = [str(p) for p in value] if isinstance(value, (list, tuple)) and value else [
            default]  # unset, or `none`: ssh's default
        return [Path(name).expanduser() for name in names]

    users = listed("UserKnownHostsFile", _DEFAULT_USER_KNOWN_HOSTS)
    systems = listed("GlobalKnownHostsFile", _DEFAULT_GLOBAL_KNOWN_HOSTS)
    writable = [p for p in users if p not in systems] or [
        Path(_DEFAULT_USER_KNOWN_HOSTS).expanduser()]  # a system file is never the user's
    checked = list(dict.fromkeys([writable[0], *users, *systems]))
    return writable[0], checked


def _load_known_hosts(label: str, files: list[Path]) -> asyncssh.SSHKnownHosts:
    """Load the files that exist: a missing file trusts nothing, it does not disable checking."""
    known = asyncssh.SSHKnownHosts()
    for path in files:
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise SessionError(label, f"cannot read {_display(path)}: {exc.strerror}") from exc
        try:
            known.load(text)
        except ValueError as exc:
            raise SessionError(label, f"{_display(path)} is not a known_hosts file: "
                                      f"{one_line(exc)}") from exc
    return known


@dataclass
class _Hop:
    """What one connection attempt resolved to, for its error messages."""

    label: str
    host: str
    port: int
    username: str
    user_known_hosts: Path  # the one file accept-new writes and the hints name
    known_hosts: list[Path]  # every file checked, the user's first
    via: str | None
    config_name: str
    client: _Client | None = None

    @property
    def where(self) -> str:
        return f"{self.host} port {self.port}"


def _entry_file(hop: _Hop) -> Path:
    """The checked file that holds an entry for the hop's host (else the user's file)."""
    for path in hop.known_hosts:
        known = asyncssh.SSHKnownHosts()
        with contextlib.suppress(OSError, ValueError):
            known.load(path.read_text())
            if any(known.match(hop.host, "", hop.port)[:3]):
                return path
    return hop.user_known_hosts


def _host_key_error(hop: _Hop) -> SessionError:
    pattern = hop.host if hop.port == 22 else f"[{hop.host}]:{hop.port}"
    file = _display(hop.user_known_hosts)
    scan = f"ssh-keyscan -p {hop.port} {shlex.quote(hop.host)}"
    if hop.via:  # the host is reachable only from the jump host: scan it from there
        *before, last = hop.via.split(",")
        jump = f"-J {shlex.quote(','.join(before))} " if before else ""
        scan = f"ssh {jump}{shlex.quote(last)} {scan}"
    had_entry = hop.client is None or hop.client.host_had_entry is not False
    if not had_entry:
        return HostKeyUnknown(hop.label, f"host key unknown — not in {file}; verify it and add "
                                         f"it with: {scan} >> {file}")
    entry = _display(_entry_file(hop))
    return HostKeyChanged(hop.label, f"host key changed — {hop.where} offers a key that differs "
                                     f"from the one in {entry} (a reinstalled host, or someone in "
                                     f"the middle); once you have verified the new key, remove "
                                     f"the old one with: ssh-keygen -R {shlex.quote(pattern)} "
                                     f"-f {entry} and add the new one with: {scan} >> {file}")


def _connect_error(hop: _Hop, exc: BaseException, timeout: float | None) -> SessionError:
    """Turn what asyncssh or the OS raised while connecting into a one-line typed error."""
    label = hop.label
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return _host_key_error(hop)
    if isinstance(exc, asyncssh.PermissionDenied):
        return AuthRefused(label, f"authentication refused for user {hop.username} at "
                                  f"{hop.where} — no key offered was accepted; check User and "
                                  f"IdentityFile in {hop.config_name}, or add the key to "
                                  "ssh-agent")
    if isinstance(exc, asyncssh.ChannelOpenError):
        return HostUnreachable(label, f"{hop.via} could not open a connection to {hop.where}: "
                                      f"{one_line(exc.reason)}")
    if isinstance(exc, asyncssh.DisconnectError):
        return HostUnreachable(label, f"the SSH handshake with {hop.where} failed: "
                                      f"{one_line(exc.reason)}")
    if isinstance(exc, asyncio.TimeoutError):
        return HostUnreachable(label, f"no SSH answer from {hop.where} within {timeout:g} s "
                                      "(host.connect_timeout)")
    if isinstance(exc, socket.gaierror):
        return HostUnreachable(label, f"cannot resolve {hop.host!r}: {exc.strerror}; check the "
                                      f"name, or its HostName in {hop.config_name}")
    if isinstance(exc, OSError):
        if exc.errno == errno.ECONNREFUSED:
            return HostUnreachable(label, f"connection refused by {hop.where} — is sshd running "
                                          "there, and is the port right?")
        if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return HostUnreachable(label, f"no route to {hop.where} ({exc.strerror})")
        return HostUnreachable(label, f"cannot connect to {hop.where}: "
                                      f"{one_line(exc.strerror or exc)}")
    return SessionError(label, f"cannot set up SSH to {hop.where}: {one_line(exc)}")


def _record_accepted_key(hop: _Hop) -> None:
    """accept-new (strict_host_keys = false): remember a first-seen key once it proved itself.

    Only a host with no entry in any checked file gets here (a changed key stays refused), and
    the key goes to the user's file only: the profile's known_hosts, else the first
    UserKnownHostsFile (~/.ssh/known_hosts) — never a GlobalKnownHostsFile such as
    /etc/ssh/ssh_known_hosts.
    """
    if hop.client is None or hop.client.accepted_key is None:
        return
    host, port, key = hop.client.accepted_key
    pattern = host if port == 22 else f"[{host}]:{port}"
    algorithm, data = key.export_public_key().decode().split()[:2]
    line = f"{pattern} {algorithm} {data}\n"
    path = hop.user_known_hosts
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with path.open("a+b") as file:
            if file.tell():  # never glue the entry onto a last line that lacks its newline
                file.seek(-1, os.SEEK_END)
                if file.read(1) != b"\n":
                    line = "\n" + line
            file.write(line.encode())
    except OSError as exc:
        raise SessionError(hop.label, f"cannot record the new host key in {_display(path)}: "
                                      f"{exc.strerror}") from exc


class _Connector:
    """Opens the chain of connections to a host: jump hosts first, each one checked strictly."""

    def __init__(self, cfg: Any, config: list[str]) -> None:
        self._cfg = cfg
        self._config = config
        self._config_name = _display(config[0]) if config else "~/.ssh/config"
        self.opened: list[asyncssh.SSHClientConnection] = []

    async def connect(self, target: str, label: str, tunnel: asyncssh.SSHClientConnection | None,
                      via: str | None, depth: int = 0) -> tuple[asyncssh.SSHClientConnection, _Hop]:
        user, host, port = _split_target(target)
        given: dict[str, Any] = {"username": user} if user else {}
        if port:
            given["port"] = port
        try:
            resolved = await asyncssh.SSHClientConnectionOptions.construct(
                config=self._config, host=host, **given)
        except (OSError, ValueError) as exc:
            detail = (f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError)
                      and exc.filename else one_line(exc))
            raise SessionError(label, f"cannot use {self._config_name} for {target}: "
                                      f"{detail}") from exc
        if tunnel is None and isinstance(resolved.tunnel, str):
            if depth >= _MAX_HOPS:
                raise SessionError(label, "too many ProxyJump hops (a loop in "
                                          f"{self._config_name}?)")
            via = resolved.tunnel
            tunnel = await self.chain(resolved.tunnel, depth + 1)
        strict = bool(getattr(self._cfg, "strict_host_keys", True))
        user_file, checked = _known_hosts_files(getattr(self._cfg, "known_hosts", None),
                                                getattr(resolved, "config", None))
        hop = _Hop(label, resolved.host, resolved.port, resolved.username, user_file, checked,
                   via, self._config_name)
        known = _load_known_hosts(label, hop.known_hosts)
        client = hop.client = _Client(known, strict)
        timeout = getattr(self._cfg, "connect_timeout", 15.0)
        try:
            conn = await asyncssh.connect(
                host, config=self._config, tunnel=tunnel, client_factory=lambda: client,
                known_hosts=known,
                keepalive_interval=getattr(self._cfg, "keepalive_interval", 5.0),
                keepalive_count_max=getattr(self._cfg, "keepalive_count_max", 3),
                connect_timeout=timeout, **given)
        except (asyncssh.Error, OSError, asyncio.TimeoutError, ValueError) as exc:
            raise _connect_error(hop, exc, timeout) from exc
        self.opened.append(conn)
        _record_accepted_key(hop)
        return conn, hop

    async def chain(self, spec: str, depth: int) -> asyncssh.SSHClientConnection:
        """`a,b,c` as in ProxyJump: each hop reached through the one before it."""
        conn: asyncssh.SSHClientConnection | None = None
        via: str | None = None
        for name in (part.strip() for part in spec.split(",")):
            conn, _ = await self.connect(name, f"{name} (jump host)", conn, via, depth)
            via = name
        assert conn is not None
        return conn

    async def close(self) -> None:
        for conn in reversed(self.opened):
            conn.close()
            await conn.wait_closed()
        self.opened.clear()


class _SSHStream(Stream):
    def __init__(self, session: SSHSession, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self._session = session
        self._proc = proc
        self._terminated = False
        self._stderr = asyncio.ensure_future(stderr_tail(proc.stderr.read,
                                                         (asyncssh.Error, OSError)))

    async def readline(self) -> bytes:
        with self._session.translate():
            return await self._proc.stdout.readline()

    def write(self, data: bytes) -> None:
        if data:
            self._session.ended_or_lost(self._proc.stdin.write, data)

    async def drain(self) -> None:
        with self._session.translate(), contextlib.suppress(BrokenPipeError):
            await self._proc.stdin.drain()

    def close_stdin(self) -> None:
        self._session.ended_or_lost(self._proc.stdin.write_eof)

    async def wait(self) -> int:
        with self._session.translate():
            await self._proc.wait()
        code = self._proc.returncode
        if code is not None:
            return code
        if self._terminated:
            return -signal.SIGTERM
        raise self._session.lost_error("the command's channel closed without an exit status")

    def terminate(self) -> None:
        """Close the channel: the host ends the command; a detached server is not touched."""
        self._terminated = True
        self._proc.close()


class SSHSession(Session):
    """Commands on a host over one asyncssh connection (plus its jump hosts)."""

    is_local = False

    def __init__(self, host: str, conn: asyncssh.SSHClientConnection, client: _Client,
                 connector: _Connector) -> None:
        self.host = host
        self._conn = conn
        self._client = client
        self._connector = connector

    def lost_error(self, fallback: str) -> ConnectionLost:
        exc = self._client.lost
        if exc is not None:
            reason = one_line(getattr(exc, "reason", None) or exc)
        elif self._client.closed:
            reason = "the session was closed"
        else:
            reason = fallback
        if reason.lower() == "connection lost":
            return ConnectionLost(self.host, "connection lost")
        return ConnectionLost(self.host, f"connection lost: {reason}")

    @contextlib.contextmanager
    def translate(self) -> Iterator[None]:
        """Errors while using the connection become ConnectionLost, with asyncssh's reason."""
        try:
            yield
        except (asyncssh.Error, OSError) as exc:
            if isinstance(exc, asyncio.TimeoutError):
                raise
            raise self.lost_error(one_line(getattr(exc, "reason", None) or exc)) from exc

    def ended_or_lost(self, action: Callable[..., None], *args: Any) -> None:
        """Writing to a command that has ended is a no-op; to a lost connection, an error."""
        try:
            action(*args)
        except (BrokenPipeError, asyncssh.Error) as exc:
            if self._client.closed:
                raise self.lost_error(one_line(exc)) from exc

    async def _start(self, argv: list[str]) -> asyncssh.SSHClientProcess[bytes]:
        if not argv:
            raise ValueError("empty argv")
        with self.translate():
            return await self._conn.create_process(shell_join(argv), encoding=None)

    async def run(self, argv: list[str], stdin: bytes = b"",
                  timeout: float | None = None) -> CommandResult:
        proc = await self._start(argv)
        try:
            if stdin:
                self.ended_or_lost(proc.stdin.write, stdin)
            self.ended_or_lost(proc.stdin.write_eof)
            with self.translate():
                out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            raise SessionError(self.host, f"{argv[0]} did not finish within {timeout:g} s; "
                                          "its channel was closed") from None
        finally:
            proc.close()
        if proc.returncode is None:
            raise self.lost_error("the command's channel closed without an exit status")
        return CommandResult(proc.returncode, out or b"", err or b"")

    async def stream(self, argv: list[str], stdin: bytes = b"") -> Stream:
        stream = _SSHStream(self, await self._start(argv))
        stream.write(stdin)
        return stream

    async def close(self) -> None:
        await self._connector.close()


async def connect(host_cfg: Any, ssh_config: str | os.PathLike[str] | None) -> SSHSession:
    """An SSH session to the profile host's target, through its jump host (see open_session)."""
    target = str(host_cfg.target)
    connector = _Connector(host_cfg, _config_paths(ssh_config))
    try:
        jump = getattr(host_cfg, "jump", None)
        tunnel = await connector.chain(jump, 0) if jump else None
        conn, hop = await connector.connect(target, target, tunnel, jump)
    except BaseException:
        await connector.close()
        raise
    assert hop.client is not None
    return SSHSession(target, conn, hop.client, connector)
