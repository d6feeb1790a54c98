"""The console's terminal driver: Textual's own, except that frames drawn after the terminal
went away (its tmux window closed, the SSH session to the jump host dropped) are dropped
instead of raising.

Why: Textual writes every frame through one thread and a queue of thirty. The first write to
a hung-up terminal raises EIO and ends that thread; thirty frames later the app blocks on
the full queue for good, before its SIGHUP handler can run, and the console never exits."""

from __future__ import annotations

from typing import Any, TextIO

from textual.app import App
from textual.drivers.linux_driver import LinuxDriver


class HungUpSafeStream:
    """A text stream that forgets what it cannot write once its terminal has hung up."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.hung_up = False

    def write(self, text: str) -> int:
        if not self.hung_up:
            try:
                self._stream.write(text)
            except OSError:  # EIO: the terminal's other side is closed
                self.hung_up = True
        return len(text)

    def flush(self) -> None:
        if not self.hung_up:
            try:
                self._stream.flush()
            except OSError:
                self.hung_up = True

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding: the stream's own
        return getattr(self._stream, name)


class ConsoleDriver(LinuxDriver):
    """Textual's Linux driver writing through a `HungUpSafeStream`."""

    def __init__(self, app: App[Any], *, debug: bool = False, mouse: bool = True,
                 size: tuple[int, int] | None = None) -> None:
        super().__init__(app, debug=debug, mouse=mouse, size=size)
        self._file = HungUpSafeStream(self._file)
