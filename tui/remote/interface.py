"""What every way of reaching the GPU host offers (`Session`, `Stream`, `CommandResult`), and
the cleaning of what a host writes back: the local session (session.py) and the SSH one
(ssh.py) implement it, and everything above tui.remote sees only this.

What a host writes enters through `remote_text` and `one_line`: a shell start-up that prints
colours, sets the window title or writes `[bold]` reaches no terminal or widget as anything but
text.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tui.core.logline import strip_escapes

_STDERR_KEEP = 1 << 16  # stderr is drained so it never blocks stdout; its tail is kept


def remote_text(data: bytes) -> str:
    """What a host wrote, safe to print or draw: each line without escape sequences or control
    characters (a host's shell start-up may print colours or set the terminal's title)."""
    return "\n".join(strip_escapes(line) for line in data.decode("utf-8", "replace").split("\n"))


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: bytes
    stderr: bytes

    def stderr_text(self) -> str:
        """stderr as clean text (remote_text): what error messages quote."""
        return remote_text(self.stderr)


class Stream(ABC):
    """A running command: stdout read line by line, stdin written, stderr collected apart.

    Exit codes follow subprocess: a command killed by signal N reports -N.
    """

    _stderr: asyncio.Future[bytes]

    @abstractmethod
    async def readline(self) -> bytes:
        """The next stdout line with its newline; a partial last line; b"" at EOF."""

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Queue bytes for stdin; writes to a command that has ended are dropped."""

    @abstractmethod
    async def drain(self) -> None:
        """Wait until queued stdin is handed on (flow control)."""

    @abstractmethod
    def close_stdin(self) -> None:
        """Send EOF: the agent takes it as its cue to exit."""

    @abstractmethod
    async def wait(self) -> int:
        """Wait for the command to end and return its exit code."""

    @abstractmethod
    def terminate(self) -> None:
        """Stop the command now (its process group locally, its channel over SSH)."""

    async def stderr_text(self) -> str:
        """Everything the command wrote to stderr (the last 64 KiB), once stderr has closed, as
        clean text (remote_text)."""
        return remote_text(await asyncio.shield(self._stderr))


class Session(ABC):
    """A place to run commands: this machine, or a GPU host over one SSH connection."""

    host: str
    is_local: bool

    @abstractmethod
    async def run(self, argv: list[str], stdin: bytes = b"",
                  timeout: float | None = None) -> CommandResult:
        """Run argv to completion, feeding it stdin then EOF; SessionError past the timeout."""

    @abstractmethod
    async def stream(self, argv: list[str], stdin: bytes = b"") -> Stream:
        """Start argv with stdin left open after the given bytes."""

    @abstractmethod
    async def close(self) -> None:
        """Release the session: commands still attached to it end (detached ones live on)."""


async def stderr_tail(read: Callable[[int], Awaitable[bytes]],
                      lost: tuple[type[BaseException], ...] = (OSError,)) -> bytes:
    """Read a pipe to EOF, keeping its last bytes: an unread stderr would stall the command.
    `lost`: what its transport raises when it goes away (SSH adds its own errors)."""
    kept = bytearray()
    with contextlib.suppress(*lost):
        while chunk := await read(65536):
            kept += chunk
            del kept[:-_STDERR_KEEP]
    return bytes(kept)


def one_line(text: object) -> str:
    """An error's words on one clean line (SSH servers and hosts word some of them)."""
    return " ".join(remote_text(str(text).encode("utf-8", "replace")).split())
