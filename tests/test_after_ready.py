"""A server that reached READY and then died, hung or kept serving through requests' errors
(issue 33): what happened after READY explains it, never what the launch survived on its way
there. Line shapes as vLLM V1 prints them (v1/engine/core.py run_engine_core and its busy loop,
v1/executor/multiproc_executor.py, v1/engine/async_llm.py output_handler,
entrypoints/openai/api_server.py, v1/metrics/loggers.py, uvicorn's access and ASGI lines)."""

from __future__ import annotations

from tui.core.describe import describe
from tui.core.explain import explain, explanation_lines
from tui.core.failures import by_id, hint_for
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.protocol import GpuInfo, Gpus, Health
from tui.core.ranking import BEFORE_READY_WORDS
from tui.core.state import LaunchMachine, Ready, ReadyTimedOut, Stalled, State


def api(msg: str, level: str = "INFO", at: str = "06-01 09:00:05",
        src: str = "api_server.py:1") -> str:
    return f"(APIServer pid=88) {level} {at} [{src}] {msg}"


def core(msg: str, level: str = "ERROR", at: str = "06-01 10:12:41",
         src: str = "core.py:710") -> str:
    return f"(EngineCore_DP0 pid=301) {level} {at} [{src}] {msg}"


# A non-fatal start-up error: a general plugin that fails to import is logged with its
# traceback (vllm/plugins/__init__.py load_plugins_by_group: logger.exception), and the launch
# goes on to READY.
PLUGIN = [
    api("Failed to load plugin acme_metrics", "ERROR", "06-01 09:00:02", "__init__.py:43"),
    api("Traceback (most recent call last):", "ERROR", "06-01 09:00:02", "__init__.py:43"),
    api('  File "/venv/lib/python3.12/site-packages/vllm/plugins/__init__.py", line 40, in '
        "load_plugins_by_group", "ERROR", "06-01 09:00:02", "__init__.py:43"),
    api("    func = plugin.load()", "ERROR", "06-01 09:00:02", "__init__.py:43"),
    api("ModuleNotFoundError: No module named 'acme_metrics_ext'", "ERROR", "06-01 09:00:02",
        "__init__.py:43"),
]
START = [
    api("vLLM API server version 0.11.0", at="06-01 09:00:01", src="api_server.py:1839"),
    api("non-default args: {'model': 'Qwen/Qwen3-8B'}", at="06-01 09:00:01",
        src="api_server.py:1840"),
    *PLUGIN,
    core("Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B'", "INFO",
         "06-01 09:00:09", "core.py:77"),
    core("init engine (profile, create kv cache, warmup model) took 41.20 seconds", "INFO",
         "06-01 09:00:52", "core.py:210"),
    api("Starting vLLM API server 0 on http://0.0.0.0:8000", at="06-01 09:00:53",
        src="api_server.py:1880"),
    "(APIServer pid=88) INFO:     Started server process [88]",
    "(APIServer pid=88) INFO:     Waiting for application startup.",
    "(APIServer pid=88) INFO:     Application startup complete.",
]
SERVING = [
    api("Engine 000: Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 96.1 "
        "tokens/s, Running: 6 reqs, Waiting: 0 reqs, GPU KV cache usage: 12.4%, Prefix cache "
        "hit rate: 41.0%", at="06-01 10:12:30", src="loggers.py:123"),
    '(APIServer pid=88) INFO:     10.1.4.7:51220 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
]
IMA = "RuntimeError: CUDA error: an illegal memory access was encountered"
# The engine core dies in its busy loop an hour later; the front end then reports it dead.
DEATH = [
    core("EngineCore encountered a fatal error."),
    core("Traceback (most recent call last):"),
    core('  File "/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 701, in '
         "run_engine_core"),
    core("    engine_core.run_busy_loop()"),
    core('  File "/venv/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", '
         "line 1730, in execute_model"),
    core("    valid_sampled_token_ids = sampled_token_ids.tolist()"),
    core(IMA),
    api("AsyncLLM output_handler failed.", "ERROR", "06-01 10:12:41", "async_llm.py:480"),
    api("Traceback (most recent call last):", "ERROR", "06-01 10:12:41", "async_llm.py:480"),
    api('  File "/venv/lib/python3.12/site-packages/vllm/v1/engine/async_llm.py", line 439, '
        "in output_handler", "ERROR", "06-01 10:12:41", "async_llm.py:480"),
    api("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
        "trace (above) for the root cause.", "ERROR", "06-01 10:12:41", "async_llm.py:480"),
]


