"""A supervisor that replays a recorded agent stream at pinned times, for snapshot tests.

Everything after the agent is real (the supervisor's dispatch, the launch machine, the bridge,
the app); only the agent's stream comes from a script instead of a host, so pids, clocks and
memory figures are the same on every run and an SVG can be compared byte for byte. Each line
of the fixture logs is replayed at the time its own stamp says, from a launch pinned one second
before the log's first stamp.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from pathlib import Path

from tui.core.logtime import LogClock
from tui.core.profile import Profile
from tui.core.protocol import (
    GpuInfo,
    GpuProc,
    Gpus,
    Health,
    LogChunk,
    Metrics,
    ProcExit,
    ProcInfo,
    Procs,
)
from tui.supervise.supervisor import RunInfo, RunStarted, SmokeDone, Supervisor

FIXTURES = Path(__file__).parent / "fixtures"
GIB = 2**30
FIRST_BAR = 43  # lines of the startup fixture up to the first shard bar
SHARDS_43 = "Loading safetensors checkpoint shards:  43% Completed | 13/30 [00:13<00:17,  1.50s/it]"
STARTUP_T0 = float(calendar.timegm((2026, 9, 30, 14, 2, 10, 0, 0, 0)))
CRASH_T0 = float(calendar.timegm((2026, 3, 2, 9, 14, 2, 0, 0, 0)))
WORKERS = list(range(3011, 3019))

Script = tuple[list[tuple[float, object]], int, float]  # (at, agent event), top pid, launch


@dataclass
class PinnedClock:
    now: float

    def __call__(self) -> float:
        return self.now


class ReplaySupervisor(Supervisor):
    def __init__(self, profile: Profile, script: Script) -> None:
        self.script, self.pid, self.t0 = script
        self.pinned = PinnedClock(self.t0)
        super().__init__(profile, clock=self.pinned)

    async def start(self, *, launch: bool = True, skip_preflight: bool = False,
                    kill_leftovers: bool = False, grace: float = 10.0) -> RunInfo:
        run_id = "kimi-k25-eagle3-20260930-140210-a1b2c3"
        self.run = RunInfo(run_id, f"/home/ml/.specconsole/runs/{run_id}", self.pid, self.t0,
                           attached=False)
        self.emit(self.machine.started(self.pid, self.t0, self.t0))
        self.emit([RunStarted(self.run)])
        for at, event in sorted(self.script, key=lambda item: item[0]):
            self.pinned.now = self.t0 + at
            self._dispatch(event)
        return self.run

    async def _smoke(self) -> None:
        """The recorded server's answer: no request leaves the test (the profile's host is not
        reachable, and a DNS failure's wording would differ from machine to machine)."""
        self.emit([SmokeDone(True, 0.42, 16, "Hello! How can I help you today?")])

    async def close(self) -> None:
        self._closing = True


def _timed(lines: list[str], start: int, t0: float, at: float = 0.5,
           ) -> list[tuple[float, object]]:
    """One chunk per line at the time its stamp says (an unstamped line: the one before's)."""
    clock = LogClock(t0)
    out: list[tuple[float, object]] = []
    for line in lines:
        stamped = clock.time_of(line)
        at = stamped - t0 + 0.5 if stamped is not None else at
        end = start + len(line.encode()) + 1
        out.append((at, LogChunk(start, end, (line,))))
        start = end
    return out


def _end(script: list[tuple[float, object]]) -> tuple[int, float]:
    chunks = [(e.end, at) for at, e in script if isinstance(e, LogChunk)]
    return max(chunks) if chunks else (0, 0.0)


def _tree(api: int, core: int, workers: list[int], t0: float, at: float,
          alive: bool = True) -> Procs:
    procs = [ProcInfo(api, 1, "vllm", "vllm serve /models/moonshotai/Kimi-K2.5", "sleeping",
                      3.0, 2_400 * 2**20, t0, alive),
             ProcInfo(core, api, "VLLM::EngineCor", "VLLM::EngineCore", "sleeping", 12.0,
                      5_100 * 2**20, t0 + 4, alive)]
    procs += [ProcInfo(pid, core, "VLLM::Worker", "VLLM::Worker", "running", 98.0,
                       9_800 * 2**20, t0 + 6, alive) for pid in workers]
    return Procs(t0 + at, tuple(procs))


