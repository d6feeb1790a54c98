"""6. Start-up, as a user meets it: `specconsole demo` in a terminal (a pty, 200×50) until the
first frame is on it (the footer's key labels have been written), and `specconsole wait
PROFILE --launch` until its first line. Each in a fresh process, HOME and data dir temporary.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

from common import ROOT, Figures, say
from helpers import sim_profile

FIRST_FRAME = b"Raw/filtered"  # a footer label: only a drawn frame has it


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "SPECCONSOLE_DATA_DIR": str(home / "data"),
            "TERM": "xterm-256color", "PYTHONPATH": str(ROOT), "TMUX": ""}


def _demo_first_frame(home: Path) -> float:
    """Seconds from spawning `specconsole demo` to the first frame on its terminal."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec the console on the pty
        os.execve(sys.executable, [sys.executable, "-m", "tui", "demo"], _env(home))
    start = time.monotonic()
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    seen = b""
    try:
        while FIRST_FRAME not in seen:
            if time.monotonic() - start > 60:
                raise TimeoutError("no first frame in 60 s")
            if select.select([fd], [], [], 1)[0]:
                seen = seen[-4096:] + os.read(fd, 65536)
        took = time.monotonic() - start
        os.write(fd, b"q")  # quit: the demo stops its own server
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    os.read(fd, 65536)
                except OSError:
                    break
        return took
    finally:
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def _wait_first_line(home: Path) -> float:
    """Seconds from spawning `specconsole wait PROFILE --launch` to its first line (the run
    dies of the story's SyntaxError, so `wait` ends by itself)."""
    profile = sim_profile(home, "syntax-error", time_scale=40)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tui", "wait", str(profile), "--launch"],
                            stdout=subprocess.PIPE, env=_env(home))
    assert proc.stdout is not None
    proc.stdout.readline()
    took = time.monotonic() - start
    proc.stdout.read()
    proc.wait(timeout=60)
    return took


def run(runs: int) -> Figures:
    demo, wait = [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as home:
            demo.append(_demo_first_frame(Path(home)))
        with tempfile.TemporaryDirectory() as home:
            wait.append(_wait_first_line(Path(home)))
    say(f"start-up: `specconsole demo` to its first frame: p50 {statistics.median(demo):.2f} s; "
        f"`specconsole wait` to its first line: p50 {statistics.median(wait):.2f} s "
        f"(n={runs}; max {max(demo):.2f} s / {max(wait):.2f} s)")
    return {"startup_demo_first_frame_s": statistics.median(demo),
            "startup_wait_first_line_s": statistics.median(wait)}
