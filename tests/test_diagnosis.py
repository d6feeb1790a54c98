"""The log's verdict by failure class (tui.core.diagnosis, rootcause, failures): each rule on
the engines' real wording, one case per shape a real log takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tui.core.explain import explain, explanation_lines
from tui.core.failures import CLASSES, HANG_MARKERS, by_id, classify, hang_marker, hint_for

CORPUS = Path(__file__).parent / "corpus" / "logs"


def ec(msg: str, level: str = "ERROR", pid: int = 301) -> str:
    return f"(EngineCore_DP0 pid={pid}) {level} 01-28 00:18:18 [core.py:935] {msg}"


def api(msg: str, level: str = "INFO") -> str:
    return f"(APIServer pid=88) {level} 01-28 00:18:10 [api_server.py:1] {msg}"


START = [api("vLLM API server version 0.11.0"), api("non-default args: {'model': 'm'}"),
         ec("Initializing a V1 LLM engine (v0.11.0) with config: model='m'", "INFO")]
READY = [*START, "INFO:     Application startup complete."]


# -- classes: the engines' own words (tui/core/failures.py names where each is printed) -------

@pytest.mark.parametrize(("line", "class_id"), [
    ("SyntaxError: trailing comma not allowed without surrounding parentheses", "syntax"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 MiB.", "oom"),
    ("Failed to create unquantized linear weights: CUDA out of memory. Tried to allocate", "oom"),
    ("RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("ValueError: No available memory for the cache blocks. Try increasing "
     "`gpu_memory_utilization` when initializing the engine.", "kv_cache"),
    ("ValueError: To serve at least one request with the models's max seq len (202752), (71.16 "
     "GiB KV cache is needed, which is larger than the available KV cache memory", "kv_cache"),
    ("ValueError: Free memory on device (3.22/4.0 GiB) on startup is less than desired GPU "
     "memory utilization (0.9, 3.6 GiB).", "kv_cache"),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
     "kv_cache"),
    ("[Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already "
     "in use", "port"),
    ("OSError: [Errno 98] Address already in use", "port"),
    ("OSError: [Errno 28] No space left on device", "disk"),
    ("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
     "nccl"),
    ("host:1:1 [0] init.cc:416 NCCL WARN Cuda failure 'operation not supported'", "nccl"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device",
     "cuda_env"),
    ("RuntimeError: Failed to infer device type", "cuda_env"),
    ("ValueError: The quantization method fp8 is not supported for the current GPU. Minimum "
     "capability: 90. Current capability: 86.", "quant"),
    ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
     "config"),
    ("ValueError: Total number of attention heads (32) must be divisible by tensor parallel "
     "size (3).", "config"),
    ("ImportError: cannot import name 'LossKwargs' from 'transformers.utils'", "import"),
    ("KeyError: 'layers.1.mlp.experts.w13_weight'", "weights"),
    ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
     "ray"),
])
def test_each_failure_class_by_its_real_words(line: str, class_id: str) -> None:
    kind = classify(line)
    assert kind is not None and kind.id == class_id
    assert hint_for(kind, line)


def test_every_class_names_its_source_and_hint() -> None:
    for kind in (*CLASSES, *HANG_MARKERS):
        assert kind.source and kind.hint and kind.label, kind.id
        assert by_id(kind.id) is kind


def test_hints_name_the_file_and_line_or_the_port() -> None:
    syntax = "SyntaxError: invalid syntax (/m/kimi_k25.py, line 12)"
    assert "fix /m/kimi_k25.py, line 12" in hint_for(by_id("syntax"), syntax)
    port = "[Errno 98] error while attempting to bind on address ('0.0.0.0', 44319): in use"
    assert "sport = :44319" in hint_for(by_id("port"), port)
    assert hint_for(by_id("oom"), "CUDA out of memory") == by_id("oom").hint


# -- causes that real logs state without a clean traceback -----------------------------------

def test_an_error_record_before_a_symptom_traceback_is_the_cause() -> None:
    log = [*START,
           ec("Failed to create unquantized linear weights: CUDA out of memory. Tried to "
              "allocate 896.00 MiB."),
           ec("EngineCore failed to start."), ec("Traceback (most recent call last):"),
           ec('  File "/v/vllm/model_executor/layers/linear.py", line 220, in create_weights'),
           ec("RuntimeError: Failed to create unquantized linear weights. This may be caused "
              "by insufficient memory to allocate the weight.")]
    ex = explain(log)
    assert ex.outcome == "crashed"
    assert ex.root_cause is not None and ex.root_cause.line.startswith(
        "Failed to create unquantized linear weights: CUDA out of memory")
    assert ex.root_cause.kind is by_id("oom")


def test_a_traceback_cut_before_its_exception_is_a_crash_naming_the_engine_frame() -> None:
    log = [*START, ec("EngineCore failed to start."), ec("Traceback (most recent call last):"),
           ec('  File "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_worker.py", '
              'line 235, in init_device'),
           ec("    self.init_snapshot = MemorySnapshot()"),
           ec('  File "/usr/lib/python3.12/site-packages/torch/cuda/memory.py", line 700, in '
              'mem_get_info')]
    ex = explain(log)
    assert ex.outcome == "crashed" and ex.last_phase is not None
    cause = ex.root_cause
    assert cause is not None and cause.missing and cause.process == "EngineCore_DP0"
    assert cause.deepest_frame == "vllm/v1/worker/gpu_worker.py:235 in init_device"
    text = "\n".join(explanation_lines(ex))
    assert "cut before its exception line" in text and "deepest frame: vllm/v1/" in text


def test_a_traceback_whose_head_was_cut_still_names_its_exception() -> None:
    log = [ec("    _check_enough_kv_cache_memory("),
           ec('  File "/v/vllm/v1/core/kv_cache_utils.py", line 634, in check'),
           ec("    raise ValueError("),
           ec("ValueError: To serve at least one request with the model's max seq len (202752)")]
    cause = explain(log).root_cause
    assert cause is not None and cause.line.startswith("ValueError: To serve at least one")


def test_a_traceback_pasted_without_indentation_still_reads() -> None:
    log = ['File "/sgl/sglang/srt/model_executor/model_runner.py", line 235, in __init__',
           "min_per_gpu_memory = self.init_torch_distributed()",
           'File "/sgl/sglang/srt/distributed/device_communicators/pynccl_wrapper.py", line 350,'
           " in NCCL_CHECK",
           'raise RuntimeError(f"NCCL error: {error_str}")',
           "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for "
           "details)"]
    ex = explain(log, engine="sglang")
    assert ex.outcome == "crashed"
    assert ex.root_cause is not None and ex.root_cause.line.startswith("RuntimeError: NCCL")
    assert ex.root_cause.kind is by_id("nccl")


def test_a_message_that_spans_lines_is_the_whole_message() -> None:
    log = ["Traceback (most recent call last):",
           '  File "/v/pydantic/_internal/_dataclasses.py", line 121, in __init__',
           "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
           "  Value error, User-specified max_model_len (100000) is greater than the derived "
           "max_model_len (max_position_embeddings=2048). [type=value_error, input_value="
           "ArgsKwargs(()), input_type=ArgsKwargs]",
           "    For further information visit https://errors.pydantic.dev/2.11/v/value_error"]
    cause = explain(log).root_cause
    assert cause is not None
    assert cause.line == ("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                          "ModelConfig — Value error, User-specified max_model_len (100000) is "
                          "greater than the derived max_model_len (max_position_embeddings="
                          "2048).")
    assert cause.kind is by_id("config")


def test_v0s_record_before_a_cut_traceback_is_its_exception_text() -> None:
    """V0's engine logs `str(e)` then the traceback: when the traceback is cut, the record is
    all that says what failed; when the traceback ends in a symptom, the record is none."""
    record = "ERROR 12-09 00:49:29 engine.py:366] 'layers.0.mlp.down_proj.weight.absmax'"
    cut = [record, "ERROR 12-09 00:49:29 engine.py:366] Traceback (most recent call last):",
           'ERROR 12-09 00:49:29 engine.py:366]   File "/v/vllm/engine/x.py", line 1, in f']
    cause = explain(cut).root_cause
    assert cause is not None and cause.line == "'layers.0.mlp.down_proj.weight.absmax'"
    symptom = [ec("AsyncLLM output_handler failed."), ec("Traceback (most recent call last):"),
               ec('  File "/v/vllm/v1/engine/core_client.py", line 1, in get_output_async'),
               ec("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
                  "See stack trace (above) for the root cause.")]
    ex = explain(symptom)
    assert ex.outcome == "crashed" and ex.root_cause is None


def test_a_trust_remote_code_import_failure_is_named_by_its_exception() -> None:
    w = "(APIServer pid=1) WARNING 01-06 10:34:09 [dynamic_module.py:51] "
    log = [*START,
           f"{w}Unable to load modeling_x.XModel from /m/x on HF Hub.",
           f"{w}Traceback (most recent call last):",
           f'{w}  File "/v/transformers/dynamic_module_utils.py", line 1, in get_class',
           f"{w}ImportError: cannot import name 'LossKwargs' from 'transformers.utils'"]
    warned = explain(log)
    assert warned.outcome == "unknown"  # a WARNING alone is no proof of a crash
    failed = explain([*log, api("RuntimeError: Engine process failed to start.", "ERROR")])
    assert failed.outcome == "crashed"
    assert failed.root_cause is not None
    assert failed.root_cause.line == "ImportError: cannot import name 'LossKwargs' from " \
                                     "'transformers.utils'"


def test_a_bind_failure_after_startup_complete_in_a_ci_wrapper_is_a_crash() -> None:
    log = [f"  | [2024-09-05T00:38:34Z] {s}" for s in
           [*READY, "ERROR:    [Errno 98] error while attempting to bind on address "
                    "('0.0.0.0', 44319): [errno 98] address already in use"]]
    ex = explain(log)
    assert ex.outcome == "crashed"
    assert ex.root_cause is not None and ex.root_cause.kind is by_id("port")


def test_a_line_from_a_library_states_the_cause_when_nothing_better_is_known() -> None:
    nccl = "[2025-08-11 10:45:36] server:2699411:2699411 [0] init.cc:416 NCCL WARN Cuda failure"
    log = [nccl, ec("EngineCore failed to start."), ec("Traceback (most recent call last):"),
           ec('  File "/v/vllm/distributed/device_communicators/pynccl.py", line 1, in init')]
    cause = explain(log).root_cause
    assert cause is not None and "NCCL WARN Cuda failure" in cause.line
    real = explain([*log, ec("RuntimeError: NCCL error: unhandled cuda error")]).root_cause
    assert real is not None and real.line == "RuntimeError: NCCL error: unhandled cuda error"


# -- hangs -------------------------------------------------------------------------------------

SHM = ("No available shared memory broadcast block found in 60 seconds. This typically happens "
       "when some processes are hanging or doing some time-consuming work.")


@pytest.mark.parametrize("marker", [
    ec(SHM, "INFO"),
    "(Worker pid=5) WARNING 07-29 11:56:49 multiproc_worker_utils.py:1] No available block "
    "found in 60 second. ",
    "[rank5]:[E1023 ProcessGroupNCCL.cpp:629] [Rank 5] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=9141, OpType=_ALLGATHER_BASE, Timeout(ms)=600000) ran for 600020 "
    "milliseconds before timing out.",
])
def test_a_hang_marker_after_ready_is_hung_naming_it(marker: str) -> None:
    ex = explain([*READY, marker])
    assert ex.outcome == "hung"
    assert ex.root_cause is not None and ex.root_cause.kind is hang_marker(marker)
    assert "hang marker:" in "\n".join(explanation_lines(ex))


def test_a_watchdog_that_kills_its_process_is_still_the_hangs_doing() -> None:
    tag = "[2026-01-29 13:12:37 PP1 TP1] "
    ex = explain([f"{tag}Scheduler watchdog timeout (self.watchdog_timeout=300, "
                  "self.soft=False)",
                  "[2026-01-29 13:12:42] Received sigquit from a child process. It usually "
                  "means the child failed."], engine="sglang")
    assert ex.outcome == "hung" and ex.root_cause is not None
    assert ex.root_cause.line.startswith("Scheduler watchdog timeout")
    assert ex.root_cause.process == "scheduler_PP1_TP1"


def test_a_crash_before_the_marker_is_a_crash() -> None:
    log = [*READY, ec("Traceback (most recent call last):"),
           ec('  File "/v/vllm/v1/engine/core.py", line 1, in step'),
           ec("RuntimeError: CUDA error: an illegal memory access was encountered"),
           ec(SHM, "INFO")]
    ex = explain(log)
    assert ex.outcome == "crashed" and ex.root_cause is not None
    assert ex.root_cause.kind is by_id("cuda_env")


def test_a_heartbeat_the_server_recovers_from_is_no_hang() -> None:
    serving = api("Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: "
                  "5.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs")
    assert explain([*READY, ec(SHM, "INFO"), serving]).outcome == "ready"


def test_waiting_for_the_engine_is_a_hang_only_when_it_repeats() -> None:
    wait = api("Waiting for 1 local, 0 remote core engine proc(s) to start.", "DEBUG")
    assert explain([*START, *[wait] * 5]).outcome == "unknown"
    ex = explain([*START, *[wait] * 6])
    assert ex.outcome == "hung" and ex.root_cause is not None
    assert ex.root_cause.kind is by_id("engine_wait")


PG_WAIT = ("INFO 04-01 02:46:{s:02d} ray_utils.py:214] Waiting for creating a placement group "
           "of specs for {n} seconds. specs=[{{'GPU': 1.0}}, {{'GPU': 1.0}}]. Check `ray status` "
           "to see if you have enough resources.")


def test_waiting_for_a_ray_placement_group_is_a_hang_until_it_is_placed() -> None:
    warn = ("WARNING 04-01 02:45:50 ray_utils.py:320] The number of required GPUs exceeds the "
            "total number of available GPUs in the placement group.")
    ex = explain([warn, PG_WAIT.format(s=0, n=10), PG_WAIT.format(s=20, n=30)])
    assert ex.outcome == "hung" and ex.root_cause is not None
    assert ex.root_cause.kind is by_id("ray_placement")
    assert "for 10 seconds" in ex.root_cause.line
    assert "ray status" in hint_for(ex.root_cause.kind, ex.root_cause.line)
    # placed after a while (a node joined late): the run goes on to serve
    assert explain([*START, PG_WAIT.format(s=0, n=10), *READY[len(START):]]).outcome == "ready"


def test_an_offline_run_that_generates_is_ready() -> None:
    """`LLM.generate`'s progress bar: the engine is up and working, no server to answer."""
    log = ["INFO 04-03 14:16:33 model_runner.py:1430] Graph capturing finished in 14 secs.",
           "Processed prompts: 0it [00:00, ?it/s, est. speed input: 0.00 toks/s]"]
    ex = explain(log)
    assert ex.outcome == "ready" and ex.to_json()["last_phase"] == "serving"