def test_a_death_after_ready_is_not_blamed_on_what_the_start_up_survived() -> None:
    ex = explain([*START, *SERVING, *DEATH])
    assert ex.outcome == "crashed"
    assert ex.root_cause is not None and ex.root_cause.line == IMA
    assert ex.root_cause.kind is by_id("cuda_env")
    # the start-up's error is shown beside it, and why it was set aside
    assert ex.runner_up is not None
    assert ex.runner_up.line == "ModuleNotFoundError: No module named 'acme_metrics_ext'"
    assert ex.runner_up.reasons == (BEFORE_READY_WORDS,)
    text = "\n".join(explanation_lines(ex))
    assert f"root cause:    {IMA}" in text and "runner-up:     ModuleNotFoundError" in text


def test_with_nothing_after_ready_the_start_ups_error_is_still_said() -> None:
    """Only a symptom after READY (the engine's own lines lost): the start-up's error is all
    the log has, and is named rather than nothing."""
    ex = explain([*START, *SERVING, *DEATH[7:]])
    assert ex.outcome == "crashed" and ex.root_cause is not None
    assert ex.root_cause.line == "ModuleNotFoundError: No module named 'acme_metrics_ext'"


def test_a_hang_after_ready_names_its_marker_not_the_start_ups_error() -> None:
    shm = core("No available shared memory broadcast block found in 60 seconds. This typically "
               "happens when some processes are hanging or doing some time-consuming work.",
               "INFO", src="shm_broadcast.py:466")
    ex = explain([*START, *SERVING, shm])
    assert ex.outcome == "hung" and ex.root_cause is not None
    assert ex.root_cause.kind is by_id("shm_broadcast")


# -- a request's failure while serving -------------------------------------------------------

ASGI = [
    "(APIServer pid=88) ERROR:    Exception in ASGI application",
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.12/site-packages/uvicorn/protocols/http/httptools_impl.py", '
    "line 409, in run_asgi",
    "    result = await app(  # type: ignore[func-returns-value]",
    '  File "/venv/lib/python3.12/site-packages/starlette/middleware/errors.py", line 186, in '
    "__call__",
    "    raise exc",
    '  File "/usr/lib/python3.12/json/encoder.py", line 180, in default',
    "    raise TypeError(f'Object of type {o.__class__.__name__} '",
    "TypeError: Object of type ndarray is not JSON serializable",
]
TOOL_PARSER = [
    api("Error in extracting tool call from response.", "ERROR", "06-01 10:13:02",
        "hermes_tool_parser.py:101"),
    api("Traceback (most recent call last):", "ERROR", "06-01 10:13:02",
        "hermes_tool_parser.py:101"),
    api('  File "/venv/lib/python3.12/site-packages/vllm/entrypoints/openai/tool_parsers/'
        'hermes_tool_parser.py", line 95, in extract_tool_calls', "ERROR", "06-01 10:13:02",
        "hermes_tool_parser.py:101"),
    api("json.decoder.JSONDecodeError: Unterminated string starting at: line 1 column 30 "
        "(char 29)", "ERROR", "06-01 10:13:02", "hermes_tool_parser.py:101"),
]
ANSWERED_500 = ('(APIServer pid=88) INFO:     10.1.4.7:51240 - "POST /v1/chat/completions '
                'HTTP/1.1" 500 Internal Server Error')


def test_requests_that_fail_while_serving_are_the_requests_not_the_servers_death() -> None:
    """Each request's traceback and its 500 come last in the log: the server was serving."""
    ex = explain([*START, *SERVING, *ASGI, ANSWERED_500, *TOOL_PARSER, ANSWERED_500])
    assert ex.outcome == "ready" and ex.root_cause is None
    assert ex.requests_failed == 2
    assert ex.first_failed_request == "TypeError: Object of type ndarray is not JSON serializable"
    assert ex.to_json()["failed_requests"] == {
        "count": 2, "first": "TypeError: Object of type ndarray is not JSON serializable"}
    text = "\n".join(explanation_lines(ex))
    assert "outcome:       ready" in text
    assert ("requests:      2 failed while the server went on serving; the first: TypeError: "
            "Object of type ndarray is not JSON serializable") in text


def test_a_request_answered_500_with_no_traceback_is_counted() -> None:
    ex = explain([*START, *SERVING, ANSWERED_500])
    assert ex.outcome == "ready" and ex.requests_failed == 1
    assert ex.first_failed_request is not None and '" 500 Internal' in ex.first_failed_request


def test_a_request_failure_then_the_engines_death_is_a_crash() -> None:
    """The engine says it is dead after the requests' errors: the server died, of its own
    cause, and the requests' errors are never that cause."""
    ex = explain([*START, *SERVING, *ASGI, ANSWERED_500, *DEATH])
    assert ex.outcome == "crashed" and ex.root_cause is not None
    assert ex.root_cause.line == IMA
    only_dead = explain([*START, *SERVING, *TOOL_PARSER, ANSWERED_500, *DEATH[7:]])
    assert only_dead.outcome == "crashed"
    assert only_dead.root_cause is None or "JSONDecodeError" not in only_dead.root_cause.line


