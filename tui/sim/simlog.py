"""vLLM-shaped log lines for one simulated process.

Format: `(<Proc> pid=<N>) <LEVEL> <MM-DD> <HH:MM:SS> [<file>.py:<line>] <message>`. Every line
this process writes itself ends with ` [sim#<n>]`, n counting per process from 1, so a test can
prove that a pipeline lost or doubled nothing. Python's own traceback text (worker errors,
bare tracebacks) and the `--sim-flood` firehose carry no counter: `check_sequences` in
tests/test_sim.py counts only the tagged lines. Each record is one `os.write` to the inherited
fd, so lines of concurrent processes appending to one log never interleave.
"""

from __future__ import annotations

import os
import threading
import traceback

from tui.sim.runtime import SimClock

STDOUT = 1
STDERR = 2


class SimLog:
    """The log of one process; thread-safe (the HTTP thread writes access lines)."""

    def __init__(self, proc: str, clock: SimClock, prefix: str | None = None,
                 outer: str = "") -> None:
        """`prefix` replaces vLLM's `(<proc> pid=<N>) ` (vLLM's headless node and Ray's workers
        have none); `outer` precedes every line, as Ray's log monitor puts
        `(RayWorkerWrapper pid=N, ip=A) ` before each line of a worker."""
        self.prefix = f"({proc} pid={os.getpid()}) " if prefix is None else prefix
        self.outer = outer
        self.clock = clock
        self._seq = 0
        self._lock = threading.Lock()

    def info(self, src: str, message: str) -> None:
        self.record("INFO", src, message)

    def error(self, src: str, message: str) -> None:
        self.record("ERROR", src, message)

    def record(self, level: str, src: str, message: str) -> None:
        self.line(f"{self._header(level, src)}{message}")

    def line(self, text: str, *, prefixed: bool = True, fd: int = STDOUT) -> None:
        """One line of this process's own text (tqdm bars and uvicorn lines are unprefixed)."""
        with self._lock:
            self._seq += 1
            head = self.head() if prefixed else ""
            self._out(fd, f"{head}{text} [sim#{self._seq}]\n")

    def head(self) -> str:
        """What precedes a line of this process's own text: vLLM's process prefix."""
        return self.prefix

    def raw(self, text: str) -> None:
        """Text written as is, in one write: whole lines, no prefix, no counter."""
        _write(STDOUT, text)

    def exception(self, src: str, message: str, exc: BaseException) -> None:
        """`logger.exception`: the message, then the traceback, each line under the same header."""
        header = self.prefix + self._header("ERROR", src)
        with self._lock:
            self._seq += 1
            lines = [f"{header}{message} [sim#{self._seq}]"]
            lines += [f"{header}{tb}" for tb in _traceback_lines(exc)]
            self._out(STDOUT, "".join(f"{ln}\n" for ln in lines))

    def bare_traceback(self, exc: BaseException, first: str | None = None) -> None:
        """A traceback as Python itself prints it to stderr: no prefix, no counter."""
        lines = ([first] if first else []) + _traceback_lines(exc)
        self._out(STDERR, "".join(f"{ln}\n" for ln in lines))

    def _out(self, fd: int, text: str) -> None:
        if self.outer:
            text = "".join(self.outer + ln for ln in text.splitlines(keepends=True))
        _write(fd, text)

    def _header(self, level: str, src: str) -> str:
        return f"{level} {self.clock.stamp()} [{src}] "


def _traceback_lines(exc: BaseException) -> list[str]:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text.rstrip("\n").split("\n")


def _write(fd: int, text: str) -> None:
    data = text.encode("utf-8", "replace")
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # the log's reader is gone (EPIPE): the simulation goes on silently
        pass