def test_a_qualified_exception_after_a_cut_traceback_is_the_cause() -> None:
    """A library's own exception class need not end in Error: `pkg.mod.Name: message`."""
    log = ['    raise OutOfResources(self.metadata.shared, max_shared, "shared memory")',
           "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: "
           "131072, Hardware limit: 65536.",
           "",
           "[2024-12-07 02:54:42 TP3] Scheduler hit an exception: Traceback (most recent call "
           "last):",
           '  File "/sgl/sglang/srt/managers/scheduler.py", line 1493, in run_scheduler_process']
    ex = explain(log, engine="sglang")
    assert ex.outcome == "crashed" and ex.root_cause is not None and not ex.root_cause.missing
    assert ex.root_cause.line.startswith("triton.runtime.errors.OutOfResources: out of resource")
    # a module's name (no class) before a colon is no exception
    assert explain(["vllm.entrypoints.openai.api_server: listening on 8000"]).root_cause is None


def test_an_exception_header_without_traceback_takes_its_reason_from_below() -> None:
    """`ImportError:` alone on its line (sgl_kernel's loader), the reason on the next one."""
    ex = explain(["ImportError:", "[sgl_kernel] CRITICAL: Could not load any common_ops library!",
                  "", "Attempted locations:"], engine="sglang")
    assert ex.outcome == "crashed" and ex.root_cause is not None
    assert ex.root_cause.line == ("ImportError: — [sgl_kernel] CRITICAL: Could not load any "
                                  "common_ops library!")
    assert ex.root_cause.kind is by_id("import")


