"""The console's terminal driver: Textual's own, except that frames drawn after the terminal
went away (its tmux window closed, the SSH session to the jump host dropped) are dropped
instead of raising.

Why: Textual writes every frame through one thread and a queue of thirty. The first write to
a hung-up terminal raises EIO and ends that thread; thirty frames later the app blocks on
the full queue for good, before its SIGHUP handler can run, and the console never exits.
Only the errors of a terminal gone away stop drawing: a full pipe (EAGAIN, a slow tmux
client) is waited for and the rest written; any other error loses that one frame only.

Textual's LinuxDriver keeps its output stream in `_file` and hands it to its writer thread;
tests/test_hangup.py fails if a Textual release stops doing so."""

from __future__ import annotations

import errno
import select
from typing import Any, TextIO

from textual.app import App
from textual.drivers.linux_driver import LinuxDriver

# the terminal's other side is closed: nothing drawn will ever be seen
GONE = frozenset({errno.EIO, errno.EPIPE, errno.ENXIO, errno.EBADF, errno.ENODEV})
FULL_WAIT_S = 5.0  # the longest wait for a full terminal to take more, per write


class HungUpSafeStream:
    """A text stream that forgets what it cannot write once its terminal has hung up."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.hung_up = False
        self.dropped = 0  # frames lost to an error that is not a hangup

    def write(self, text: str) -> int:
        rest = text
        while rest and not self.hung_up:
            try:
                self._stream.write(rest)
                rest = ""
            except BlockingIOError as exc:  # EAGAIN: full; what fitted is written
                rest = rest[exc.characters_written:]
                if not self._wait_writable():
                    self.dropped += 1
                    break
            except OSError as exc:
                if exc.errno in GONE:
                    self.hung_up = True
                else:
                    self.dropped += 1
                    break
        return len(text)

    def _wait_writable(self) -> bool:
        try:
            return bool(select.select([], [self._stream.fileno()], [], FULL_WAIT_S)[1])
        except (OSError, ValueError):
            return False

    def flush(self) -> None:
        while not self.hung_up:
            try:
                self._stream.flush()
                return
            except BlockingIOError:
                if not self._wait_writable():
                    return
            except OSError as exc:
                if exc.errno in GONE:
                    self.hung_up = True
                return

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding: the stream's own
        return getattr(self._stream, name)


class ConsoleDriver(LinuxDriver):
    """Textual's Linux driver writing through a `HungUpSafeStream`."""

    def __init__(self, app: App[Any], *, debug: bool = False, mouse: bool = True,
                 size: tuple[int, int] | None = None) -> None:
        super().__init__(app, debug=debug, mouse=mouse, size=size)
        self._file = HungUpSafeStream(self._file)
