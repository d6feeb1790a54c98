"""SGLang as the second engine: the profile and its argv, the log rules (line anatomy, phases,
root cause, spec decode, process names) as tables, the simulated SGLang's real processes, and
the real Supervisor on it, locally and over SSH."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import alive, free_port, next_event, wait_for
from test_sim import Sim as VLLMSim
from test_sim import check_sequences, in_order

from tui.core.acceptance import SpecDecodeInterval, parse_interval
from tui.core.command import build_server_argv
from tui.core.errors import ProfileError
from tui.core.explain import explain
from tui.core.logline import parse_line
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.phases import Phase, PhaseHit, detect_phase
from tui.core.procnames import is_server_role
from tui.core.profile import load_profile, loads_profile
from tui.core.protocol import Health, ProcExit, ProcInfo, Procs, RunExit
from tui.core.rootcause import RootCauseTracker
from tui.core.state import Died, LaunchMachine, PhaseChanged, Ready, State
from tui.remote import launcher
from tui.remote.session import LocalSession
from tui.sim.demo import demo_profile
from tui.sim.failures import BROKEN_LINE
from tui.supervise.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent
STAMP = "[2025-08-04 10:10:06"
PATCHED = "/tmp/specconsole-sim-7/kimi_k25_patched.py"
SYNTAX = "SyntaxError: trailing comma not allowed without surrounding parentheses"
CAUSE = f"{SYNTAX} ({PATCHED}, line 15)"
SIGQUIT = "Received sigquit from a child process. It usually means the child failed."


def tag(text: str, rank: int | None = None) -> str:
    """An SGLang line: `[stamp TPn] text`, or `[stamp] text` without a rank."""
    return f"{STAMP}{'' if rank is None else f' TP{rank}'}] {text}"


def record(rank: int | None, *lines: str) -> list[str]:
    """SGLang's one-record failure: the first line tagged, the traceback after it untagged."""
    return [tag(f"Scheduler hit an exception: {lines[0]}", rank), *lines[1:], ""]


def syntax_record(rank: int | None) -> list[str]:
    return record(rank, "Traceback (most recent call last):",
                  '  File "/sglang/srt/managers/scheduler.py", line 2310, in run_scheduler_process',
                  "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)",
                  f'  File "{PATCHED}", line 15', f"    {BROKEN_LINE}", "    ^", SYNTAX)


OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 3 has a "
       "total capacity of 140.40 GiB of which 1.21 GiB is free.")
OOM_RECORD = record(3, "Traceback (most recent call last):",
                    '  File "/sglang/srt/model_loader/loader.py", line 381, in load_model',
                    "    model.load_weights(weights)", OOM)


# -- the profile and its argv ----------------------------------------------------------------

SGLANG = """[host]
target = "gpu-node-07"
[server]
engine = "sglang"
model = "/models/Kimi-K2.5"
tensor_parallel_size = 8
port = 30000
args = ["--mem-fraction-static", "0.85"]
"""
SPEC = """[server.speculative]
method = "eagle3"
model = "/models/Kimi-K2.5-eagle3"
"""


def test_sglang_argv_uses_the_hosts_python_and_sglangs_flags() -> None:
    profile = loads_profile(SGLANG + SPEC + "num_steps = 3\neagle_topk = 1\n"
                            "num_draft_tokens = 4\ntoken_map = \"/m/map.pt\"\n", "p.toml")
    assert build_server_argv(profile, "/venv/bin/python") == [
        "/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/Kimi-K2.5",
        "--host", "0.0.0.0", "--port", "30000", "--tp-size", "8",
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "/models/Kimi-K2.5-eagle3",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--speculative-token-map", "/m/map.pt",
        "--mem-fraction-static", "0.85"]


def test_an_explicit_executable_still_wins() -> None:
    profile = loads_profile(SGLANG.replace(
        'port = 30000', 'port = 30000\nexecutable = ["/opt/sgl/bin/python3", "-m", '
        '"sglang.launch_server"]') + '[server.speculative]\nmethod = "eagle"\nmodel = "/d"\n',
        "p.toml")
    argv = build_server_argv(profile, "python3")
    assert argv[:3] == ["/opt/sgl/bin/python3", "-m", "sglang.launch_server"]
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE"
    assert loads_profile(SGLANG.replace('"sglang"', '"vllm"'), "v.toml").server.executable \
        is None  # the engine's default is decided when the argv is built