@pytest.mark.parametrize(("line", "class_id"), [
    ('textPayload: "vllm serve: error: argument --limit-mm-per-prompt: Value image:4 cannot '
     'be converted"', "cli_args"),
    ("launch_server.py: error: unrecognized arguments: --bogus", "cli_args"),
    ("/pytorch/aten/src/ATen/native/cuda/TensorCompare.cu:112: _assert_async_cuda_kernel: "
     "block: [0,0,0], thread: [0,0,0] Assertion `probability tensor contains either `inf`, "
     "`nan` or element < 0` failed.", "device_assert"),
])
def test_a_fatal_line_on_stderr_alone_is_a_crash(line: str, class_id: str) -> None:
    """argparse's usage error exits 2, a kernel's failed assert loses the CUDA context: the
    line needs no traceback to show the process could not go on, even after serving."""
    serving = "[2026-04-13 10:35:43 PP1 ATTN_CP2 TP2] Decode batch, #running-req: 1, #queue-req: 0"
    for log in ([line], [serving, line]):
        ex = explain(log, engine="sglang")
        assert ex.outcome == "crashed" and ex.root_cause is not None
        assert ex.root_cause.kind is by_id(class_id) and ex.root_cause.line == line.strip()
    # a library's stderr that is not fatal by itself names a cause but proves no crash
    assert explain(["NCCL WARN Call to connect returned Connection refused"]).outcome == "unknown"


