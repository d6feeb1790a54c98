"""Native crashes read as crashes, their own first line the cause (issue 33): a library's signal
handler, glibc's aborts, a device-side assertion, a compiler's diagnostic, faulthandler's fatal
error with the stack it prints naming where; and exceptions carried by a wrapper (Ray's task
error, an exception raised again with the original's message inside) never chosen over the
exception they carry. Each shape is the one the library prints (UCX's ucs/debug signal handler,
glibc's malloc and stack protector, the CUDA/HIP runtime's device assert, gcc/nvcc, CPython's
faulthandler, Ray's RayTaskError, vLLM's model_runner_base re-raise)."""

from __future__ import annotations

import pytest

from tui.core.explain import explain, explanation_lines
from tui.core.failures import by_id

SERVING = [
    "(APIServer pid=88) INFO:     Application startup complete.",
    "(APIServer pid=88) INFO 06-01 10:12:30 [loggers.py:123] Engine 000: Avg prompt throughput: "
    "512.0 tokens/s, Avg generation throughput: 80.0 tokens/s, Running: 4 reqs, Waiting: 0 reqs",
]
FAULT_STACK = [
    "",
    "Thread 0x00007f2a1bfff640 (most recent call first):",
    '  File "/usr/lib/python3.12/threading.py", line 359 in wait',
    '  File "/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 802 in '
    "process_output_sockets",
    "",
    "Current thread 0x00007f2b9d7fe740 (most recent call first):",
    '  File "/venv/lib/python3.12/site-packages/torch/cuda/graphs.py", line 88 in replay',
    '  File "/venv/lib/python3.12/site-packages/vllm/compilation/cuda_graph.py", line 190 in '
    "__call__",
    '  File "/venv/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line 1650 '
    "in execute_model",
    "",
    "Extension modules: numpy._core._multiarray_umath, torch._C, msgspec._core (total: 61)",
]
UCX = ("[gpu-node-3:48211:0:48390] Caught signal 11 (Segmentation fault: address not mapped to "
       "object at address 0x7f2b00000010)")


def _cause(lines: list[str]) -> tuple[str, str | None, str | None]:
    ex = explain(lines)
    assert ex.outcome == "crashed", ex
    cause = ex.root_cause
    assert cause is not None and not cause.missing
    return cause.line, cause.kind.id if cause.kind else None, cause.deepest_frame


def test_a_signal_handlers_own_report_is_the_cause_not_faulthandlers_line() -> None:
    log = [*SERVING, UCX, "==== backtrace (tid:  48390) ====",
           " 0  /usr/lib/libucs.so.0(ucs_handle_error+0x2dc) [0x7f2b8a1b2e4c]",
           " 1  /usr/lib/libucs.so.0(+0x2f11c) [0x7f2b8a1b311c]",
           "=================================",
           "Fatal Python error: Segmentation fault", *FAULT_STACK]
    line, kind, _ = _cause(log)
    assert line == UCX and kind == "native_crash"


@pytest.mark.parametrize("line", [
    "*** stack smashing detected ***: terminated",
    "double free or corruption (out)",
    "malloc(): unaligned tcache chunk detected",
    "free(): invalid pointer",
])
def test_glibcs_own_abort_is_the_cause_before_the_shells_word(line: str) -> None:
    log = [*SERVING, line, "Fatal Python error: Aborted", *FAULT_STACK,
           "./serve.sh: line 12:  4012 Aborted                 (core dumped) vllm serve m"]
    assert _cause(log)[:2] == (line, "native_crash")


def test_a_device_side_assertion_on_hip_is_the_cause_not_the_abort() -> None:
    assert_line = ("/opt/vllm/csrc/moe/topk_softmax_kernels.hip:512: void topkGatingSoftmax(): "
                   "block: [12,0,0], thread: [3,0,0] Assertion `expert < num_experts` failed.")
    log = [*SERVING, assert_line, assert_line.replace("thread: [3,0,0]", "thread: [4,0,0]"),
           "Fatal Python error: Aborted", *FAULT_STACK]
    assert _cause(log)[:2] == (assert_line, "device_assert")


def test_a_compilers_error_is_the_cause_not_the_builders_generic_failure() -> None:
    diag = ("/root/.cache/torch_extensions/py312_cu124/fused_moe/fused_moe.cu(88): error: "
            'identifier "__hmul2_rn" is undefined')
    log = ["[1/2] /usr/local/cuda/bin/nvcc -c fused_moe.cu -o fused_moe.cuda.o",
           "FAILED: fused_moe.cuda.o",
           diag,
           "/root/.cache/torch_extensions/py312_cu124/fused_moe/fused_moe.cpp:12:5: error: "
           "'at::Half' has not been declared",
           "ninja: build stopped: subcommand failed.",
           "Traceback (most recent call last):",
           '  File "/venv/lib/python3.12/site-packages/torch/utils/cpp_extension.py", line 2100, '
           "in _run_ninja_build",
           "subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit "
           "status 1.",
           "",
           "The above exception was the direct cause of the following exception:",
           "",
           "Traceback (most recent call last):",
           '  File "/venv/lib/python3.12/site-packages/torch/utils/cpp_extension.py", line 2116, '
           "in _run_ninja_build",
           "RuntimeError: Error building extension 'fused_moe'"]
    line, kind, _ = _cause(log)
    assert line == diag and kind == "build"
    assert by_id("build").hint


