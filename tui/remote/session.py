"""Sessions: run commands on the GPU host, here or over SSH, behind one interface.

Everything above tui.remote sees `Session` and `Stream` only (interface.py), and only the
typed errors of `tui.core.errors`: asyncssh and OS exceptions are translated here and in
`tui.remote.ssh` (the SSH half, imported only for a remote host), into one-line messages that
name the host and the fix, so no traceback ever reaches a user.

Commands are argv lists. Locally they are exec'd without a shell; over SSH the remote shell gets
`tui.core.command.shell_join(argv)` (the one place a command becomes text), so a profile value
such as `$(touch /tmp/pwned)` arrives as literal text.
What a host writes back leaves clean (interface.py's `remote_text`, `one_line`).
Host keys are always checked against a known_hosts file (never `known_hosts=None`; ssh.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Sequence
from typing import Any

from tui.core.errors import RemoteModuleMissing, RemotePythonMissing, SessionError
from tui.remote.interface import CommandResult, Session, Stream, one_line, stderr_tail

_LINE_LIMIT = 1 << 24  # one agent JSON line (a big process table) must fit
_SHELL_NOT_FOUND = 127
_SHELL_NOT_EXECUTABLE = 126


# ----------------------------------------------------------------------------- local


class _LocalStream(Stream):
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        assert proc.stdin and proc.stdout and proc.stderr
        self._stdin, self._stdout = proc.stdin, proc.stdout
        self._stderr = asyncio.ensure_future(stderr_tail(proc.stderr.read))

    async def readline(self) -> bytes:
        return await self._stdout.readline()

    def write(self, data: bytes) -> None:
        if not self._stdin.is_closing():
            self._stdin.write(data)

    async def drain(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await self._stdin.drain()

    def close_stdin(self) -> None:
        self._stdin.close()

    async def wait(self) -> int:
        return await self._proc.wait()

    def terminate(self) -> None:
        if self._proc.returncode is None:
            _signal_group(self._proc.pid, signal.SIGTERM)


class _UnstartedStream(Stream):
    """A command whose executable could not be exec'd, reported as a shell would (127/126)."""

    def __init__(self, code: int, message: str) -> None:
        self._code = code
        self._stderr = asyncio.get_running_loop().create_future()
        self._stderr.set_result(message.encode())

    async def readline(self) -> bytes:
        return b""

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def close_stdin(self) -> None:
        pass

    async def wait(self) -> int:
        return self._code

    def terminate(self) -> None:
        pass


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


class LocalSession(Session):
    """Commands on this machine, each exec'd (no shell) in its own session like sshd does.

    A missing executable is reported as exit 127 with the shell's message on stderr, so callers
    handle the local and the SSH case alike.
    """

    is_local = True

    def __init__(self, host: str = "local") -> None:
        self.host = host
        self._procs: set[asyncio.subprocess.Process] = set()

    async def _spawn(self, argv: Sequence[str]) -> asyncio.subprocess.Process | CommandResult:
        if not argv:
            raise ValueError("empty argv")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=_LINE_LIMIT)
        except OSError as exc:
            code = _SHELL_NOT_FOUND if isinstance(exc, FileNotFoundError) else (
                _SHELL_NOT_EXECUTABLE)
            message = f"{argv[0]}: {exc.strerror or exc}\n"
            return CommandResult(code, b"", message.encode())
        self._procs.add(proc)
        return proc

    async def run(self, argv: list[str], stdin: bytes = b"",
                  timeout: float | None = None) -> CommandResult:
        proc = await self._spawn(argv)
        if isinstance(proc, CommandResult):
            return proc
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        except asyncio.TimeoutError:
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise SessionError(self.host, f"{argv[0]} did not finish within {timeout:g} s; "
                                          "it was killed") from None
        finally:
            self._procs.discard(proc)
        assert proc.returncode is not None
        return CommandResult(proc.returncode, out, err)

    async def stream(self, argv: list[str], stdin: bytes = b"") -> Stream:
        proc = await self._spawn(argv)
        if isinstance(proc, CommandResult):
            return _UnstartedStream(proc.returncode, proc.stderr.decode())
        stream = _LocalStream(proc)
        stream.write(stdin)
        return stream

    async def close(self) -> None:
        procs = [p for p in self._procs if p.returncode is None]
        self._procs.clear()
        for proc in procs:
            _signal_group(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 2.0)
            except asyncio.TimeoutError:
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()