def test_a_request_refused_after_its_traceback_is_no_death() -> None:
    """One request's error (logged with its traceback) answered 400: the server goes on."""
    log = [*READY, "ERROR 02-08 11:19:09 serving_chat.py:193] Traceback (most recent call last):",
           'ERROR 02-08 11:19:09 serving_chat.py:193]   File "/p/json/decoder.py", line 356, in x',
           "ERROR 02-08 11:19:09 serving_chat.py:193] json.decoder.JSONDecodeError: Expecting "
           "value: line 1 column 1 (char 0)",
           'INFO:     10.0.0.5:1886 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request']
    assert explain(log).outcome == "ready"
    # a 500 is that request's failure too (issue 33): the API server that answered it is alive
    answered_500 = [*log[:-1], log[-1].replace("400 Bad Request", "500 Internal Server Error")]
    assert explain(answered_500).outcome == "ready"
    # ... unless the engine says it is dead
    dead = ("ERROR 02-08 11:19:10 async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: "
            "EngineCore encountered an issue. See stack trace (above) for the root cause.")
    assert explain([*answered_500, dead]).outcome == "crashed"


def test_sglangs_own_warmup_request_is_not_serving() -> None:
    up = ["[2025-05-14 09:31:40] INFO:     Application startup complete."]
    warmup = '[2025-05-14 09:31:41] INFO:     127.0.0.1:40 - "POST /generate HTTP/1.1" 200 OK'
    client = '[2025-05-14 09:31:43] INFO:     127.0.0.1:20 - "POST /v1/completions HTTP/1.1" 200 OK'
    assert explain([*up, warmup], engine="sglang").to_json()["last_phase"] == "api_server"
    assert explain([*up, warmup, client], engine="sglang").to_json()["last_phase"] == "serving"
    assert explain([client], engine="sglang").outcome == "ready"