def test_simulated_sglang_argv_selects_the_sglang_mode() -> None:
    profile = loads_profile(SGLANG + SPEC + '[simulate]\nscenario = "oom"\ngpus = 8\n', "p.toml")
    argv = build_server_argv(profile, "/venv/bin/python")
    assert argv[:5] == ["/venv/bin/python", "-m", "tui.sim.engine", "--sim-engine", "sglang"]
    assert argv[5:7] == ["--model-path", "/models/Kimi-K2.5"]
    assert argv[-6:] == ["--sim-scenario", "oom", "--sim-time-scale", "60.0", "--sim-gpus", "8"]
    sim = demo_profile("ready", 75.0, engine="sglang")
    assert sim.server.engine == "sglang" and sim.server.speculative.num_steps == 3


@pytest.mark.parametrize(("text", "key", "fragment"), [
    (SGLANG + '[server.speculative]\nmethod = "ngram"\n', "server.speculative.method",
     "method 'ngram' is vLLM's; with engine = \"sglang\" use one of: eagle3, eagle"),
    (SGLANG + SPEC + "num_speculative_tokens = 5\n", "server.speculative.num_speculative_tokens",
     "use num_steps, eagle_topk, num_draft_tokens"),
    (SGLANG.replace('"sglang"', '"vllm"') + SPEC + "num_speculative_tokens = 5\nnum_steps = 3\n",
     "server.speculative.num_steps", "num_steps is SGLang's (--speculative-num-steps)"),
    (SGLANG + SPEC + "eagle_topk = 0\n", "server.speculative.eagle_topk", "must be >= 1"),
    (SGLANG + SPEC + "extra = { a = 1 }\n", "server.speculative.extra",
     "expected a string or a number (passed as --speculative-extra), got a table"),
])
def test_engine_specific_speculative_keys_are_one_line_errors(tmp_path: Path, text: str,
                                                             key: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    message = str(caught.value)
    line = next(n for n, t in enumerate(text.splitlines(), 1)
                if t.startswith(key.rsplit(".", 1)[1] + " ="))
    assert "\n" not in message and fragment in message
    assert message.startswith(f"{path}:{line}: {key}: ")


async def test_preflight_looks_for_the_sglang_package(tmp_path: Path) -> None:
    profile = loads_profile(SGLANG.replace('"gpu-node-07"', '"local"') +
                            "[preflight]\ngpus_free = false\nport_free = false\n"
                            "paths_exist = false\n", tmp_path / "p.toml")
    session = LocalSession()
    try:
        checks = await launcher.preflight(session, profile)
    finally:
        await session.close()
    (check,) = [c for c in checks if c.check == "engine_package"]
    assert "'sglang'" in check.message or check.message.startswith("sglang:")


# -- line anatomy ------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "proc", "level", "message"), [
    (tag("Load weight begin. avail mem=139.78 GB", 3), "scheduler_TP3", None,
     "Load weight begin. avail mem=139.78 GB"),
    (f"{STAMP} DP1 TP3 EP3] Decode batch. #running-req: 1", "scheduler_DP1_TP3_EP3", None,
     "Decode batch. #running-req: 1"),
    (tag("server_args=ServerArgs(tp_size=1)"), None, None, "server_args=ServerArgs(tp_size=1)"),
    (tag("INFO:     Started server process [42]"), None, "INFO", "Started server process [42]"),
    ("sglang-1  | " + tag("Capture cuda graph begin.", 0), "scheduler_TP0", None,
     "Capture cuda graph begin."),
    ('  File "/x.py", line 3, in f', None, None, '  File "/x.py", line 3, in f'),
])
def test_line_anatomy(raw: str, proc: str | None, level: str | None, message: str) -> None:
    line = parse_line(raw)
    assert (line.proc, line.pid, line.level, line.message) == (proc, None, level, message)


