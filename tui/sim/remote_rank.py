"""A worker on another node, as the engine core sees it: shaped like the Popen of a local one.

Its own module so that the executor (sockets to the simulated cluster) and the Ray actors
(a real Ray cluster) both build on it without importing each other.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

from tui.sim.cluster import Peer


class RemoteRank:
    """A worker on another node, shaped like the engine core's Popen of a local one: what it
    says arrives through a pipe (`fd`, EOF once it ended), its exit code over the network."""

    def __init__(self, rank: int, job: int, peer: Peer) -> None:
        self.rank = rank
        self.job = job
        self.peer = peer
        self.fd, self._write_fd = os.pipe()
        self.returncode: int | None = None
        self._said: set[str] = set()
        self._ended = threading.Event()
        self._lock = threading.Lock()

    def said(self, text: str) -> None:
        with self._lock:
            if not self._ended.is_set() and text not in self._said:  # a replay repeats
                self._said.add(text)
                os.write(self._write_fd, f"{text}\n".encode())

    def ended(self, code: int) -> None:
        with self._lock:
            if not self._ended.is_set():
                self.returncode = code
                self._ended.set()
                os.close(self._write_fd)

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"Worker_TP{self.rank}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """A SIGKILL cannot be refused: the rank counts as ended without waiting for the echo."""
        self._signal(signal.SIGKILL)
        self.ended(-signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        self.peer.send({"op": "signal", "job": self.job, "ranks": [self.rank],
                        "signal": int(signum)})
