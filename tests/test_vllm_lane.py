"""The real-vLLM lane: a real `vllm serve` (CPU build) with an EAGLE-3 drafter, under
specconsole, through the local session and the in-process SSH server.

Deselected by default (`-m 'not lab and not vllm'`); `python3 -m tui.bootstrap vllm` sets up the
environment (tests/vllm_lane/setup_env.py) and runs this file. Every launch is killed through
`specconsole kill` and verified; a finaliser sweeps by SPECCONSOLE_RUN_ID as a backstop. The
crash story shadows vLLM's llama.py with a patched copy (tests/vllm_lane/shadow): the installed
vLLM is never modified. Section h runs the same vLLM in a docker container (the container
lane's image; the lane's setup starts dockerd and builds it). Figures (time to READY or DEAD
per launch) go to $SPECCONSOLE_VLLM_FIGURES, else lane-figures.json in the lane's directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from containers.conftest import containers_of
from containers.setup_docker import IMAGE
from helpers import carriers, free_port, until_event
from slurm.conftest import end_jobs, lane_cluster
from slurm.slurmlab import Cluster
from vllm_lane.lane import (
    SHADOW_DIR,
    DeathWatch,
    http,
    in_container,
    lane_profile,
    patched_llama,
    port_free,
    shadow_env,
)
from vllm_lane.setup_env import env_dir

from tui.core.acceptance import parse_interval, parse_totals
from tui.core.cluster import HEADLESS_JOINED
from tui.core.describe import death_lines
from tui.core.phases import Phase, detect_phase
from tui.core.profile import Profile, load_profile
from tui.core.state import (
    CauseUpdated,
    Died,
    LinesAdded,
    PhaseChanged,
    ProgressChanged,
    Ready,
    ServingSeen,
    Stalled,
)
from tui.supervise.group import ClusterRun, Joined, MemberEvent, RunDied
from tui.supervise.supervisor import ProcsSeen, StacksTaken, Supervisor

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 240.0
STARTUP_PHASES = [Phase.LAUNCH, Phase.CONFIG, Phase.WEIGHTS, Phase.DRAFTER, Phase.KV_CACHE,
                  Phase.API_SERVER, Phase.READY_LOG]


# -- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def lane_dir() -> Path:
    root = env_dir()
    if not (root / "venv" / ".specconsole-lane").exists():
        pytest.fail(f"no vLLM lane environment in {root}: run `python3 -m tui.bootstrap vllm` "
                    "(or python3 tests/vllm_lane/setup_env.py)")
    return root


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM's TMPDIR and caches for this lane run: shared by its launches, kept out of ~."""
    return tmp_path_factory.mktemp("vllm-scratch")


@pytest.fixture(scope="session")
def figures(lane_dir: Path) -> Iterator[dict[str, Any]]:
    """What the lane measured, written where `tui.bootstrap vllm` reads it to print."""
    out: dict[str, Any] = {}
    yield out
    path = Path(os.environ.get("SPECCONSOLE_VLLM_FIGURES") or lane_dir / "lane-figures.json")
    path.write_text(json.dumps(out, indent=1, sort_keys=True))