# -- phases ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "hit"), [
    (tag("server_args=ServerArgs(model_path='/m', tp_size=8)"), PhaseHit(Phase.CONFIG)),
    (tag("Init torch distributed begin.", 0), PhaseHit(Phase.CONFIG)),
    (tag("Init torch distributed ends. mem usage=0.62 GB", 0), PhaseHit(Phase.CONFIG)),
    (tag("Load weight begin. avail mem=139.78 GB", 0),
     PhaseHit(Phase.WEIGHTS, detail="139.78 GB free")),
    ("Loading safetensors checkpoint shards:  50% Completed | 32/64 [10:00<10:00, 18.76s/it]",
     PhaseHit(Phase.WEIGHTS, 0.5, (32, 64))),
    (tag("Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=67.25 GB, "
         "mem usage=72.53 GB.", 0), PhaseHit(Phase.WEIGHTS, 1.0, detail="72.53 GB")),
    (tag("Load weight end. elapsed=0.38 s, type=Gemma, avail mem=286.63 GB, mem usage=0.63 GB.",
         0), PhaseHit(Phase.WEIGHTS, 1.0, detail="0.63 GB")),
    (tag("KV Cache is allocated. #tokens: 746008, K size: 24.41 GB, V size: 24.41 GB", 0),
     PhaseHit(Phase.KV_CACHE, detail="746008 tokens")),
    (tag("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 6247850, K size: 71.50 GB", 0),
     PhaseHit(Phase.KV_CACHE, detail="6247850 tokens")),
    (tag("Memory pool end. avail mem=18.43 GB", 0), PhaseHit(Phase.KV_CACHE, 1.0)),
    (tag("Capture cuda graph begin. This can take up to several minutes. avail mem=18.43 GB", 0),
     PhaseHit(Phase.CUDA_GRAPHS)),
    ("Capturing batches (bs=416 avail_mem=18.43 GB):  17%|█▋        | 6/36 [00:10<00:54, "
     "1.81s/it]", PhaseHit(Phase.CUDA_GRAPHS, 6 / 36)),
    (tag("Capture cuda graph end. Time elapsed: 65.00 s. mem usage=1.12 GB. avail mem=17.31 GB.",
         0), PhaseHit(Phase.CUDA_GRAPHS, 1.0, detail="65.00 s")),
    (tag("Capture piecewise CUDA graph end. Time elapsed: 12.50 s. mem usage=0.50 GB.", 0),
     PhaseHit(Phase.CUDA_GRAPHS, 1.0, detail="12.50 s")),
    (tag("Capture draft cuda graph begin. This can take up to several minutes.", 0),
     PhaseHit(Phase.CUDA_GRAPHS)),
    (tag("INFO:     Started server process [42]"), PhaseHit(Phase.API_SERVER)),
    (tag("INFO:     Waiting for application startup."), PhaseHit(Phase.API_SERVER)),
    (tag("INFO:     Application startup complete."), PhaseHit(Phase.API_SERVER)),
    (tag("INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)"),
     PhaseHit(Phase.API_SERVER, detail="http://0.0.0.0:30000")),
    (tag("The server is fired up and ready to roll!"), PhaseHit(Phase.READY_LOG)),
    (tag("Decode batch. #running-req: 5, #token: 10765, token usage: 0.01, cuda graph: True, "
         "gen throughput (token/s): 507.08, #queue-req: 0", 0), PhaseHit(Phase.SERVING)),
    (tag("Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00", 0),
     None),
    (tag("max_total_num_tokens=746008, chunked_prefill_size=8192, context_len=262144", 0), None),
    (tag(SIGQUIT), None),
    ("(Worker_TP0 pid=5) INFO 08-04 10:10:06 [default_loader.py:291] Loading weights took 3.00 "
     "seconds", None),
])
def test_sglang_phase_rules(raw: str, hit: PhaseHit | None) -> None:
    assert detect_phase(parse_line(raw), "sglang") == hit


def test_uvicorn_up_is_readiness_for_vllm_but_not_for_sglang() -> None:
    line = parse_line(tag("INFO:     Application startup complete."))
    assert detect_phase(line, "vllm") == PhaseHit(Phase.READY_LOG)
    assert detect_phase(line, "sglang") == PhaseHit(Phase.API_SERVER)