def _gpus(t0: float, at: float, gib: list[float]) -> Gpus:
    return Gpus(t0 + at, tuple(
        GpuInfo(i, "NVIDIA H100 80GB HBM3", int(gib[i] * GIB), 141 * GIB, 35 + 5 * (i % 3),
                (GpuProc(WORKERS[i], int(gib[i] * GIB)),))
        for i in range(8)))


def loading_script() -> Script:
    """The startup fixture up to the weights at 33 %, 8 GPUs filling, one of them flat."""
    lines = (FIXTURES / "vllm-startup-ready.log").read_text().splitlines()
    script = _timed([*lines[:FIRST_BAR], SHARDS_43], 0, STARTUP_T0)
    _, last = _end(script)
    for step in range(12):
        gib = [4.0 + 3.0 * step] * 8
        gib[5] = min(gib[5], 13.0)  # GPU 5 stopped growing while the others grow
        script.append((last - 11 + step, _gpus(STARTUP_T0, last - 11 + step, gib)))
    script.append((last + 1, _tree(2741, 2903, WORKERS, STARTUP_T0, last + 1)))
    return script, 2741, STARTUP_T0


def ready_script() -> Script:
    lines = (FIXTURES / "vllm-startup-ready.log").read_text().splitlines()
    script, pid, t0 = loading_script()
    end, last = _end(script)
    script += _timed(lines[FIRST_BAR:], end, t0, last)
    _, last = _end(script)
    script.append((last, _gpus(t0, last, [128.5] * 8)))
    script.append((last, _tree(2741, 2903, WORKERS, t0, last)))
    script.append((last + 0.5, Health(True, "/health", 200, t0 + last + 0.5)))
    script.append((last + 0.6, Health(True, "/v1/models", 200, t0 + last + 0.6)))
    return script, pid, t0


def _metrics(t0: float, at: float, running: int, waiting: int, kv: float, prompt: int,
             gen: int, queries: int, hits: int, drafted: int, accepted: int) -> Metrics:
    """A scrape of vLLM's /metrics as the agent sends it (its `vllm:` lines, no buckets)."""
    labels = 'engine="0",model_name="Kimi-K2.5"'
    lines = [f"vllm:num_requests_running{{{labels}}} {running}",
             f"vllm:num_requests_waiting{{{labels}}} {waiting}",
             f"vllm:kv_cache_usage_perc{{{labels}}} {kv}",
             f"vllm:prompt_tokens_total{{{labels}}} {prompt}",
             f"vllm:generation_tokens_total{{{labels}}} {gen}",
             f"vllm:prefix_cache_queries_total{{{labels}}} {queries}",
             f"vllm:prefix_cache_hits_total{{{labels}}} {hits}",
             f"vllm:num_preemptions_total{{{labels}}} 2",
             f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafted // 3}",
             f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {drafted}",
             f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}"]
    return Metrics("/metrics", "\n".join(lines), t0 + at)


def serving_script() -> Script:
    """Ready, then serving: six scrapes of /metrics ten seconds apart, traffic rising."""
    script, pid, t0 = ready_script()
    _, last = _end(script)
    for i in range(7):
        at = last + 2 + 10 * i
        script.append((at, _metrics(t0, at, 4 + 3 * i, i // 3, 0.05 + 0.06 * i,
                                    20_000 + 18_000 * i * i, 5_000 + 4_200 * i * i,
                                    20_000 + 18_000 * i * i, 9_000 * i * i,
                                    3_000 * i * i, 2_100 * i * i)))
    return script, pid, t0


def dead_script() -> Script:
    """The crash fixture: the engine core dies of a SyntaxError in a patched model file."""
    lines = (FIXTURES / "vllm-crash-syntaxerror.log").read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "SyntaxError" in line) + 1
    script = _timed(lines[:cut], 0, CRASH_T0)
    end, died = _end(script)
    script += [(died - 1, _tree(88, 301, [], CRASH_T0, died - 1)),
               (died, ProcExit(301, "VLLM::EngineCor", 1, None, CRASH_T0 + died, False))]
    script += _timed(lines[cut:], end, CRASH_T0, died)
    script.append((died + 1, _tree(88, 301, [], CRASH_T0, died + 1, alive=False)))
    return script, 88, CRASH_T0