def test_a_start_up_traceback_through_the_api_server_is_no_request() -> None:
    """Before READY nothing is a request's: the same shapes are the launch's failure."""
    ex = explain([*START[:2], *START[len(PLUGIN) + 2:-1], *TOOL_PARSER])
    assert ex.outcome == "crashed" and ex.root_cause is not None
    assert ex.root_cause.line.startswith("json.decoder.JSONDecodeError")
    assert ex.requests_failed == 0


# -- a process ended by a signal --------------------------------------------------------------

EXECUTOR_FAILED = [
    core("Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.",
         src="multiproc_executor.py:150"),
    core("EngineCore encountered a fatal error."),
    core("Traceback (most recent call last):"),
    core('  File "/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 728, in '
         "run_busy_loop"),
    core('  File "/venv/lib/python3.12/site-packages/vllm/v1/executor/multiproc_executor.py", '
         "line 240, in collective_rpc"),
    core("RuntimeError: Executor failed."),
    *DEATH[7:],
]


def test_a_worker_killed_while_serving_is_explained_as_the_signal() -> None:
    """vLLM's engine core raises `Executor failed.` because its worker died; the worker, ended
    by SIGKILL, wrote nothing: the signal is the cause, with who could have sent it."""
    ex = explain([*START, *SERVING, *EXECUTOR_FAILED])
    assert ex.outcome == "crashed" and ex.root_cause is not None
    cause = ex.root_cause
    assert cause.signal == "SIGKILL" and cause.kind is by_id("killed")
    assert cause.process == "VllmWorker-1" and "Executor failed" not in cause.line
    assert "OOM killer" in cause.line
    text = "\n".join(explanation_lines(ex))
    assert "root cause:    VllmWorker-1 was ended by SIGKILL, killed from outside" in text
    assert "RuntimeError: Executor failed." in ex.symptoms


def test_a_worker_that_died_of_its_own_error_is_explained_by_it() -> None:
    """Exit code 1 is no signal: the worker's own traceback is the cause, as before."""
    own = [f"(VllmWorker-1 pid=412) ERROR 06-01 10:12:40 [multiproc_executor.py:600] {IMA}",
           *EXECUTOR_FAILED]
    own[1] = own[1].replace("exit code: -9", "exit code: 1")
    ex = explain([*START, *SERVING, *own])
    assert ex.root_cause is not None and ex.root_cause.line == IMA
    assert ex.root_cause.signal is None


def test_an_engines_failure_raised_through_a_request_is_the_servers_death() -> None:
    """An in-process engine (V0's AsyncLLMEngine) raises its CUDA error through the request
    that was running: the class says it is the engine's, not one request's."""
    log = [*START, *SERVING,
           "ERROR 06-01 10:12:41 [serving_completion.py:380] Error in completion stream",
           "ERROR 06-01 10:12:41 [serving_completion.py:380] Traceback (most recent call last):",
           'ERROR 06-01 10:12:41 [serving_completion.py:380]   File "/venv/lib/python3.12/site-'
           'packages/vllm/entrypoints/openai/serving_completion.py", line 350, in '
           "completion_stream_generator",
           f"ERROR 06-01 10:12:41 [serving_completion.py:380] {IMA}"]
    ex = explain(log)
    assert ex.outcome == "crashed" and ex.root_cause is not None
    assert ex.root_cause.line == IMA and ex.requests_failed == 0


def test_a_parsers_error_record_over_a_requests_traceback_is_no_crash_without_a_500() -> None:
    """A streamed answer has no 5xx to show the server went on: the tool parser's own ERROR
    record heading the request's traceback is that request's, neither cause nor evidence."""
    ex = explain([*START, *SERVING, *TOOL_PARSER])
    assert ex.outcome == "ready" and ex.root_cause is None and ex.requests_failed == 1
    assert ex.first_failed_request is not None
    assert ex.first_failed_request.startswith("json.decoder.JSONDecodeError: Unterminated")


# -- a stall after READY (the state machine, live) --------------------------------------------

STALL_S = 60.0
T0 = 1_000.0