STARTUP = [
    tag("server_args=ServerArgs(model_path='/m', tp_size=2)"),
    tag("Init torch distributed begin.", 1), tag("Init torch distributed begin.", 0),
    tag("Load weight begin. avail mem=139.78 GB", 0),
    "Loading safetensors checkpoint shards:  50% Completed | 32/64 [10:00<10:00, 18.76s/it]",
    tag("Load weight end. type=X, dtype=torch.bfloat16, avail mem=67.25 GB, mem usage=72.53 GB.",
        0),
    tag("KV Cache is allocated. #tokens: 746008, K size: 24.41 GB, V size: 24.41 GB", 0),
    tag("Capture cuda graph begin. This can take up to several minutes. avail mem=18.43 GB", 0),
    tag("Capture cuda graph end. Time elapsed: 65.00 s. mem usage=1.12 GB. avail mem=17.31 GB.",
        1),
    tag("Load weight begin. avail mem=17.31 GB", 0),  # the drafter: no step back
    tag("INFO:     Started server process [42]"),
    tag("INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)"),
    tag('INFO:     127.0.0.1:5 - "POST /generate HTTP/1.1" 200 OK'),
    tag("The server is fired up and ready to roll!"),
]
DECODE = tag("Decode batch. #running-req: 5, #token: 10765, token usage: 0.01, accept len: 3.06, "
             "accept rate: 0.77, cuda graph: True, gen throughput (token/s): 507.08, "
             "#queue-req: 0", 0)


def _machine() -> LaunchMachine:
    m = LaunchMachine(engine="sglang", noise=NoiseFilter(builtin_rules("sglang")))
    m.started(100, 1000.0, 1000.0)
    return m


def test_a_startup_walks_the_phases_in_order_then_serves_with_a_spec_readout() -> None:
    m = _machine()
    events = m.feed_lines(enumerate(STARTUP), 1010.0)
    assert [e.phase for e in events if isinstance(e, PhaseChanged)] == [
        Phase.CONFIG, Phase.WEIGHTS, Phase.KV_CACHE, Phase.CUDA_GRAPHS, Phase.API_SERVER,
        Phase.READY_LOG]
    assert m.ready_log_at is not None and m.state is State.LOADING
    m.feed_health(Health(True, "/health", 200, 1011.0), 1011.0)
    ready = m.feed_health(Health(True, "/v1/models", 200, 1011.0), 1011.0)
    assert any(isinstance(e, Ready) for e in ready) and m.state is State.READY
    m.feed_lines([(9999, DECODE)], 1020.0)
    assert m.spec_decode == SpecDecodeInterval(3.06, None, None, (), 77.0,
                                               gen_throughput=507.08)


# -- root cause --------------------------------------------------------------------------------

def _track(lines: list[str], engine: str = "sglang",
           death: tuple[int, str] | None = None) -> RootCauseTracker:
    tracker = RootCauseTracker(NoiseFilter(builtin_rules(engine)), engine)
    if death is not None:
        tracker.note_death(*death)
    for offset, raw in enumerate(lines):
        tracker.feed(parse_line(raw, offset))
    return tracker


@pytest.mark.parametrize(("lines", "death", "cause", "process"), [
    # the trap: the launcher's symptom printed before the scheduler's traceback
    ([tag("Load weight begin. avail mem=139.78 GB", 1), tag(SIGQUIT), *syntax_record(1)],
     (7, "scheduler_TP1"), CAUSE, "scheduler_TP1"),
    ([tag(SIGQUIT), *syntax_record(1)], None, CAUSE, "scheduler_TP1"),
    # SGLang's own order: the record, then the symptom
    ([*OOM_RECORD, tag(SIGQUIT)], (9, "scheduler_TP3"), OOM, "scheduler_TP3"),
    # two ranks failing, one record each: the one that died first is blamed
    ([tag(SIGQUIT), *record(0, "Traceback (most recent call last):", '  File "/a.py", line 1',
                            "ValueError: rank 0 broke"), *syntax_record(1)],
     (7, "sglang::scheduler_TP1"), CAUSE, "scheduler_TP1"),
    # TP=1: nothing is tagged
    ([tag(SIGQUIT), *syntax_record(None)], (7, "scheduler"), CAUSE, None),
])
def test_root_cause_is_the_schedulers_exception_never_the_sigquit(
        lines: list[str], death: tuple[int, str] | None, cause: str, process: str | None) -> None:
    found = _track(lines, death=death).cause()
    assert found is not None
    assert (found.line, found.process) == (cause, process)
    assert f"{SIGQUIT}" in found.symptoms
    assert found.traceback[0] == "Scheduler hit an exception: Traceback (most recent call last):"