async def open_session(host_cfg: Any, *, ssh_config: str | os.PathLike[str] | None = None
                       ) -> Session:
    """A session for a profile's [host]: "local", or SSH to its target (via its jump host).

    `host_cfg` needs .target and may carry .jump, .known_hosts, .strict_host_keys,
    .keepalive_interval, .keepalive_count_max, .connect_timeout (the profile's defaults apply).
    `ssh_config` (or $SPECCONSOLE_SSH_CONFIG) replaces ~/.ssh/config.  asyncssh is imported
    only here, for a remote host: a local run, `explain` and `--help` start without it.
    """
    if str(host_cfg.target) == "local":
        return LocalSession()
    from tui.remote.ssh import connect  # a third of a second of start-up, for SSH only

    return await connect(host_cfg, ssh_config)


# ----------------------------------------------------------------------------- python probe

_PROBE = """\
import json, platform, sys
out = {"python": platform.python_version(), "executable": sys.executable, "missing": {}}
for name in ("psutil", "pynvml"):
    try:
        mod = __import__(name)
    except Exception as exc:
        out["missing"][name] = "%s: %s" % (type(exc).__name__, exc)
        continue
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version
            version = dist_version("nvidia-ml-py" if name == "pynvml" else name)
        except Exception:
            version = "unknown"
    out[name] = str(version)
sys.stdout.write(json.dumps(out) + "\\n")
"""

PYTHON_FIX = "set host.python to the server's venv python (e.g. /opt/vllm/.venv/bin/python)"
MODULE_FIX = ("point host.python at the server's venv, which has psutil and pynvml (or install "
              "them into that Python: pip install psutil nvidia-ml-py)")


def python_missing(host: str, python: str, code: int, stderr: str) -> RemotePythonMissing | None:
    """The interpreter never started (exit 127/126, or the shell's "not found"), else None.

    The one test and wording for check_python and the agent (tui.remote.agent_link) alike.
    """
    err = stderr.strip()
    if not (code in (_SHELL_NOT_FOUND, _SHELL_NOT_EXECUTABLE)
            or (code and ("not found" in err or "No such file" in err))):
        return None
    why = "is not executable" if code == _SHELL_NOT_EXECUTABLE else "not found"
    if err:
        why += f": {one_line(err.splitlines()[-1])}"
    return RemotePythonMissing(host, f"no Python at {python} ({why}) — {PYTHON_FIX}")


async def check_python(session: Session, python: str | Sequence[str],
                       timeout: float = 60.0) -> dict[str, str]:
    """Probe the interpreter the agent will use; versions of Python, psutil and pynvml.

    `python` is the interpreter path, or an argv prefix ending with it (["env", "X=1", path]).
    """
    prefix = [python] if isinstance(python, str) else list(python)
    shown = prefix[-1]
    result = await session.run([*prefix, "-c", _PROBE], timeout=timeout)
    err = result.stderr_text().strip()
    last = one_line(err.splitlines()[-1]) if err else ""
    missing_python = python_missing(session.host, shown, result.returncode, err)
    if missing_python is not None:
        raise missing_python
    try:
        report = json.loads(result.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        missing: dict[str, str] = report.pop("missing")
    except (ValueError, IndexError, KeyError, AttributeError):
        detail = last or f"exit code {result.returncode}"
        raise RemotePythonMissing(session.host, f"{shown} did not run as Python 3 ({detail}) — "
                                                f"{PYTHON_FIX}") from None
    if missing:
        names = sorted(missing)
        first = one_line(missing[names[0]])
        raise RemoteModuleMissing(session.host, f"{shown} cannot import {', '.join(names)} "
                                                f"({first}) — {MODULE_FIX}")
    return {key: one_line(value) for key, value in report.items()}