class _Live:
    """A LaunchMachine fed as the agent feeds it: the log in chunks at running byte offsets,
    the GPUs' samples, the health probes' changes."""

    def __init__(self) -> None:
        self.m = LaunchMachine(noise=NoiseFilter(builtin_rules("vllm")),
                               stall_timeout_s=STALL_S)
        self.m.started(88, T0, T0)
        self.offset = 0

    def log(self, lines: list[str], at: float) -> list[object]:
        pairs = []
        for line in lines:
            pairs.append((self.offset, line))
            self.offset += len(line) + 1
        return list(self.m.feed_lines(pairs, at))

    def gpus(self, at: float, used: int = 70_000, util: int = 0) -> None:
        self.m.feed_gpus(Gpus(at, tuple(GpuInfo(i, "H100", used, 80_000, util)
                                        for i in range(2))), at)

    def health(self, ok: bool, at: float, status: int | None = 200) -> list[object]:
        events: list[object] = []
        for path in self.m.health_paths:
            events += self.m.feed_health(Health(ok, path, status, at), at)
        return events

    def ticks(self, start: float, end: float, every: float = 5.0) -> list[object]:
        events: list[object] = []
        at = start
        while at <= end:
            events += self.m.tick(at)
            at += every
        return events


def _served() -> _Live:
    """Started with a start-up error it survived, READY, served, then went on."""
    live = _Live()
    live.gpus(T0 + 1, used=1_000)
    live.log(START, T0 + 60)
    live.gpus(T0 + 60)
    assert any(isinstance(e, Ready) for e in live.health(True, T0 + 61))
    live.log(SERVING, T0 + 100)
    live.gpus(T0 + 100, util=97)
    return live


IDLE = api("Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 4.2 "
           "tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache "
           "hit rate: 41.0%", at="06-01 10:12:40", src="loggers.py:123")


def test_an_idle_ready_server_is_never_stalled() -> None:
    """Quiet log, GPUs frozen at 0 %, the health answering: an idle server, for 10x the stall
    timeout, stays READY."""
    live = _served()
    live.log([IDLE], T0 + 110)
    live.gpus(T0 + 111)
    events = live.ticks(T0 + 111, T0 + 111 + 10 * STALL_S)
    assert live.m.state is State.READY
    assert not any(isinstance(e, Stalled) for e in events)


def test_a_hang_marker_after_ready_with_frozen_gpus_is_stalled_naming_it() -> None:
    live = _served()
    shm = core("No available shared memory broadcast block found in 60 seconds. This typically "
               "happens when some processes are hanging or doing some time-consuming work.",
               "INFO", src="shm_broadcast.py:466")
    live.gpus(T0 + 101, util=100)  # frozen from here: memory and utilisation stand still
    live.log([shm], T0 + 161)      # the heartbeat of a hang: no progress
    assert live.ticks(T0 + 120, T0 + 100 + STALL_S - 1) == []
    events = live.ticks(T0 + 100 + STALL_S, T0 + 100 + 2 * STALL_S)
    stall = next(e for e in events if isinstance(e, Stalled))
    assert live.m.state is State.STALLED
    assert stall.cause is not None and stall.cause.kind is by_id("shm_broadcast")
    assert stall.frozen_gpus == (0, 1)
    # what happened after READY, never what the start-up survived
    assert "acme_metrics" not in stall.summary() and "block found" in stall.summary()
    said = describe(stall)
    assert said[0].startswith("STALLED: stopped serving: the log says it hangs: No available")
    assert said[-1] == f"hint: {hint_for(stall.cause.kind, stall.cause.line)}"
    # serving again: back to READY, without a second Ready
    back = live.log([SERVING[0]], T0 + 300)
    assert live.m.state is State.READY
    assert not any(isinstance(e, Ready) for e in back)


def test_health_timing_out_with_requests_running_is_stalled() -> None:
    live = _served()
    live.gpus(T0 + 101, util=100)
    assert live.health(False, T0 + 110, status=None) == []  # the probe's timeout: no answer
    assert live.ticks(T0 + 110, T0 + 100 + STALL_S - 1) == []
    events = live.ticks(T0 + 100 + STALL_S, T0 + 110 + STALL_S + 5)
    stall = next(e for e in events if isinstance(e, Stalled))
    assert live.m.state is State.STALLED and stall.cause is None
    assert stall.serving is not None
    assert "/health failing (no answer)" in stall.serving and "6 requests running" in stall.serving
    assert not any(isinstance(e, ReadyTimedOut) for e in events)
    # the health answers again: serving, READY once more, not a second launch's READY
    back = live.health(True, T0 + 400)
    assert live.m.state is State.READY and not any(isinstance(e, Ready) for e in back)


def test_a_ready_server_whose_gpus_still_move_is_not_stalled() -> None:
    """Requests running, the log quiet, but the GPUs work: no stall."""
    live = _served()
    for k in range(1, 40):
        live.gpus(T0 + 100 + 5 * k, util=90 + k % 7)
    events = live.ticks(T0 + 100, T0 + 100 + 3 * STALL_S)
    assert live.m.state is State.READY and events == []