def test_child_failed_is_a_symptom() -> None:
    tracker = _track([tag("Child process unexpectedly failed with exitcode=9. pid=4242")])
    assert tracker.cause() is None
    assert tracker.symptoms == ("Child process unexpectedly failed with exitcode=9. pid=4242",)


def test_vllm_tracebacks_are_not_continued_by_untagged_lines() -> None:
    """The continuation rule is SGLang's: a vLLM line without a prefix is its own (a raw
    traceback whose first line was lost: never the worker's)."""
    lines = ["(Worker_TP1 pid=5) ERROR 08-04 10:10:06 [x.py:1] Traceback (most recent call last):",
             '  File "/a.py", line 1', "ValueError: not the worker's"]
    vllm = _track(lines, engine="vllm").cause()
    assert vllm is not None and (vllm.process, vllm.pid) == (None, None)
    assert _track(lines).cause().line == "ValueError: not the worker's"


def test_explain_a_saved_sglang_crash() -> None:
    report = explain([*STARTUP[:4], tag(SIGQUIT), *syntax_record(1)], engine="sglang")
    assert (report.outcome, report.last_phase) == ("crashed", Phase.WEIGHTS)
    assert report.root_cause is not None and report.root_cause.line == CAUSE
    assert report.symptoms == (SIGQUIT,)


# -- spec decode -------------------------------------------------------------------------------

@pytest.mark.parametrize(("message", "interval"), [
    ("Decode batch. #running-req: 5, #token: 10765, token usage: 0.01, accept len: 3.06, "
     "accept rate: 0.77, cuda graph: True, gen throughput (token/s): 507.08, #queue-req: 0",
     SpecDecodeInterval(3.06, None, None, (), 77.0, gen_throughput=507.08)),
    ("Decode batch, #running-req: 1, #token: 39, token usage: 0.00, accept len: 1.73, "
     "accept rate: 0.43, #queue-req: 0", SpecDecodeInterval(1.73, None, None, (), 43.0)),
    ("Decode batch. #running-req: 1, #token: 39, token usage: 0.00, accept len: 1.73, "
     "cuda graph: True, gen throughput (token/s): 95.62, #queue-req: 0", None),  # no rate
    ("Decode batch. #running-req: 1, #token: 39, token usage: 0.00, cuda graph: True, "
     "gen throughput (token/s): 95.62, #queue-req: 0", None),  # not speculative
    ("Prefill batch. #new-seq: 1, #new-token: 7, accept len: 2.00, accept rate: 0.50,", None),
])
def test_decode_batch_feeds_the_spec_readout(message: str,
                                             interval: SpecDecodeInterval | None) -> None:
    assert parse_interval(message) == interval


# -- process names -----------------------------------------------------------------------------

def _info(pid: int, name: str, cmd: str) -> ProcInfo:
    return ProcInfo(pid, 1, name, cmd, "running", 0.0, 0, 0.0, True)


@pytest.mark.parametrize(("name", "cmd", "expected"), [
    ("python3", "/venv/bin/python3 -m sglang.launch_server --model-path /m --tp-size 8",
     "SGLangServer"),
    ("APIServer", "python -m tui.sim.engine --sim-engine sglang --model-path /m", "SGLangServer"),
    ("sglang::schedul", "sglang::scheduler_TP3", "scheduler_TP3"),
    ("schedul", "sglang::scheduler_DP0_TP3_EP3 -m tui.sim.sglang.scheduler",
     "scheduler_DP0_TP3_EP3"),
    ("sglang::detoken", "sglang::detokenizer", "detokenizer"),
    ("python3", "python3 -c from multiprocessing.resource_tracker import main", "python3"),
])
def test_processes_are_named_from_their_titles(name: str, cmd: str, expected: str) -> None:
    m = _machine()
    m.feed_procs(Procs(1000.0, (_info(200, name, cmd),)))
    assert m.name_of(200, name) == expected