# -- several services in one file --------------------------------------------------------------

def test_interleaved_compose_services_get_a_verdict_each() -> None:
    """Two real logs of the vLLM lane (a healthy start and a worker's SyntaxError),
    interleaved as docker compose prints two services; today's rules must not call the file
    ready because one service is."""
    good = (CORPUS / "vllm-lane-startup.log").read_text().splitlines()
    bad = (CORPUS / "vllm-lane-crash.log").read_text().splitlines()
    lines = []
    for i in range(max(len(good), len(bad))):
        if i < len(bad):
            lines.append(f"vllm-b-1  | {bad[i]}")
        if i < len(good):
            lines.append(f"vllm-a-1  | {good[i]}")
    ex = explain(lines)
    assert ex.services is not None and set(ex.services) == {"vllm-a", "vllm-b"}
    # the healthy start ends in the lane's SIGTERM: an orderly shutdown (issue 28's `stopped`)
    assert ex.services["vllm-a"].outcome == "stopped"
    assert ex.services["vllm-b"].outcome == "crashed"
    assert ex.outcome == "crashed" and ex.root_cause is not None
    assert ex.root_cause.line.startswith("SyntaxError: trailing comma")
    assert ex.to_json()["services"]["vllm-a"]["outcome"] == "stopped"
    text = "\n".join(explanation_lines(ex))
    assert "service vllm-a:" in text and "service vllm-b:" in text