def test_faulthandlers_fatal_error_names_where_the_crashing_thread_was() -> None:
    log = [*SERVING, "Fatal Python error: Segmentation fault", *FAULT_STACK]
    line, kind, where = _cause(log)
    assert line == "Fatal Python error: Segmentation fault" and kind == "native_crash"
    # the `Current thread`'s innermost frame of vLLM's own code, not another thread's
    assert where == "vllm/compilation/cuda_graph.py:190 in __call__"
    text = "\n".join(explanation_lines(explain(log)))
    assert "where:         vllm/compilation/cuda_graph.py:190 in __call__" in text


# -- wrappers that repeat an exception ---------------------------------------------------------

ORIGINAL = "IndexError: index 1024 is out of bounds for dimension 0 with size 1024"
DRIVER = "ERROR 06-01 10:00:01 [async_llm_engine.py:64] "
WORKER = "(RayWorkerWrapper pid=77, ip=10.0.0.3) ERROR 06-01 10:00:00 [worker_base.py:620] "
RAY_DRIVER = [
    f"{DRIVER}Engine background task failed",
    f"{DRIVER}Traceback (most recent call last):",
    f'{DRIVER}  File "/v/vllm/engine/async_llm_engine.py", line 54, in _log_task_completion',
    f"{DRIVER}ray.exceptions.RayTaskError(IndexError): ray::RayWorkerWrapper.execute_method() "
    "(pid=77, ip=10.0.0.3, actor_id=a1, repr=<vllm.executor.ray_utils.RayWorkerWrapper object "
    "at 0x7f1c2d3e4f50>)",
    f'{DRIVER}  File "/v/vllm/worker/worker_base.py", line 612, in execute_method',
    f"{DRIVER}    raise e",
    f"{DRIVER}IndexError: Error in model execution: index 1024 is out of bounds for dimension 0 "
    "with size 1024",
]
RAY_WORKER = [
    f"{WORKER}Error executing method 'execute_model'. This might cause deadlock in distributed "
    "execution.",
    f"{WORKER}Traceback (most recent call last):",
    f'{WORKER}  File "/v/vllm/worker/model_runner.py", line 1700, in execute_model',
    f"{WORKER}{ORIGINAL}",
]


@pytest.mark.parametrize("log", [RAY_DRIVER + RAY_WORKER, RAY_WORKER + RAY_DRIVER],
                         ids=["driver-first", "worker-first"])
def test_rays_task_error_and_a_re_raise_never_beat_the_exception_they_carry(
        log: list[str]) -> None:
    """Ray streams a worker's own lines late: the driver's RayTaskError (with the wrapper's
    repr) and vLLM's `Error in model execution: <original>` re-raise may come first."""
    ex = explain(log)
    assert ex.outcome == "crashed" and ex.root_cause is not None
    assert ex.root_cause.line == ORIGINAL


def test_an_exception_raised_again_inside_anothers_message_is_not_the_cause() -> None:
    wrapped = (f"RuntimeError: Worker failed with error 'IndexError('Error in model execution: "
               f"{ORIGINAL.split(': ', 1)[1]}')', please check the stack trace above")
    log = ["Traceback (most recent call last):", '  File "/v/vllm/v1/executor/ray.py", line 1, '
           "in run", wrapped, "Traceback (most recent call last):",
           '  File "/v/vllm/v1/worker/gpu_model_runner.py", line 2, in execute_model', ORIGINAL]
    ex = explain(log)
    assert ex.root_cause is not None and ex.root_cause.line == ORIGINAL


def test_chained_exceptions_name_the_first_even_when_its_message_breaks_the_traceback() -> None:
    """CUDA's message goes on over unindented lines, which end the first traceback before
    `During handling ...`: the chain is still read in its order, the first exception first."""
    log = ["Traceback (most recent call last):",
           '  File "/v/vllm/v1/worker/gpu_model_runner.py", line 1, in execute_model',
           "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
           "CUDA kernel errors might be asynchronously reported at some other API call, so the "
           "stacktrace below might be incorrect.",
           "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
           "",
           "During handling of the above exception, another exception occurred:",
           "",
           "Traceback (most recent call last):",
           '  File "/v/vllm/v1/worker/gpu_model_runner.py", line 9, in execute_model',
           "RuntimeError: Error in model execution: CUDA error: an illegal memory access was "
           "encountered"]
    ex = explain(log)
    assert ex.root_cause is not None
    assert ex.root_cause.line == ("torch.AcceleratorError: CUDA error: an illegal memory access "
                                  "was encountered")


def test_a_traceback_right_after_another_is_its_own_exception_not_the_chains_next() -> None:
    """Only Python's chaining sentence joins two tracebacks: two processes' raw tracebacks one
    after the other are two exceptions, and the peer's broken pipe is not the cause."""
    log = ["Traceback (most recent call last):",
           '  File "/v/vllm/v1/engine/core_client.py", line 1, in process_outputs_socket',
           "EOFError",
           "Traceback (most recent call last):",
           '  File "/v/vllm/config/model.py", line 2, in _verify_rope_scaling',
           "ValueError: rope_scaling must have a 'factor' field"]
    ex = explain(log)
    assert ex.root_cause is not None
    assert ex.root_cause.line == "ValueError: rope_scaling must have a 'factor' field"