@pytest.mark.parametrize(("name", "server"), [
    ("SGLangServer", True), ("scheduler_TP3", True), ("schedul", True), ("scheduler", True),
    ("detokenizer", True), ("detoken", True), ("sglang::scheduler_TP0", True),
    ("resource_tracker", False), ("g++", False),
])
def test_sglang_roles(name: str, server: bool) -> None:
    assert is_server_role(name) is server


def test_a_scheduler_ending_with_code_0_is_the_runs_death() -> None:
    """SGLang's failing scheduler returns after its SIGQUIT: exit code 0, still a death."""
    m = _machine()
    m.feed_lines(enumerate(STARTUP[:4]), 1001.0)
    m.feed_procs(Procs(1001.0, (_info(201, "sglang::schedul", "sglang::scheduler_TP1"),)))
    died = m.feed_exit(ProcExit(201, "sglang::schedul", 0, None, 1002.0, False), 1002.0)
    assert m.state is State.DEAD
    (death,) = [e.death for e in died if isinstance(e, Died)]
    assert (death.process, death.code) == ("scheduler_TP1", 0)
    m.feed_lines(enumerate([tag(SIGQUIT), *syntax_record(1)], 10), 1002.1)
    assert m.death is not None and m.death.cause is not None and m.death.cause.line == CAUSE


def test_an_unknown_top_of_an_sglang_run_is_its_launcher() -> None:
    m = _machine()
    events = m.feed_run_exit(RunExit(100, None, 9, 1003.0), 1003.0)
    (death,) = [e.death for e in events if isinstance(e, Died)]
    assert (death.process, death.signal) == ("SGLangServer", 9)


# -- the simulated SGLang: real processes ----------------------------------------------------

TAGGED = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( TP\d+)?\] ")


class Sim(VLLMSim):
    """One simulated SGLang, its log and its fake GPUs, in its own session."""

    def __init__(self, tmp: Path, scenario: str, scale: float, tp: int = 2) -> None:
        super().__init__(tmp, scenario, scale, tp, gpus=tp)

    def server_args(self, tp: int) -> list[str]:
        return ["--sim-engine", "sglang", "--model-path", "/models/Kimi-K2.5", "--host",
                "0.0.0.0", "--port", str(self.port), "--tp-size", str(tp),
                "--speculative-algorithm", "EAGLE3",
                "--speculative-draft-model-path", "/models/Kimi-K2.5-eagle3"]


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[list[Sim]]:
    started: list[Sim] = []
    yield started
    for sim in started:
        sim.kill_group()


def sglang_proc(line: str) -> str:
    """The process of an SGLang line: tagged lines are their scheduler's, untagged `[stamp]`
    lines the launcher's, bare tqdm bars scheduler TP0's."""
    head = TAGGED.match(line)
    return (head.group(1) or "launcher") if head else " TP0"


