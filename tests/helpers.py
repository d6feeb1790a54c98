"""Helpers shared by the tests: free ports, waiting, liveness, a run's processes, sim profiles."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from textual.pilot import Pilot

from tui.sim.nvml.build import build as build_nvml

RUN_ID_ENV = "SPECCONSOLE_RUN_ID"


@functools.cache
def nvml_dir() -> str:
    """The NVML stand-in C library (tui/sim/nvml), built once: the agent's real nvidia-ml-py
    loads it from this directory (LD_LIBRARY_PATH), reading the simulated GPUs' state."""
    return str(build_nvml())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout: float = 10, what: str = "") -> Any:
    """Poll until `predicate()` is truthy; its value, or an AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


async def async_wait_for(predicate: Callable[[], Any], timeout: float = 10,
                         what: str = "") -> Any:
    """wait_for inside an event loop: poll, letting the loop run between tries, until
    `predicate()` is truthy; its value, or an AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


async def next_event(events: asyncio.Queue, kind: type, timeout: float = 30) -> Any:
    """The next event of `kind` from a supervisor's queue, skipping the others."""
    async def first() -> object:
        while not isinstance(event := await events.get(), kind):
            pass
        return event
    return await asyncio.wait_for(first(), timeout)


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def carriers(run_id: str) -> list[int]:
    """Live processes whose environ carries the run id (what must be gone after a kill)."""
    needle = f"\0{RUN_ID_ENV}={run_id}\0".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = b"\0" + Path(f"/proc/{name}/environ").read_bytes() + b"\0"
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state not in (b"Z", b"X"):
            out.append(int(name))
    return out


@dataclass
class LineCount:
    """How the lines a watcher showed compare with the run's log file."""

    shown: int
    lost: int  # complete lines of the log, up to the last one shown, never shown
    duplicated: int  # shown more than once
    out_of_order: bool
    stray: int  # shown at an offset where no line of the file starts
    seq_faults: list[str] = field(default_factory=list)  # per process, [sim#n] not 1, 2, 3...
    processes: int = 0  # processes whose numbering was checked


# the unprefixed tqdm and uvicorn lines are numbered by Worker_TP0 and the API server, so their
# prefixed lines alone do not count 1, 2, 3
_UNNUMBERED = (None, "Worker_TP0", "APIServer")


def count_lines(lines: Sequence[Any], log: Path) -> LineCount:
    """Every line exactly once, in order? `lines` are LogLines (offset, raw, proc) as shown,
    from the first byte of the log; checked by byte offset against the file and by the
    simulator's own per-process [sim#n] numbering."""
    offsets = [line.offset for line in lines]
    starts, pos = [], 0
    for raw in log.read_bytes().split(b"\n")[:-1]:
        starts.append(pos)
        pos += len(raw) + 1
    last = max(offsets, default=-1)
    lost = len({s for s in starts if s <= last} - set(offsets))
    per_proc: dict[str, list[int]] = {}
    for line in lines:
        if "[sim#" in line.raw and line.proc not in _UNNUMBERED:
            per_proc.setdefault(line.proc, []).append(int(line.raw.rsplit("[sim#", 1)[1][:-1]))
    faults = [f"{proc}: {seqs[:20]}" for proc, seqs in per_proc.items()
              if seqs != list(range(1, len(seqs) + 1))]
    return LineCount(len(offsets), lost, len(offsets) - len(set(offsets)),
                     offsets != sorted(offsets), len(set(offsets) - set(starts)), faults,
                     len(per_proc))


def sim_server(tmp: Path, scenario: str, time_scale: float, *, load_time: str = "25m",
               stall: str = "30s", gpus: int = 8, probe: str = "1s") -> str:
    """The profile's tables after [host] for the simulated engine: Kimi-K2.5 at TP 8 with an
    EAGLE-3 drafter, preflight's file checks off, its fake GPUs under `tmp`; once READY the
    agent asks the server every `probe` (the tests' runs serve for seconds, not weeks)."""
    return f"""
[server]
engine = "vllm"
model = "/models/Kimi-K2.5"
port = {free_port()}
tensor_parallel_size = 8

[server.speculative]
method = "eagle3"
model = "/models/Kimi-K2.5-eagle3"
num_speculative_tokens = 5

[preflight]
compile = false
paths_exist = false

[expect]
load_time = "{load_time}"
stall_timeout = "{stall}"
serving_probe_interval = "{probe}"

[simulate]
scenario = "{scenario}"
time_scale = {time_scale}
gpus = {gpus}
gpu_state = "{tmp / 'gpus'}"
nvml = "{nvml_dir()}"
"""


def sim_profile(tmp: Path, scenario: str, *, target: str = "local", time_scale: float = 300.0,
                name: str | None = None, stall: str = "30s", extra: str = "") -> Path:
    """Write a simulated-engine profile whose runs and fake GPUs live under `tmp`."""
    path = tmp / f"{name or scenario}.toml"
    path.write_text(f"""
[host]
target = "{target}"
python = "{sys.executable}"
runs_dir = "{tmp / 'runs'}"
{sim_server(tmp, scenario, time_scale, stall=stall)}{extra}
""")
    return path


async def until(pilot: Pilot[Any], check: Callable[[], Any], timeout: float = 30,
                what: str = "") -> Any:
    """Let the app run until `check()` is truthy: its value, or an AssertionError naming
    `what`."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        await pilot.pause(0.02)
    return value


async def until_event(events: asyncio.Queue[Any], check: Callable[[Any], bool], timeout: float,
                      what: str = "", seen: list[Any] | None = None) -> Any:
    """The first event from `events` that passes `check` (each one read is kept in `seen`),
    or an AssertionError naming `what` and what came instead."""
    seen = [] if seen is None else seen
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            event = await asyncio.wait_for(events.get(), left)
        except asyncio.TimeoutError:
            break
        seen.append(event)
        if check(event):
            return event
    raise AssertionError(f"no {what or 'such event'} within {timeout:g}s; seen: "
                         f"{[type(e).__name__ for e in seen[-20:]]}")


def keep_figure(env: str, name: str, value: object) -> None:
    """Keep a measured figure in the JSON file the lane's `bootstrap` named in `env` (it prints
    them after the tests); nothing outside a lane."""
    path = os.environ.get(env)
    if not path:
        return
    figures = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    figures[name] = value
    Path(path).write_text(json.dumps(figures))


RAY_ENV = "SPECCONSOLE_LAB_ENV"  # the lanes' Ray environment (tui/bootstrap.py ensure_lab_env)


def ray_venv() -> Path:
    """The venv with the real Ray (and this checkout) that the lab and Slurm lanes make or
    reuse (`python3 -m tui.bootstrap lab|slurm`). Missing is a failure, never a skip: the lane
    sets it up."""
    configured = os.environ.get(RAY_ENV)
    root = Path(configured).expanduser() if configured else (
        Path.home() / ".cache" / "specconsole" / "lab-ray")
    venv = root / "venv"
    if not (venv / "bin" / "ray").exists() or not (venv / "bin" / "python").exists():
        pytest.fail(f"no Ray environment in {venv}: run the lane (`python3 -m tui.bootstrap "
                    "lab` or `slurm`), which makes it (or set $SPECCONSOLE_LAB_ENV)")
    return venv
