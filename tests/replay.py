"""A supervisor that replays a recorded agent stream at pinned times, for snapshot tests.

Everything after the agent is real (the supervisor's dispatch, the launch machine, the bridge,
the app); only the agent's stream comes from a script instead of a host, so pids, clocks and
memory figures are the same on every run and an SVG can be compared byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tui.core.profile import Profile
from tui.core.protocol import (
    GpuInfo,
    GpuProc,
    Gpus,
    Health,
    LogChunk,
    ProcExit,
    ProcInfo,
    Procs,
)
from tui.supervisor import RunInfo, RunStarted, Supervisor

FIXTURES = Path(__file__).parent / "fixtures"
T0 = 1_796_290_000.0  # 2026-12-03 09:26:40 UTC: the pinned launch time
GIB = 2**30
WEIGHTS_33 = 43  # lines of the startup fixture up to "shards: 33% Completed | 10/30"


@dataclass
class PinnedClock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


class ReplaySupervisor(Supervisor):
    def __init__(self, profile: Profile, script: list[tuple[float, object]],
                 clock: PinnedClock, pid: int) -> None:
        super().__init__(profile, clock=clock)
        self.script, self.pinned, self.pid = script, clock, pid

    async def start(self, *, launch: bool = True, skip_preflight: bool = False) -> RunInfo:
        self.run = RunInfo("kimi-k25-eagle3-20261203-092640-a1b2c3",
                           "/home/ml/.specconsole/runs/kimi-k25-eagle3-20261203-092640-a1b2c3",
                           self.pid, T0, attached=False)
        self._emit(self.machine.started(self.pid, T0, T0))
        self._emit([RunStarted(self.run)])
        for at, event in self.script:
            self.pinned.now = T0 + at
            self._dispatch(event)
        return self.run

    async def close(self) -> None:
        self._closing = True


def _spread(lines: list[str], start: int, t0: float, t1: float) -> list[tuple[float, object]]:
    """One chunk per line, their times spread evenly over [t0, t1]; byte offsets from start."""
    out: list[tuple[float, object]] = []
    step = (t1 - t0) / max(1, len(lines))
    for i, line in enumerate(lines):
        end = start + len(line.encode()) + 1
        out.append((t0 + i * step, LogChunk(start, end, (line,))))
        start = end
    return out


def _end(script: list[tuple[float, object]]) -> int:
    return max((e.end for _, e in script if isinstance(e, LogChunk)), default=0)


def _tree(api: int, core: int, workers: list[int], at: float, alive: bool = True) -> Procs:
    procs = [ProcInfo(api, 1, "vllm", "vllm serve /models/moonshotai/Kimi-K2.5", "sleeping",
                      3.0, 2_400 * 2**20, T0, alive),
             ProcInfo(core, api, "VLLM::EngineCor", "VLLM::EngineCore", "sleeping", 12.0,
                      5_100 * 2**20, T0 + 4, alive)]
    procs += [ProcInfo(pid, core, "VLLM::Worker", "VLLM::Worker", "running", 98.0,
                       9_800 * 2**20, T0 + 6, alive) for pid in workers]
    return Procs(T0 + at, tuple(procs))


def _gpus(workers: list[int], at: float, gib: list[float]) -> Gpus:
    return Gpus(T0 + at, tuple(
        GpuInfo(i, "NVIDIA H200", int(gib[i] * GIB), 141 * GIB, 35 + 5 * (i % 3),
                (GpuProc(workers[i], int(gib[i] * GIB)),))
        for i in range(8)))


def loading_script() -> tuple[list[tuple[float, object]], int]:
    """The startup fixture up to the weights at 33 %, 8 GPUs filling, one of them flat."""
    lines = (FIXTURES / "vllm-startup-ready.log").read_text().splitlines()
    workers = list(range(3011, 3019))
    script = _spread(lines[:WEIGHTS_33], 0, 2.0, 620.0)
    for step in range(8):
        gib = [min(120.0, 6.0 + 11.0 * step) for _ in range(8)]
        gib[5] = min(gib[5], 17.0)  # GPU 5 stopped growing while the others grow
        script.append((560.0 + 10 * step, _gpus(workers, 560.0 + 10 * step, gib)))
    script.append((635.0, _tree(2741, 2903, workers, 635.0)))
    return sorted(script, key=lambda item: item[0]), 2741


def ready_script() -> tuple[list[tuple[float, object]], int]:
    lines = (FIXTURES / "vllm-startup-ready.log").read_text().splitlines()
    script, pid = loading_script()
    script += _spread(lines[WEIGHTS_33:], _end(script), 640.0, 1470.0)
    workers = list(range(3011, 3019))
    script.append((1480.0, _gpus(workers, 1480.0, [128.5] * 8)))
    script.append((1490.0, Health(True, "/health", 200, T0 + 1490)))
    script.append((1490.5, Health(True, "/v1/models", 200, T0 + 1490.5)))
    return script, pid


def dead_script() -> tuple[list[tuple[float, object]], int]:
    lines = (FIXTURES / "vllm-crash-syntaxerror.log").read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "SyntaxError" in line) + 1
    script = _spread(lines[:cut], 0, 1.0, 23.0)
    script += [(22.0, _tree(88, 301, [], 21.0)),
               (23.1, ProcExit(301, "VLLM::EngineCor", 1, None, T0 + 23.0, False))]
    script += _spread(lines[cut:], _end(script), 23.2, 24.0)
    script.append((24.0, _tree(88, 301, [], 24.0, alive=False)))
    return sorted(script, key=lambda item: item[0]), 88