def test_sim_ready_serves_named_like_sglang_and_sigterm_ends_the_tree(
        sims: list[Sim], tmp_path: Path) -> None:
    sims.append(sim := Sim(tmp_path, "ready", scale=1000))
    wait_for(lambda: sim.get("/health")[0] == 200, 15, "/health 200")
    wait_for(lambda: "accept len:" in sim.log(), 5, "a Decode batch line")
    log = sim.log()
    in_order(log, [
        "] server_args=ServerArgs(model_path='/models/Kimi-K2.5'", " TP0] Init torch distributed",
        " TP0] Load weight begin. avail mem=139.78 GB",
        "Loading safetensors checkpoint shards: 100% Completed | 64/64 [",
        " TP0] Load weight end. type=KimiK25ForConditionalGeneration",
        " TP0] KV Cache is allocated. #tokens: ", " TP0] Memory pool end.",
        " TP0] Capture cuda graph begin.", "Capturing batches (bs=1 avail_mem=",
        " TP0] Capture cuda graph end.", "type=LlamaForCausalLMEagle3",
        " TP0] Capture draft cuda graph end.", " TP0] max_total_num_tokens=",
        f"] INFO:     Started server process [{sim.proc.pid}]",
        f"] INFO:     Uvicorn running on http://0.0.0.0:{sim.port} (Press CTRL+C to quit)",
        "] The server is fired up and ready to roll!", " TP0] Decode batch. #running-req: "])
    assert '"POST /generate HTTP/1.1" 200 OK' in log and " TP1] Load weight end." in log
    assert set(check_sequences(log, sglang_proc)) == {"launcher", " TP0", " TP1"}

    status, models = sim.get("/v1/models")
    assert status == 200 and json.loads(models)["data"][0]["owned_by"] == "sglang"
    assert b"sglang:generation_tokens_total" in sim.get("/metrics")[1]

    top = psutil.Process(sim.proc.pid)
    kids = sorted(top.children(), key=lambda p: p.cmdline()[0])
    assert [k.cmdline()[0] for k in kids] == [
        "sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    assert {Path(f"/proc/{k.pid}/comm").read_text().strip() for k in kids} == {
        "sglang::detoken", "sglang::schedul"}
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.proc.wait(timeout=5) == 0
    wait_for(lambda: not any(alive(k.pid) for k in kids), 2, "the tree to end")


def test_sim_syntax_error_prints_the_sigquit_before_the_traceback(
        sims: list[Sim], tmp_path: Path) -> None:
    sims.append(sim := Sim(tmp_path, "syntax-error", scale=300))
    assert sim.proc.wait(timeout=15) == -signal.SIGKILL  # kill_process_tree kills itself too
    log = sim.log()
    in_order(log, [" TP0] Load weight begin.", f"] {SIGQUIT}",
                   " TP", "] Scheduler hit an exception: Traceback (most recent call last):\n",
                   f'  File "{tmp_path}/specconsole-sim-{sim.proc.pid}/kimi_k25_patched.py", '
                   f"line 15\n    {BROKEN_LINE}\n", f"{SYNTAX}\n\n"])
    assert "Load weight end" not in log
    assert not (tmp_path / f"specconsole-sim-{sim.proc.pid}").exists()
    deaths = [json.loads(x) for x in (tmp_path / "gpus" / "deaths.jsonl").read_text().splitlines()]
    assert {d["name"] for d in deaths} <= {"scheduler_TP0", "scheduler_TP1"}
    check_sequences(log, sglang_proc)


def test_sim_oom_keeps_sglangs_order_and_hang_freezes(sims: list[Sim], tmp_path: Path) -> None:
    (tmp_path / "oom").mkdir()
    (tmp_path / "hang").mkdir()
    sims.append(oom := Sim(tmp_path / "oom", "oom", scale=1000))
    sims.append(hang := Sim(tmp_path / "hang", "hang", scale=1000))
    assert oom.proc.wait(timeout=15) == -signal.SIGKILL
    in_order(oom.log(), ["| 40/64 [", " TP1] Scheduler hit an exception: Traceback",
                         "torch.OutOfMemoryError: CUDA out of memory.", f"] {SIGQUIT}"])
    wait_for(lambda: "| 37/64 [" in hang.log(), 10, "the hang point")
    time.sleep(0.3)
    size = hang.log_path.stat().st_size
    time.sleep(0.5)  # ~8 simulated minutes
    assert hang.log_path.stat().st_size == size and hang.proc.poll() is None
    assert "Load weight end" not in hang.log()


def test_sim_engine_killed_health_503_while_the_launcher_stays(sims: list[Sim],
                                                              tmp_path: Path) -> None:
    sims.append(sim := Sim(tmp_path, "engine-killed", scale=1000))
    wait_for(lambda: sim.get("/health")[0] == 200, 15, "/health 200")
    wait_for(lambda: sim.get("/health")[0] == 503, 10, "/health 503")
    assert sim.proc.poll() is None
    assert re.search(r"\] Child process unexpectedly failed with exitcode=9\. pid=\d+ ",
                     sim.log())


