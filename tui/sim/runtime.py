"""Process plumbing shared by the simulated API server, engine core and workers.

- `spawn` starts a child the way vLLM's processes look from outside: argv[0] (so
  psutil's cmdline()[0]) is the title, e.g. `VLLM::EngineCore_DP0`, while the executable is
  still this Python. On 3.11+ PYTHONEXECUTABLE keeps sys.executable and the venv; on 3.10 the
  child is a base interpreter, which is enough because the simulation is stdlib only and
  PYTHONPATH carries this package.
- `become` is the child's first act: comm via prctl(PR_SET_NAME) (the kernel keeps 15 chars,
  `VLLM::EngineCor`, as with real vLLM) and PR_SET_PDEATHSIG=SIGKILL, so killing a parent (or
  a test's process group) never leaves a simulated GPU holder behind.
- `Runtime` turns SIGTERM/SIGINT into a `Terminated` exception raised only at waits (through a
  wakeup fd), never in the middle of writing a log line.

Two fault options, simulation only (`--sim-orphans`, `--sim-ignore-sigterm` of the engine):
orphans arm no PDEATHSIG, so the engine core and the workers outlive a killed API server as
real vLLM's do; ignore_term makes SIGTERM do nothing, as in a server wedged in a collective.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

CONFIG_ENV = "SPECCONSOLE_SIM_CHILD"
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


class Terminated(Exception):
    """SIGTERM or SIGINT arrived; raised at the next wait."""


class SimClock:
    """Simulated seconds since launch (`t0`, epoch seconds), running `scale` times real time;
    `shift` simulated seconds of waiting for other hosts delay the schedule, not the stamps."""

    def __init__(self, t0: float, scale: float, shift: float = 0.0) -> None:
        self.t0 = t0
        self.scale = scale
        self.shift = shift

    def now(self) -> float:
        return (time.time() - self.t0) * self.scale - self.shift

    def deadline(self, sim_t: float) -> float:
        """The epoch time at which simulated second `sim_t` happens."""
        return self.t0 + (sim_t + self.shift) / self.scale

    def stamp(self) -> str:
        """vLLM's `%m-%d %H:%M:%S`, on the simulated clock so durations in messages agree."""
        return time.strftime("%m-%d %H:%M:%S",
                             time.localtime(self.t0 + self.now() + self.shift))


class Runtime:
    """Signals and waiting for one simulated process; waits raise `Terminated`."""

    def __init__(self, clock: SimClock, ignore_term: bool = False) -> None:
        self.clock = clock
        self.signal: int | None = None
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signal = signum

    def wait(self, fds: Sequence[int] = (), until: float | None = None) -> list[int]:
        """Block until one of `fds` is readable or epoch time `until`; returns the readable fds."""
        while True:
            if self.signal is not None:
                raise Terminated(self.signal)
            timeout = None if until is None else max(0.0, until - time.time())
            readable, _, _ = select.select([self._wake_r, *fds], [], [], timeout)
            if self.signal is not None:
                raise Terminated(self.signal)
            ready = [fd for fd in readable if fd != self._wake_r]
            if ready or (until is not None and time.time() >= until):
                return ready

    def at(self, sim_t: float) -> None:
        """Sleep until simulated second `sim_t` (at once if it has passed)."""
        self.wait(until=self.clock.deadline(sim_t))

    def sleep_sim(self, seconds: float, min_real: float = 0.0) -> None:
        """Sleep `seconds` of simulated time, but at least `min_real` real seconds."""
        self.wait(until=time.time() + max(seconds / self.clock.scale, min_real))

    def forever(self) -> None:
        self.wait()


def child_config() -> dict[str, Any]:
    """The JSON config a parent passed to this child (removed from the environment)."""
    return json.loads(os.environ.pop(CONFIG_ENV))


def become(title: str, parent_pid: int, orphan: bool = False) -> None:
    """Take vLLM's process name and die with the parent, unless `orphan` (see the module
    docstring)."""
    set_name(title)
    if orphan:
        return
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before PDEATHSIG was armed
        os._exit(1)


def set_name(title: str) -> None:
    """comm, as `ps` and a zombie show it (the kernel keeps 15 characters)."""
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is not None:
        prctl(_PR_SET_NAME, title.encode()[:15], 0, 0, 0)


def spawn(title: str, module: str, config: dict[str, Any], pass_fds: Iterable[int] = (),
          new_session: bool = False) -> subprocess.Popen[bytes]:
    """Start `python -m module` with argv[0] = `title`, passing `config` in the environment;
    `new_session`: in a session and process group of its own, as Ray starts its workers."""
    python = config["python"]
    env = dict(os.environ)
    env[CONFIG_ENV] = json.dumps({**config, "title": title, "parent_pid": os.getpid()})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONEXECUTABLE"] = python
    return subprocess.Popen([title, "-m", module], executable=python, env=env,
                            stdin=subprocess.DEVNULL, pass_fds=tuple(pass_fds),
                            start_new_session=new_session)


def this_python() -> str:
    """The interpreter to run children with (sys.executable is empty in a 3.10 child)."""
    return sys.executable or "python3"
