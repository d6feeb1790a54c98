"""Tailing server.log by byte offset: complete lines only, resumable where the console left off."""

from __future__ import annotations

import os

from .redaction import SecretFinder
from .wire import emit

CHUNK = 1 << 20  # the most log bytes in one message; a longer line is split here


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

    def __init__(self, path: str, offset: int, finder: SecretFinder | None = None) -> None:
        self.path = path
        self.offset = max(0, offset)
        self.finder = finder
        self.partial = b""
        self.fd: int | None = None
        self.size = -1
        self.failed: str | None = None  # the last read error reported

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
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # not written yet
                return False
        size = os.fstat(self.fd).st_size
        grew, self.size = size != self.size, size
        if size < self.offset + len(self.partial):
            emit("error", kind="log_truncated",
                 message=f"{self.path} shrank to {size} bytes; reading from 0")
            self.offset, self.partial = 0, b""
        for _ in range(16):  # at most ~16 MB per tick keeps deaths and stdin prompt
            pos = self.offset + len(self.partial)
            want = min(size - pos, CHUNK - len(self.partial))
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

    def _send(self, data: bytes) -> None:
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        texts = [line.decode("utf-8", "replace") for line in lines]
        if self.finder is not None and (found := self.finder.scan(texts)):
            emit("secrets", redact=found)  # before the lines that hold them
        emit("log", off=self.offset, end=self.offset + len(data), lines=texts)