def test_the_simulated_sglang_is_stdlib_only() -> None:
    probe = ("import sys, tui.sim.engine, tui.sim.sglang.launcher, tui.sim.sglang.scheduler, "
             "tui.sim.sglang.detokenizer\n"
             "print(sorted(m for m in ('psutil', 'textual', 'asyncssh', 'pynvml') "
             "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, timeout=30, check=True)
    assert done.stdout.strip() == "[]"


# -- the Supervisor on the simulated SGLang, locally and over SSH ----------------------------

def sglang_profile(tmp: Path, scenario: str, *, target: str = "local",
                   time_scale: float = 300.0) -> Path:
    path = tmp / f"sglang-{scenario}.toml"
    path.write_text(f"""
[host]
target = "{target}"
python = "{sys.executable}"
runs_dir = "{tmp / 'runs'}"

[server]
engine = "sglang"
model = "/models/Kimi-K2.5"
port = {free_port()}
tensor_parallel_size = 4

[server.speculative]
method = "eagle3"
model = "/models/Kimi-K2.5-eagle3"
num_steps = 3

[preflight]
compile = false
paths_exist = false

[simulate]
scenario = "{scenario}"
time_scale = {time_scale}
gpus = 4
gpu_state = "{tmp / 'gpus'}"
""")
    return path


async def test_sglang_reaches_ready_with_its_phases_tree_and_spec_readout(tmp_path: Path) -> None:
    sup = Supervisor(load_profile(sglang_profile(tmp_path, "ready")))
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        phases: list[Phase] = []

        async def until_ready() -> None:
            while not isinstance(event := await events.get(), Ready):
                if isinstance(event, PhaseChanged):
                    phases.append(event.phase)
        await asyncio.wait_for(until_ready(), 30)
        # on a busy machine the first batches may be logged before the health probe answers
        assert phases[:6] == [Phase.CONFIG, Phase.WEIGHTS, Phase.KV_CACHE, Phase.CUDA_GRAPHS,
                              Phase.API_SERVER, Phase.READY_LOG], phases
        assert phases[6:] in ([], [Phase.SERVING]), phases
        m = sup.machine
        for _ in range(200):
            if m.spec_decode is not None and len(m.procs) >= 6:
                break
            await asyncio.sleep(0.05)
        assert m.spec_decode is not None and m.spec_decode.mean_acceptance_length > 1
        assert 0 < m.spec_decode.acceptance_rate <= 100
        names = m.names()
        (top,) = [pid for pid, p in m.procs.items() if p.ppid not in m.procs]
        assert names[top] == "SGLangServer"
        assert sorted(names[pid] for pid, p in m.procs.items() if p.ppid == top) == [
            "detokenizer", "scheduler_TP0", "scheduler_TP1", "scheduler_TP2", "scheduler_TP3"]
    finally:
        await sup.kill(1.0)
        await sup.close()


async def _syntax_error_is_dead_naming_the_scheduler(profile: Path) -> None:
    sup = Supervisor(load_profile(profile))
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        died = await next_event(events, Died, timeout=30)
        assert re.fullmatch(r"scheduler_TP[0-3]", died.death.process), died.death
        assert died.death.phase is Phase.WEIGHTS
        for _ in range(100):  # the cause may follow the death (the log is slower than a pidfd)
            cause = sup.machine.death.cause if sup.machine.death else None
            if cause is not None:
                break
            await asyncio.sleep(0.05)
        assert cause is not None
        assert re.fullmatch(rf"{SYNTAX} \(.*/kimi_k25_patched\.py, line 15\)", cause.line)
        assert cause.process == sup.machine.death.process
        assert any(SIGQUIT in s for s in cause.symptoms)
        assert sup.machine.state is State.DEAD
    finally:
        await sup.kill(1.0)
        await sup.close()


async def test_syntax_error_is_dead_naming_the_scheduler_and_its_syntax_error(
        tmp_path: Path) -> None:
    await _syntax_error_is_dead_naming_the_scheduler(sglang_profile(tmp_path, "syntax-error"))


async def test_syntax_error_over_ssh(tmp_path: Path, ssh_server,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCONSOLE_SSH_CONFIG", str(ssh_server.ssh_config))
    await _syntax_error_is_dead_naming_the_scheduler(
        sglang_profile(tmp_path, "syntax-error", target=ssh_server.alias, time_scale=75))
