"""Tailing server.log by byte offset: complete lines only, resumable where the console left off.

A console attaching to a long log asks for a skim: the first `head` and the last `tail` bytes
of what it has not read, and one `log_skipped` message for the middle (its byte range, at line
boundaries), which it reads back a page at a time only if the user scrolls there. The start
holds the launch's phases, the end the current state and any death's traceback; a week of
request lines between them would only delay the first screen."""

from __future__ import annotations

import os
import stat

from .redaction import SecretFinder
from .wire import emit

CHUNK = 1 << 20  # the most log bytes in one message; a longer line is split here
SKIM_MIN_GAP = 8 << 20  # a middle shorter than this is read: skipping it gains nothing
LINE_PROBE = 64 << 10  # how far to look for the end of the line a skim boundary falls in


def utf8_cut(data: bytes) -> int:
    """Where to split a too-long line so that no UTF-8 sequence is cut in two."""
    n = len(data)
    for i in range(1, min(4, n) + 1):
        c = data[n - i]
        if c & 0xC0 == 0x80:
            continue
        if c >= 0xC0:
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return n - i if need > i else n
        return n
    return n


class LogTail:
    """Complete lines from a byte offset; a partial last line waits for its newline."""

    def __init__(self, path: str, offset: int, finder: SecretFinder | None = None,
                 skim: tuple[int, int] | None = None, follow: bool = False) -> None:
        self.path = path
        # the run's own server.log is opened without following a link (a process of the run
        # cannot make the agent read another file); an attached run's log is a link the
        # agent made itself to the file the user named
        self.flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else
                                                                   os.O_NOFOLLOW)
        self.offset = max(0, offset)
        self.finder = finder
        self.partial = b""
        self.fd: int | None = None
        self.size = -1
        self.failed: str | None = None  # the last read error reported
        self.skim = skim  # (head, tail) bytes, decided on the first look at the file
        self.gap: tuple[int, int] | None = None  # [start, end) to skip, at line starts

    def pump(self, final: bool = False) -> bool:
        """Send what is new (with `final`, a last line without its newline too); True when
        the file changed since the last look or more is waiting.  Never raises."""
        try:
            return self._pump(final)
        except OSError as exc:  # EIO on a sick disk, say: retried next tick, said once
            message = f"cannot read {self.path}: {exc.strerror or exc}"
            if message != self.failed:
                self.failed = message
                emit("error", kind="log_read", message=message)
            return False

    def _pump(self, final: bool) -> bool:
        if self.fd is None:
            try:
                fd = os.open(self.path, self.flags)
            except FileNotFoundError:  # not written yet
                return False
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a fifo, a device: never read
                os.close(fd)
                raise OSError("not a regular file")
            self.fd = fd
        size = os.fstat(self.fd).st_size
        grew, self.size = size != self.size, size
        if size < self.offset + len(self.partial):
            emit("error", kind="log_truncated",
                 message=f"{self.path} shrank to {size} bytes; reading from 0")
            self.offset, self.partial, self.gap = 0, b"", None
        if self.skim is not None:
            self.gap, self.skim = self._plan_gap(self.fd, size, *self.skim), None
        for _ in range(16):  # at most ~16 MB per tick keeps deaths and stdin prompt
            pos = self.offset + len(self.partial)
            if self.gap is not None and not self.partial and pos >= self.gap[0]:
                emit("log_skipped", off=self.gap[0], end=self.gap[1])
                self.offset, self.gap = self.gap[1], None
                pos = self.offset
            stop = self.gap[0] if self.gap is not None else size
            want = min(stop - pos, CHUNK - len(self.partial))
            if want > 0:
                self.partial += os.pread(self.fd, want, pos)
            data = self.partial
            if not data:
                return grew
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if len(data) >= CHUNK:
                    cut = utf8_cut(data)
                elif final and self.offset + len(data) >= size:
                    cut = len(data)
                else:
                    return grew
            self._send(data[:cut])
            self.offset += cut
            self.partial = data[cut:]
        return True  # more may be waiting: come back soon

    def _plan_gap(self, fd: int, size: int, head: int, tail: int) -> tuple[int, int] | None:
        """The middle to skip, from the end of the line `head` bytes in to the start of the
        line `tail` bytes before the end; None when it would be short (or a line is huge)."""
        if size - self.offset - head - tail < SKIM_MIN_GAP:
            return None
        start = self._line_start(fd, self.offset + head)
        end = self._line_start(fd, size - tail)
        if start is None or end is None or end - start < SKIM_MIN_GAP:
            return None
        return start, end

    @staticmethod
    def _line_start(fd: int, at: int) -> int | None:
        """The first line start at or after `at` (None past LINE_PROBE bytes of one line)."""
        newline = os.pread(fd, LINE_PROBE, at - 1).find(b"\n")
        return None if newline < 0 else at + newline

    def _send(self, data: bytes) -> None:
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        texts = [line.decode("utf-8", "replace") for line in lines]
        if self.finder is not None and (found := self.finder.scan(texts)):
            emit("secrets", redact=found)  # before the lines that hold them
        emit("log", off=self.offset, end=self.offset + len(data), lines=texts)