# -- an orderly shutdown -------------------------------------------------------------------------

_SERVING = ["(APIServer pid=7) INFO:     Application startup complete.",
            '(APIServer pid=7) INFO:     127.0.0.1:50 - "POST /v1/completions HTTP/1.1" 200 OK']
_SIGTERM = ["(APIServer pid=7) INFO 12-03 08:25:58 [launcher.py:254] [shutdown] API server: "
            "shutdown triggered",
            "(APIServer pid=7) INFO:     Shutting down",
            "(APIServer pid=7) INFO:     Finished server process [7]",
            "nanobind: leaked 4 instances!"]
_CTRL_C = ["INFO:     Shutting down", "Traceback (most recent call last):",
           '  File "/venv/lib/python3.12/site-packages/uvloop/__init__.py", line 61, in wrapper',
           "    return await main", "KeyboardInterrupt"]
_CRASH = ["(EngineCore pid=9) ERROR 12-03 08:25:50 [core.py:900] EngineCore encountered a fatal "
          "error.", "(EngineCore pid=9) ERROR 12-03 08:25:50 [core.py:900] Traceback (most "
          "recent call last):",
          '(EngineCore pid=9) ERROR 12-03 08:25:50 [core.py:900]   File "/v/core.py", line 8, '
          "in run", "(EngineCore pid=9) ERROR 12-03 08:25:50 [core.py:900] torch.OutOfMemoryError: "
          "CUDA out of memory. Tried to allocate 2.00 GiB"]


@pytest.mark.parametrize(("lines", "outcome"), [
    (_SERVING + _SIGTERM, "stopped"),
    (_SERVING + _CTRL_C, "stopped"),  # Ctrl-C: its KeyboardInterrupt is a consequence
    (_SERVING + _CRASH + _SIGTERM, "crashed"),  # a failure before the shutdown: its cause
    (_SERVING + _SIGTERM + _SERVING, "ready"),  # launched again in the same file
    (_SIGTERM, "unknown"),  # never ready: a shutdown of what?
])
def test_an_orderly_shutdown_after_ready_is_stopped(lines: list[str], outcome: str) -> None:
    ex = explain(lines)
    assert ex.outcome == outcome
    assert (ex.root_cause is None) == (outcome in ("stopped", "ready", "unknown"))


_WATCHDOG = ("[rank1]:[E1206 02:10:11.123 ProcessGroupNCCL.cpp:1595] [PG ID 2 PG GUID 3 Rank 1] "
             "Process group watchdog thread terminated with exception: {}")


@pytest.mark.parametrize(("error", "outcome"), [
    ("CUDA error: an illegal memory access was encountered", "crashed"),
    ("CUDA error: uncorrectable ECC error encountered", "crashed"),
    ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
     "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.", "hung"),
])
def test_a_watchdog_that_reports_a_device_fault_is_a_crash_not_a_hang(error: str,
                                                                     outcome: str) -> None:
    """NCCL's watchdog ends on the error it caught: a collective's timeout is a hang; a CUDA
    or ECC fault is a crash, and std::terminate's what() line names it."""
    what = f"  what():  [PG ID 2 PG GUID 3 Rank 1] Process group watchdog thread terminated with " \
           f"exception: {error}"
    ex = explain([*_SERVING, _WATCHDOG.format(error),
                  "terminate called after throwing an instance of 'c10::DistBackendError'", what,
                  "Fatal Python error: Aborted"])
    assert ex.outcome == outcome
    if outcome == "crashed":
        assert ex.root_cause is not None and ex.root_cause.line == what.strip()