@pytest.fixture
def sweep() -> Iterator[list[str]]:
    """Backstop: whatever a test's runs left is killed by run id (the test already verified
    through `specconsole kill` that nothing is left; this only guards a failed test)."""
    run_ids: list[str] = []
    yield run_ids
    for run_id in run_ids:
        for pid in carriers(run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def via_ssh(ssh_server, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SPECCONSOLE_SSH_CONFIG", str(ssh_server.ssh_config))
    return ssh_server.alias


# -- a watched launch ---------------------------------------------------------------------------

class Watched:
    """A Supervisor on a launch, and every event it emitted with the time it arrived."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.sup = Supervisor(profile)
        self.events: list[tuple[float, Any]] = []
        self._queue = self.sup.subscribe()
        self._task: asyncio.Task[None] | None = None

    async def _collect(self) -> None:
        while True:
            event = await self._queue.get()
            self.events.append((time.time(), event))

    async def launch(self) -> str:
        self._task = asyncio.create_task(self._collect())
        run = await self.sup.launch()
        return run.run_id

    async def first(self, match: Callable[[Any], bool], timeout: float) -> tuple[float, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, event in self.events:
                if match(event):
                    return at, event
            await asyncio.sleep(0.02)
        seen = [type(e).__name__ for _, e in self.events[-20:]]
        raise AssertionError(f"timed out after {timeout}s; last events: {seen}")

    def of(self, kind: type) -> list[Any]:
        return [e for _, e in self.events if isinstance(e, kind)]

    def lines(self) -> list[str]:
        return [e.chunk.line(i).message for e in self.of(LinesAdded)
                for i in range(len(e.chunk))]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.sup.close()


@contextlib.asynccontextmanager
async def watched(profile: Profile, sweep: list[str]) -> AsyncIterator[Watched]:
    w = Watched(profile)
    try:
        yield w
    finally:
        if w.sup.run is not None:
            sweep.append(w.sup.run.run_id)
        await w.close()


async def specconsole(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI as a subprocess while this loop keeps serving the in-process SSH server."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tui", *args, cwd=ROOT, env=dict(os.environ),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return subprocess.CompletedProcess(list(args), proc.returncode or 0, out.decode(),
                                       err.decode())


async def kill_and_verify(w: Watched, pids: list[int]) -> None:
    """`specconsole kill` ends every process of the run (orphans too) and frees the port."""
    killed = await specconsole("kill", w.profile.path, "--grace", "10")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "no process of the run remains" in killed.stdout, killed.stdout
    assert w.sup.run is not None and carriers(w.sup.run.run_id) == []
    assert [p for p in pids if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE] == []
    assert port_free(w.profile.server.port)


def tree(w: Watched) -> dict[str, Any]:
    """The latest process snapshot as {name: ProcInfo} for the run's live processes."""
    snaps = w.of(ProcsSeen)
    assert snaps, "no process snapshot"
    return {p.name: p for p in snaps[-1].procs.procs if p.alive}


async def until_tree(w: Watched, names: tuple[str, ...], timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        procs = tree(w) if w.of(ProcsSeen) else {}
        if all(n in procs for n in names) or time.monotonic() > deadline:
            return procs
        await asyncio.sleep(0.2)


def complete(port: int, model: str, tokens: int = 16) -> dict[str, Any]:
    status, body = http(port, "/v1/completions", {
        "model": model, "prompt": "Hello world, the quick brown fox", "max_tokens": tokens,
        "temperature": 0, "ignore_eos": True})
    assert status == 200, body
    return json.loads(body)


# -- a. ready ---------------------------------------------------------------------------------

def keep_log(w: Watched, lane_dir: Path, name: str) -> None:
    """The run's real log, kept beside the figures: the source of tests/fixtures/vllm-real-*."""
    assert w.sup.run is not None
    (lane_dir / "logs").mkdir(exist_ok=True)
    (lane_dir / "logs" / name).write_bytes((Path(w.sup.run.run_dir) / "server.log").read_bytes())


async def check_spec_decoding(w: Watched, requests: int = 4) -> dict[str, Any]:
    """After a few requests, /metrics' spec-decode counters and the `SpecDecoding metrics:`
    lines parse with tui.core.acceptance and agree with each other."""
    port, model = w.profile.server.port, str(w.profile.server.model)
    for _ in range(requests):
        complete(port, model)
    spec = w.profile.server.speculative
    assert spec is not None and spec.num_speculative_tokens == 3
    deadline = time.monotonic() + 40  # vLLM logs its stats every 10 s
    while True:
        status, text = http(port, "/metrics")
        assert status == 200
        totals = parse_totals(text)
        intervals = [i for m in w.lines() if (i := parse_interval(m)) is not None]
        logged = sum(i.drafted for i in intervals)
        if totals is not None and totals.draft_tokens and logged == totals.draft_tokens:
            break
        assert time.monotonic() < deadline, f"log says {logged} drafted, /metrics {totals}"
        await asyncio.sleep(1)
    assert totals.drafts > 0 and totals.draft_tokens == 3 * totals.drafts
    assert len(totals.accepted_per_position) == 3
    assert sum(i.accepted for i in intervals) == totals.accepted_tokens
    assert all(len(i.per_position) == 3 for i in intervals)
    assert w.sup.machine.spec_decode == intervals[-1]
    return {"drafts": totals.drafts, "draft tokens": totals.draft_tokens,
            "accepted": totals.accepted_tokens}


PROBE_LINE = re.compile(rb'127\.0\.0\.1:\d+ - "GET /(?:health|metrics|v1/models) HTTP')
SERVING_WINDOW_S = 60.0


async def check_serving(w: Watched) -> dict[str, Any]:
    """A minute of READY under real traffic (two clients sending completions back to back):
    the serving readout shows requests running, generation throughput and the spec-decode
    acceptance from /metrics, while specconsole's own probes write at most 12 access-log lines
    to the server's log. The test's own traffic is POSTs only, so every GET counted here is a
    probe of specconsole's."""
    assert w.sup.run is not None
    log = Path(w.sup.run.run_dir) / "server.log"
    port, model = w.profile.server.port, str(w.profile.server.model)
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            complete(port, model, tokens=48)

    start, seen_before = log.stat().st_size, len(w.of(ServingSeen))
    clients = [threading.Thread(target=client, daemon=True) for _ in range(2)]
    for c in clients:
        c.start()
    try:
        await asyncio.sleep(SERVING_WINDOW_S)
    finally:
        stop.set()
        for c in clients:
            await asyncio.to_thread(c.join, 120)
    written = log.read_bytes()[start:]
    probes = len(PROBE_LINE.findall(written))
    samples = [e.sample for e in w.of(ServingSeen)[seen_before:]]
    assert probes <= 12, f"{probes} probe lines in {SERVING_WINDOW_S:.0f} s of READY"
    assert samples and all(s.source == "metrics" for s in samples), samples
    assert max(s.running or 0 for s in samples) > 0, samples
    assert max(s.gen_tps or 0 for s in samples) > 0, samples
    assert any(s.spec_acceptance is not None for s in samples), samples
    assert any(s.kv_usage is not None for s in samples), samples
    assert w.sup.machine.serving.latest == samples[-1]
    return {"probe lines a minute": probes, "readings": len(samples),
            "max running": max(s.running or 0 for s in samples),
            "max gen tok/s": round(max(s.gen_tps or 0 for s in samples), 1),
            "acceptance": [round(s.spec_acceptance, 3) for s in samples
                           if s.spec_acceptance is not None]}


async def _ready_then_kill(w: Watched, figures: dict[str, Any], key: str,
                           spec: bool = False) -> Watched:
    run_id = await w.launch()
    watch = DeathWatch(run_id).start()
    try:
        at, ready = await w.first(lambda e: isinstance(e, Ready), READY_TIMEOUT)
        figures[f"{key}: launch to READY (s)"] = round(ready.took, 1)
        port = w.profile.server.port
        assert http(port, "/health")[0] == 200  # READY is what /health says, checked again

        # then READY; uvicorn's "Application startup complete" races /health, and a line that
        # arrives after READY starts no phase
        phases = [e.phase for e in w.of(PhaseChanged)]
        assert phases in (STARTUP_PHASES, STARTUP_PHASES[:-1]), [str(p) for p in phases]
        versions = {hit.version for e in w.of(LinesAdded) for i in range(len(e.chunk))
                    if (hit := detect_phase(e.chunk.line(i))) is not None and hit.version}
        assert versions == {"0.32.0"}  # the banner and the engine line agree
        weights_done = [e for e in w.of(ProgressChanged)
                        if e.phase is Phase.WEIGHTS and e.progress == 1.0]
        assert weights_done, "no 'weights loaded' (Loading weights took …)"
        api_phase = next(t for t, e in w.events
                         if isinstance(e, PhaseChanged) and e.phase is Phase.API_SERVER)
        assert at >= api_phase

        procs = await until_tree(w, ("APIServer", "EngineCore", "Worker"))
        api, core, worker = procs["APIServer"], procs["EngineCore"], procs["Worker"]
        assert api.pid == w.sup.run.pid
        assert core.ppid == api.pid and worker.ppid == core.pid
        assert psutil.Process(core.pid).cmdline()[0].startswith("VLLM::EngineCore")
        assert psutil.Process(worker.pid).cmdline()[0].startswith("VLLM::Worker")

        answer = complete(port, str(w.profile.server.model))
        assert answer["usage"]["completion_tokens"] == 16
        assert isinstance(answer["choices"][0]["text"], str)
        if spec:
            figures[f"{key}: serving, a minute of two clients"] = await check_serving(w)
            figures[f"{key}: spec decoding after 5 requests"] = await check_spec_decoding(w)
        assert watch.deaths.keys().isdisjoint({api.pid, core.pid, worker.pid})
        await kill_and_verify(w, [api.pid, core.pid, worker.pid])
    finally:
        watch.stop()
    return w


async def test_ready_locally_serves_speculative_decoding_then_kill_leaves_nothing(
        tmp_path: Path, scratch: Path, lane_dir: Path, figures: dict[str, Any],
        sweep: list[str]) -> None:
    profile = lane_profile(tmp_path, "vllm-ready", scratch)
    async with watched(profile, sweep) as w:
        await _ready_then_kill(w, figures, "ready, local", spec=True)
        keep_log(w, lane_dir, "vllm-real-startup.log")


async def test_ready_over_ssh_then_kill_leaves_nothing(tmp_path: Path, scratch: Path,
                                                      via_ssh: str, figures: dict[str, Any],
                                                      sweep: list[str]) -> None:
    profile = lane_profile(tmp_path, "vllm-ready-ssh", scratch, target=via_ssh)
    async with watched(profile, sweep) as w:
        await _ready_then_kill(w, figures, "ready, ssh")


# -- b. the story: a broken import in a patched model module ------------------------------------

async def _story(w: Watched, figures: dict[str, Any], key: str, patched: Path, line: int,
                 server_only: bool) -> tuple[Died, str]:
    """DEAD within 1 s of the first death (of vLLM's own processes when `server_only`: a model
    inspection that ended cleanly before is no death); the SyntaxError (file, line) is the
    cause within that second and stays so; the timeline ends, failed, in the phase of death.
    Returns the Died event and the first dead process's command line."""
    run_id = await w.launch()
    watch = DeathWatch(run_id).start()
    try:
        died_at, died = await w.first(lambda e: isinstance(e, Died), READY_TIMEOUT)
        deadline = time.monotonic() + 60  # vLLM ends itself: the rest dies in a few seconds
        while carriers(run_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        watch.stop()
    first = watch.first_death(server_only)
    assert first is not None, watch.deaths
    pid, cmdline, first_at = first
    figures[f"{key}: launch to DEAD (s)"] = round(died.death.since_launch, 1)
    figures[f"{key}: first death to DEAD event (ms)"] = round((died_at - first_at) * 1000)
    assert died.death.pid == pid, (died.death, cmdline)
    assert died_at - first_at < 1.0

    expected = f"({patched}, line {line})"
    causes = [(at, e.death.cause) for at, e in w.events if isinstance(e, (Died, CauseUpdated))]
    for _, cause in causes:
        assert cause is None or "Engine core initialization failed" not in cause.line
    in_time = [c for at, c in causes if at - first_at < 1.0 and c is not None]
    assert in_time and in_time[-1].line.startswith("SyntaxError: trailing comma not allowed")
    assert in_time[-1].line.endswith(expected), in_time[-1].line
    final = w.sup.machine.death
    assert final is not None and final.cause is not None and final.cause.line == in_time[-1].line

    timeline = w.sup.machine.timeline
    assert timeline is not None and timeline.spans[-1].failed
    assert died.death.phase is timeline.spans[-1].phase is Phase.CONFIG
    return died, cmdline


async def test_story_engine_imports_the_broken_module_over_ssh(
        tmp_path: Path, scratch: Path, lane_dir: Path, via_ssh: str, figures: dict[str, Any],
        sweep: list[str]) -> None:
    patched, line = patched_llama(lane_dir / "venv", tmp_path / "patch")
    profile = lane_profile(tmp_path, "vllm-story-engine", scratch, target=via_ssh,
                           env=shadow_env(patched, "engine"))
    async with watched(profile, sweep) as w:
        died, _ = await _story(w, figures, "story, engine imports it (ssh)", patched, line,
                               server_only=True)
        assert died.death.process in ("VllmWorker-0", "Worker", "EngineCore")
        keep_log(w, lane_dir, "vllm-real-crash.log")
        await kill_and_verify(w, [])


async def test_story_api_server_inspection_hits_it_first_locally(
        tmp_path: Path, lane_dir: Path, figures: dict[str, Any], sweep: list[str]) -> None:
    patched, line = patched_llama(lane_dir / "venv", tmp_path / "patch")
    # a cold modelinfo cache of its own: the API server inspects the model in a subprocess
    profile = lane_profile(tmp_path, "vllm-story-api", tmp_path / "scratch",
                           env=shadow_env(patched, "all"))
    async with watched(profile, sweep) as w:
        died, cmdline = await _story(w, figures, "story, API server inspection (local)",
                                     patched, line, server_only=False)
        # the inspection subprocess fails first (exit 1): a death, though not a vLLM role
        assert "vllm.model_executor.models.registry" in cmdline
        assert died.death.code == 1 and died.death.process == "model inspection"
        keep_log(w, lane_dir, "vllm-real-crash-inspection.log")
        await kill_and_verify(w, [])


# -- c. the engine killed while serving --------------------------------------------------------

async def test_engine_killed_while_serving_is_dead_although_vllm_exits_0(
        tmp_path: Path, scratch: Path, lane_dir: Path, figures: dict[str, Any],
        sweep: list[str]) -> None:
    profile = lane_profile(tmp_path, "vllm-engine-killed", scratch)
    async with watched(profile, sweep) as w:
        await w.launch()
        _, ready = await w.first(lambda e: isinstance(e, Ready), READY_TIMEOUT)
        figures["engine killed: launch to READY (s)"] = round(ready.took, 1)
        procs = await until_tree(w, ("APIServer", "EngineCore", "Worker"))
        core, api = procs["EngineCore"], procs["APIServer"]
        killed_at = time.time()
        os.kill(core.pid, signal.SIGKILL)
        died_at, died = await w.first(lambda e: isinstance(e, Died), 10)
        figures["engine killed: SIGKILL to DEAD event (ms)"] = round((died_at - killed_at) * 1000)
        assert died_at - killed_at < 1.0
        assert died.death.pid == core.pid and died.death.process == "EngineCore"
        exit_json = Path(w.sup.run.run_dir) / "exit.json"
        deadline = time.monotonic() + 60
        while not exit_json.exists():
            assert time.monotonic() < deadline, "the API server did not exit"
            await asyncio.sleep(0.2)
        assert json.loads(exit_json.read_text())["code"] == 0  # vLLM's exit code lies
        assert w.sup.machine.death is not None and w.sup.machine.death.pid == core.pid
        keep_log(w, lane_dir, "vllm-real-engine-killed.log")
        await kill_and_verify(w, [api.pid, core.pid])


# -- d. orphans: only the API server killed ------------------------------------------------------

async def test_api_server_killed_leaves_orphans_that_kill_ends_over_ssh(
        tmp_path: Path, scratch: Path, via_ssh: str, figures: dict[str, Any],
        sweep: list[str]) -> None:
    profile = lane_profile(tmp_path, "vllm-orphans", scratch, target=via_ssh)
    async with watched(profile, sweep) as w:
        await w.launch()
        _, ready = await w.first(lambda e: isinstance(e, Ready), READY_TIMEOUT)
        figures["API server killed (ssh): launch to READY (s)"] = round(ready.took, 1)
        procs = await until_tree(w, ("APIServer", "EngineCore", "Worker"))
        api, core, worker = procs["APIServer"], procs["EngineCore"], procs["Worker"]
        killed_at = time.time()
        os.kill(api.pid, signal.SIGKILL)
        died_at, died = await w.first(lambda e: isinstance(e, Died), 10)
        figures["API server killed: SIGKILL to DEAD event (ms)"] = round(
            (died_at - killed_at) * 1000)
        assert died_at - killed_at < 1.0
        assert died.death.pid == api.pid and died.death.process == "APIServer"
        await asyncio.sleep(3)
        orphans = [p.pid for p in (core, worker) if psutil.pid_exists(p.pid)
                   and psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE]
        assert orphans == [core.pid, worker.pid], "vLLM no longer leaves orphans?"
        await kill_and_verify(w, [api.pid, core.pid, worker.pid])


# -- e. more real failures (issue 17): each named by what real vLLM printed ---------------------

def _args(old: str, new: str) -> Callable[[str], str]:
    """A profile edit: one of the server's arguments changed."""
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)
    return edit


async def _dies(w: Watched, figures: dict[str, Any], key: str) -> Died:
    """The launch's DEAD (within the lane's patience), recorded; the run ends by itself."""
    run_id = await w.launch()
    _, died = await w.first(lambda e: isinstance(e, Died), READY_TIMEOUT)
    await _settle(w)
    figures[f"{key}: launch to DEAD (s)"] = round(died.death.since_launch, 1)
    deadline = time.monotonic() + 60
    while carriers(run_id) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return died


async def _settle(w: Watched, seconds: float = 2.0) -> None:
    """Lines in flight when the process died sharpen the cause (CauseUpdated)."""
    await asyncio.sleep(seconds)


async def test_a_max_model_len_the_engine_rejects_is_dead_with_its_whole_reason(
        tmp_path: Path, scratch: Path, lane_dir: Path, figures: dict[str, Any],
        sweep: list[str]) -> None:
    profile = lane_profile(tmp_path, "vllm-max-model-len", scratch,
                           edit=_args('"--max-model-len", "256"', '"--max-model-len", "100000"'))
    async with watched(profile, sweep) as w:
        died = await _dies(w, figures, "config refused (max_model_len)")
        death = w.sup.machine.death
        assert death is not None and death.cause is not None
        assert (died.death.process, died.death.code) == ("APIServer", 1)
        assert death.cause.line.startswith(
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig "
            "— Value error, User-specified max_model_len (100000) is greater than the derived "
            "max_model_len"), death.cause.line  # the header and its reason
        assert death.cause.kind is not None and death.cause.kind.id == "config"
        keep_log(w, lane_dir, "vllm-real-config-refused.log")
        await kill_and_verify(w, [])


async def test_a_kv_cache_too_small_for_one_request_is_dead_naming_it(
        tmp_path: Path, scratch: Path, lane_dir: Path, figures: dict[str, Any],
        sweep: list[str]) -> None:
    def edit(text: str) -> str:
        text = _args('"--max-model-len", "256"', '"--max-model-len", "10000000"')(text)
        return text.replace("[server.env]\n", '[server.env]\nVLLM_ALLOW_LONG_MAX_MODEL_LEN = "1"\n',
                            1)
    profile = lane_profile(tmp_path, "vllm-kv-cache", scratch, edit=edit)
    async with watched(profile, sweep) as w:
        died = await _dies(w, figures, "KV cache too small")
        cause = w.sup.machine.death.cause if w.sup.machine.death else None
        assert cause is not None and cause.process == "EngineCore"
        assert cause.line.startswith("ValueError: To serve at least one request with the "
                                     "model's max seq len (10000000)"), cause.line
        assert cause.kind is not None and cause.kind.id == "kv_cache"
        assert died.death.phase is Phase.KV_CACHE
        keep_log(w, lane_dir, "vllm-real-kv-cache.log")
        await kill_and_verify(w, [])


async def test_a_drafter_that_does_not_fit_the_target_dies_loading_it(
        tmp_path: Path, scratch: Path, lane_dir: Path, figures: dict[str, Any],
        sweep: list[str]) -> None:
    drafter = tmp_path / "eagle3-for-another-target"
    shutil.copytree(lane_dir / "models" / "tiny-eagle3", drafter)
    config = json.loads((drafter / "config.json").read_text())
    config["target_hidden_size"] = 2 * config["hidden_size"]  # built for a wider target
    (drafter / "config.json").write_text(json.dumps(config))
    profile = lane_profile(tmp_path, "vllm-bad-drafter", scratch,
                           edit=lambda t: re.sub(r'(?m)^model = ".*tiny-eagle3"$',
                                                 f'model = "{drafter}"', t))
    async with watched(profile, sweep) as w:
        died = await _dies(w, figures, "drafter misfit")
        cause = w.sup.machine.death.cause if w.sup.machine.death else None
        assert cause is not None and cause.line.startswith(
            "AssertionError: Tried to load weights of size"), cause.line
        assert died.death.phase is Phase.DRAFTER
        keep_log(w, lane_dir, "vllm-real-drafter-misfit.log")
        await kill_and_verify(w, [])


async def test_the_port_taken_by_another_program_preflight_names_it_else_the_bind_error(
        tmp_path: Path, scratch: Path, lane_dir: Path, figures: dict[str, Any],
        sweep: list[str]) -> None:
    holder = socket.socket()  # another program, listening on the server's port
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    refused = lane_profile(tmp_path, "vllm-port-refused", scratch, port=port)
    checked = await specconsole("launch", refused.path)
    assert checked.returncode == 6, checked.stdout + checked.stderr  # preflight refused
    said = checked.stdout + checked.stderr
    assert f"port {port} is not free" in said and f"pid {os.getpid()}" in said, said
    unchecked = lane_profile(tmp_path, "vllm-port-taken", scratch, port=port,
                             edit=lambda t: t.replace("[preflight]\n",
                                                      "[preflight]\nport_free = false\n", 1))
    try:
        async with watched(unchecked, sweep) as w:
            died = await _dies(w, figures, "port taken, preflight off")
            cause = w.sup.machine.death.cause if w.sup.machine.death else None
            assert died.death.process == "APIServer"
            assert cause is not None and "Address already in use" in cause.line, cause
            assert cause.kind is not None and cause.kind.id == "port"
            keep_log(w, lane_dir, "vllm-real-port-taken.log")
            holder.close()  # the port is the server's again: the kill must leave it free
            await kill_and_verify(w, [])
    finally:
        holder.close()


# -- f. a hang (issue 16): the engine core frozen while it loads --------------------------------

async def test_engine_core_frozen_mid_load_is_stalled_naming_it_with_vllms_stacks(
        tmp_path: Path, scratch: Path, figures: dict[str, Any], sweep: list[str]) -> None:
    profile = lane_profile(tmp_path, "vllm-frozen", scratch,
                           edit=lambda t: t.replace('stall_timeout = "2m"',
                                                    'stall_timeout = "30s"', 1))
    async with watched(profile, sweep) as w:
        await w.launch()
        await w.first(lambda e: isinstance(e, PhaseChanged) and e.phase is Phase.WEIGHTS,
                      READY_TIMEOUT)
        procs = await until_tree(w, ("EngineCore", "Worker"))
        core = procs["EngineCore"]
        frozen_at = time.time()
        os.kill(core.pid, signal.SIGSTOP)
        stalled_at, stalled = await w.first(lambda e: isinstance(e, Stalled), 120)
        figures["engine core frozen: SIGSTOP to STALLED (s)"] = round(stalled_at - frozen_at, 1)
        first = stalled.suspects[0]
        assert (first.name, first.pid) == ("EngineCore", core.pid), stalled.suspects
        assert "is stopped" in first.words()
        _, taken = await w.first(lambda e: isinstance(e, StacksTaken), 120)
        stacks = {s.name: s for s in taken.stacks}
        frozen = stacks["EngineCore"]
        assert frozen.error is None and frozen.state == "stopped"
        where = frozen.stuck_in()
        assert where is not None and where.engine and "vllm/" in where.path, frozen
        worker = stacks["Worker"]
        assert worker.error is None and any(f.engine for t in worker.threads for f in t.frames)
        figures["engine core frozen: stacks"] = [s.summary() for s in taken.stacks]
        await kill_and_verify(w, [core.pid, procs["Worker"].pid])  # k cleans a stopped run


# -- g. vLLM's native multi-node (issue 17): two nodes, TP 2, one of them headless ---------------

def two_node_profile(tmp: Path, scratch: Path, lane_dir: Path, worker_host: str) -> Profile:
    """TP 2 over two "hosts": this machine as the head (node 0, API server) and the in-process
    SSH server as node 1 (`--headless`), both at 127.0.0.1; vLLM's own `--nnodes` launch."""
    venv = lane_dir / "venv"
    hosts = "".join(
        f'[[hosts]]\nrole = "{role}"\ntarget = "{target}"\naddress = "127.0.0.1"\n'
        f'python = "{venv / "bin" / "python"}"\nruns_dir = "{tmp / "runs"}"\n\n'
        for target, role in (("local", "head"), (worker_host, "worker")))
    path = tmp / "vllm-two-nodes.toml"
    path.write_text(f"""{hosts}[cluster]
backend = "native"
port = {free_port()}
join_timeout = "2m"

[server]
engine = "vllm"
model = "{lane_dir / "models" / "tiny-llama"}"
executable = ["{venv / "bin" / "vllm"}", "serve"]
port = {free_port()}
listen = "127.0.0.1"
tensor_parallel_size = 2
args = ["--max-model-len", "256", "--dtype", "float32", "--max-num-seqs", "4", "--enforce-eager"]

[server.env]
HF_HUB_OFFLINE = "1"
TRANSFORMERS_OFFLINE = "1"
VLLM_TARGET_DEVICE = "cpu"
VLLM_CPU_KVCACHE_SPACE = "1"
TMPDIR = "{scratch / "tmp"}"
VLLM_CACHE_ROOT = "{scratch / "cache"}"
TORCHINDUCTOR_CACHE_DIR = "{scratch / "inductor"}"

[preflight]
gpus_free = false

[expect]
load_time = "2m"
""")
    for sub in ("tmp", "cache", "inductor"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    return load_profile(path)


async def test_native_two_nodes_join_by_vllms_headless_line_serve_and_a_killed_worker_is_dead(
        tmp_path: Path, scratch: Path, lane_dir: Path, via_ssh: str, figures: dict[str, Any],
        sweep: list[str]) -> None:
    group = ClusterRun(two_node_profile(tmp_path, scratch, lane_dir, via_ssh))
    events = group.subscribe()
    seen: list[Any] = []
    try:
        started = time.monotonic()
        await group.start()
        sweep.extend(s.run.run_id for s in group.sups.values() if s.run is not None)
        await until_event(events, lambda e: isinstance(e, MemberEvent) and e.member == "server"
                          and isinstance(e.event, Ready), READY_TIMEOUT, "READY", seen)
        figures["native 2 nodes: launch to READY (s)"] = round(time.monotonic() - started, 1)
        joined = [e for e in seen if isinstance(e, Joined)]
        assert [j.member for j in joined] == ["node-1"]
        figures["native 2 nodes: node-1 joined after (s)"] = round(joined[0].after, 1)
        node = group.sups["node-1"]
        assert node.run is not None
        log = (Path(node.run.run_dir) / "server.log").read_text(errors="replace").splitlines()
        joins = [i for i, line in enumerate(log) if HEADLESS_JOINED.search(line)]
        ranks = [i for i, line in enumerate(log) if "is assigned as" in line]
        assert joins and ranks and joins[0] < ranks[0], "the join is vLLM's own headless line"
        port = group.server.profile.server.port
        answer = complete(port, str(group.server.profile.server.model))
        assert answer["usage"]["completion_tokens"] == 16
        workers = [p for p in psutil.Process(node.run.pid).children(recursive=True)
                   if p.cmdline()[:1] and p.cmdline()[0].startswith("VLLM::Worker")]
        assert len(workers) == 1, workers  # TP 2 over 2 nodes: one rank here
        victim = workers[0].pid
        watch = DeathWatch(node.run.run_id).start()  # the kernel's word, independent of ours
        while victim not in watch.names:
            await asyncio.sleep(0.05)
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        died = await until_event(events, lambda e: isinstance(e, RunDied), 10, "DEAD", seen)
        dead_at = time.time()
        deadline = time.monotonic() + 10
        while victim not in watch.deaths and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        watch.stop()
        exited = watch.deaths[victim]  # the moment its pidfd said so: the exit is complete
        figures["native 2 nodes: the run's death"] = died.death.summary()
        figures["native 2 nodes: SIGKILL of node-1's worker to its exit (pidfd, ms)"] = round(
            (exited - killed_at) * 1000)
        dead_ms = round((dead_at - exited) * 1000)
        # the signal when the agent read the zombie before vLLM's node process reaped it,
        # else unknown (the agent is not the worker's parent): never another code
        assert (died.member, died.death.pid) == ("node-1", victim), died
        assert died.death.signal in (9, None) and died.death.code is None, died
        figures["native 2 nodes: node-1's worker's exit to the run's DEAD (ms)"] = dead_ms
        assert dead_ms < 1000
        found = group.death()
        assert found is not None and found[1].pid == victim
        assert found[1].cause is None, "the head's errors about its lost peer are symptoms"
        kill_started = time.monotonic()
        killed = await group.kill(grace=10)
        figures["native 2 nodes: kill (s)"] = round(time.monotonic() - kill_started, 1)
        assert not any(k.remaining for k in killed.values()), killed
        assert all(carriers(s.run.run_id) == [] for s in group.sups.values() if s.run)
        assert port_free(port)
    finally:
        await group.close()


# -- h. in a docker container (issue 27): the same vLLM, mounted into the container lane's image --

def boxed_profile(tmp: Path, name: str, scratch: Path, lane_dir: Path,
                  env: dict[str, str] | None = None, mounts: tuple[Path, ...] = ()) -> Profile:
    """The lane's profile with [container]: `vllm serve` runs in a docker container whose
    processes are host processes in their own pid namespace (see vllm_lane.lane.in_container)."""
    return lane_profile(tmp, name, scratch, env=env,
                        edit=in_container(lane_dir / "venv", lane_dir / "models", scratch,
                                          *mounts))


@pytest.fixture
def docker_lane(sweep: list[str]) -> Iterator[None]:
    """The container lane's image, made by the lane's setup (its absence fails, never skips);
    afterwards every container of the test's runs is removed, whatever happened (a backstop:
    the tests verify that `specconsole kill` left none)."""
    found = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, text=True)
    if found.returncode != 0:
        pytest.fail(f"no image {IMAGE} (run `python3 -m tui.bootstrap vllm`): "
                    f"{found.stderr.strip()}")
    yield
    for run_id in sweep:
        for cid in containers_of(run_id):
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60)


async def boxed_ready(w: Watched, figures: dict[str, Any], key: str) -> dict[str, Any]:
    """Launch, READY (then /health from the host through the published port), the tree of
    vLLM's processes each seen with its pid inside the container, and a completion answered."""
    await w.launch()
    _, ready = await w.first(lambda e: isinstance(e, Ready), READY_TIMEOUT)
    figures[f"{key}: launch to READY (s)"] = round(ready.took, 1)
    assert w.sup.run is not None and len(containers_of(w.sup.run.run_id)) == 1
    assert http(w.profile.server.port, "/health")[0] == 200
    procs = await until_tree(w, ("APIServer", "EngineCore", "Worker"))
    api, core, worker = procs["APIServer"], procs["EngineCore"], procs["Worker"]
    assert core.ppid == api.pid and worker.ppid == core.pid
    for p in (api, core, worker):  # a host pid, and the container's own (its init is 1)
        assert p.cpid is not None and 1 < p.cpid != p.pid, p
    assert psutil.Process(worker.pid).cmdline()[0].startswith("VLLM::Worker")
    answer = complete(w.profile.server.port, str(w.profile.server.model))
    assert answer["usage"]["completion_tokens"] == 16
    return procs


async def kill_boxed(w: Watched, pids: list[int]) -> None:
    """`specconsole kill` leaves no process of the run and no container of it."""
    await kill_and_verify(w, pids)
    assert w.sup.run is not None and containers_of(w.sup.run.run_id) == []


async def test_in_a_container_ready_serves_then_kill_leaves_no_container_and_no_process(
        tmp_path: Path, scratch: Path, lane_dir: Path, figures: dict[str, Any], sweep: list[str],
        docker_lane: None) -> None:
    profile = boxed_profile(tmp_path, "vllm-boxed-ready", scratch, lane_dir)
    async with watched(profile, sweep) as w:
        procs = await boxed_ready(w, figures, "ready, in a container")
        await kill_boxed(w, [p.pid for p in procs.values()])


async def test_in_a_container_a_worker_sigkilled_from_the_host_is_dead_with_both_pids(
        tmp_path: Path, scratch: Path, lane_dir: Path, figures: dict[str, Any], sweep: list[str],
        docker_lane: None) -> None:
    profile = boxed_profile(tmp_path, "vllm-boxed-worker-killed", scratch, lane_dir)
    async with watched(profile, sweep) as w:
        procs = await boxed_ready(w, figures, "worker killed, in a container")
        worker = procs["Worker"]
        killed_at = time.time()
        os.kill(worker.pid, signal.SIGKILL)  # its host pid
        died_at, died = await w.first(lambda e: isinstance(e, Died), 10)
        figures["worker killed, in a container: SIGKILL to DEAD event (ms)"] = round(
            (died_at - killed_at) * 1000)
        assert died_at - killed_at < 1.0
        death = died.death
        assert (death.process, death.pid, death.cpid) == ("Worker", worker.pid, worker.cpid)
        # the signal when the agent read the zombie before the engine core reaped it, else
        # unknown (the agent is not its parent): never another code
        assert death.signal in (9, None) and death.code is None, death
        assert f"Worker (pid {worker.pid}, {worker.cpid} in the container) died" in \
            death.summary()
        figures["worker killed, in a container: DEAD"] = death.summary()
        await kill_boxed(w, [p.pid for p in procs.values()])


async def test_in_a_container_the_story_is_dead_naming_vllms_process_and_its_syntax_error(
        tmp_path: Path, scratch: Path, lane_dir: Path, figures: dict[str, Any], sweep: list[str],
        docker_lane: None) -> None:
    patched, line = patched_llama(lane_dir / "venv", tmp_path / "patch")
    profile = boxed_profile(tmp_path, "vllm-boxed-story", scratch, lane_dir,
                            env=shadow_env(patched, "engine"), mounts=(SHADOW_DIR, patched.parent))
    async with watched(profile, sweep) as w:
        died, _ = await _story(w, figures, "story, engine imports it (in a container)", patched,
                               line, server_only=True)
        death = died.death
        assert death.process in ("VllmWorker-0", "Worker", "EngineCore"), death
        assert death.cpid is not None and 1 < death.cpid != death.pid, death
        assert f"(pid {death.pid}, {death.cpid} in the container)" in death.summary()
        cause = w.sup.machine.death.cause  # the SyntaxError (checked by _story), raised by
        # the worker: its own line, prefixed with its pid inside the container
        assert (cause.process, cause.pid) == (death.process, death.cpid), cause
        figures["story, engine imports it (in a container): DEAD"] = [
            death.summary(), f"{cause.process} pid {cause.pid}: {cause.line}"]
        keep_log(w, lane_dir, "vllm-real-crash-container.log")
        await kill_boxed(w, [])


# -- i. inside a Slurm job (issue 34): the lane's cluster (tests/slurm/slurmlab.py) -------------

SLURM_TABLE = """
[slurm]
partition = "batch"
time = "10"
job_name = "vllm"
mem = "6G"  # the lane's cgroups enforce it: the default (DefMemPerCPU, 400 MB) OOM-kills vLLM
"""


@pytest.fixture
def slurm_jobs() -> Iterator[tuple[Cluster, list[str]]]:
    """The lane's cluster (`bootstrap vllm` starts it as the Slurm lane does) and the jobs a
    test submits, cancelled after it."""
    cluster = lane_cluster()
    ids: list[str] = []
    yield cluster, ids
    end_jobs(cluster, ids)


async def test_inside_a_slurm_job_ready_then_a_worker_killed_is_dead_in_vllms_own_words(
        tmp_path: Path, scratch: Path, figures: dict[str, Any], sweep: list[str],
        slurm_jobs: tuple[Cluster, list[str]]) -> None:
    """Real `vllm serve` as a job of the lane's cluster, on the node the scheduler picks (its
    network namespace), reached as a step of the job: READY, then its worker SIGKILLed: DEAD
    naming it, the cause lines vLLM's own, never the scheduler's; kill is scancel's."""
    cluster, jobs = slurm_jobs
    profile = lane_profile(tmp_path, "vllm-slurm", scratch, edit=lambda text: text + SLURM_TABLE)
    async with watched(profile, sweep) as w:
        started = time.monotonic()
        await w.launch()
        assert w.sup.job is not None and w.sup.job.node is not None
        jobs.append(w.sup.job.job_id)
        await w.first(lambda e: isinstance(e, Ready), READY_TIMEOUT)
        figures["in a Slurm job: submit to READY (s)"] = round(time.monotonic() - started, 1)
        api = w.sup.run.pid
        assert os.readlink(f"/proc/{api}/ns/net") == os.readlink(
            f"/proc/{cluster.slurmd_pid(w.sup.job.node)}/ns/net"), "not on the job's node"
        worker = (await until_tree(w, ("APIServer", "EngineCore", "Worker")))["Worker"]
        killed_at = time.time()
        os.kill(worker.pid, signal.SIGKILL)
        died_at, died = await w.first(lambda e: isinstance(e, Died), 10)
        figures["in a Slurm job: worker SIGKILL to DEAD (ms)"] = round(
            (died_at - killed_at) * 1000)
        assert died.death.pid == worker.pid and died.death.ended_by is None
        await _settle(w, 3.0)
        death = w.sup.machine.death
        assert death is not None and death.process == "Worker"
        said = death_lines(death)
        log = (Path(w.sup.run.run_dir) / "server.log").read_text(errors="replace")
        if "died unexpectedly (exit code: None)" in log and death.signal is None:
            # seen once in CI-like runs: vLLM's executor read the worker's exit before it was
            # reaped, and its parent reaped it before the agent on the node read it: nobody
            # can know the signal, and specconsole invents none
            assert death.code is None and said[1].startswith("root cause: not found in the log")
            figures["in a Slurm job: the worker's exit status"] = "unknown (vLLM: None)"
        else:
            assert death.signal == 9, death
            assert said[1].startswith("root cause: killed by SIGKILL from outside the process")
        # the lines that tell it are vLLM's own, word for word from its log: its executor's
        # report of the worker's death first, then the engine's and the API server's ends
        symptoms = w.sup.machine.tracker.symptoms
        assert symptoms and all(symptom in log for symptom in symptoms), symptoms
        assert symptoms[0].startswith("Worker proc VllmWorker-0 died unexpectedly"), symptoms
        assert any("EngineDeadError" in symptom for symptom in symptoms), symptoms
        figures["in a Slurm job: the death"] = [*said, *(f"symptom: {s}" for s in symptoms)]
        await w.sup.kill(10.0)
        assert carriers(w.sup.run.run_id) == []
        assert w.sup.job.end is not None and w.sup.job.end.state in ("CANCELLED", "COMPLETED")
