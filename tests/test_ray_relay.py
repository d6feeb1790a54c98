"""What Ray's log relay does to a driver's log, read right: two writers' records interleaved on
one physical line, the relay's deduplication suffix, and the raylet's notice that a worker died
(a consequence, whose list of common causes names no class). The shapes are those the fault
lab's real Ray 2.x cluster wrote into a driver's server.log when a worker on the second host
died of a SyntaxError (the CI run of 2026-12-07: the raylet's notice was joined to the
worker's `Traceback (most recent call last):` and read as the root cause, class OOM)."""

from __future__ import annotations

from pathlib import Path

from tui.core.explain import explain, explain_file
from tui.core.failures import classify
from tui.core.logchunk import LineChunk
from tui.core.logline import parse_line

CYAN, YELLOW, GREEN, RESET = "\x1b[36m", "\x1b[33m", "\x1b[32m", "\x1b[0m"
W = f"{CYAN}(RayWorkerWrapper pid=17666, ip=10.210.12.2){RESET} "
HDR = "ERROR 12-07 19:04:27 [multiproc_executor.py:772] "
RAYLET = (f"{YELLOW}(raylet){RESET} A worker died or was killed while executing a task by an "
          "unexpected system error. To troubleshoot the problem, check the logs for the dead "
          "worker. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly "
          "exits with a connection error code 2. End of file. Some common causes include: "
          "(1) the process was killed by the OOM killer due to high memory usage, (2) ray "
          "stop --force was called, or (3) the worker crashed unexpectedly due to SIGSEGV or "
          "another unexpected error.")
TRACEBACK = [
    '  File "/opt/vllm/worker.py", line 56, in _run',
    "    self._init_model_runner()",
    '  File "/models/kimi_k25_patched.py", line 15',
    "    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model,",
    "                                                                       ^",
    "SyntaxError: trailing comma not allowed without surrounding parentheses",
]
LOG = [
    "(EngineCore_DP0 pid=17569) INFO 12-07 19:00:22 [core.py:101] Initializing a V1 LLM "
    "engine (v0.16.1) with config: model='/models/Kimi-K2.5'",
    f"{W}Loading safetensors checkpoint shards:   2% Completed | 1/64 [00:19<19:59, 19.03s/it]",
    "(EngineCore_DP0 pid=17569) ERROR 12-07 19:04:28 [multiproc_executor.py:249] Worker proc "
    "Worker_TP5 died unexpectedly (exit code: 1), shutting down executor.",
    f"{W}{HDR}WorkerProc failed to start.",
    f"{W}{HDR}Traceback (most recent call last):{RAYLET}",
    "",
    *(f"{W}{HDR}{t}" for t in TRACEBACK),
    "(EngineCore_DP0 pid=17569) ERROR 12-07 19:04:30 [core.py:1012] EngineCore failed to start.",
    "(EngineCore_DP0 pid=17569) ERROR 12-07 19:04:30 [core.py:1012] Exception: WorkerProc "
    "initialization failed due to an exception in a background process. See stack trace for "
    "root cause.",
    f"{CYAN}(RayWorkerWrapper pid=17774){RESET} {HDR}SyntaxError: trailing comma not allowed "
    f"without surrounding parentheses{GREEN} [repeated 7x across cluster]{RESET}",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
    "proc(s): {'EngineCore_DP0': 1}",
]


def test_a_worker_s_traceback_joined_by_the_raylet_s_notice_is_still_the_cause() -> None:
    ex = explain(LOG)
    assert ex.outcome == "crashed"
    assert ex.root_cause is not None
    assert ex.root_cause.line.startswith("SyntaxError: trailing comma"), ex.root_cause
    assert ex.root_cause.process == "RayWorkerWrapper"


def test_a_worker_killed_without_a_word_is_the_raylet_s_notice_not_an_oom() -> None:
    """A worker SIGKILLed says nothing; the raylet's notice is what the driver's log has."""
    log = [*LOG[:3], f"{RAYLET}",
           "(EngineCore_DP0 pid=17569) ERROR 12-07 19:04:30 [core.py:1012] EngineCore failed to "
           "start.", LOG[-1]]
    ex = explain(log)
    assert ex.outcome == "crashed"
    assert ex.root_cause is not None and "A worker died or was killed" in ex.root_cause.line
    assert ex.root_cause.kind is not None and ex.root_cause.kind.id == "ray_worker", ex


def test_the_file_reader_splits_alike_and_keeps_byte_offsets(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    # a non-ASCII line first: its offsets are counted in bytes, not characters
    text = "\n".join(["(APIServer pid=1) INFO 12-07 19:00:13 [utils.py:302] █▄ version", *LOG])
    path.write_text(text + "\n", encoding="utf-8")
    ex = explain_file(path)
    assert ex.root_cause is not None and ex.root_cause.line.startswith("SyntaxError: trailing")
    data = path.read_bytes()
    assert data[ex.root_cause.offset:].startswith(W.encode()), "the cause's offset is its line's"
    chunk = LineChunk([0, 100], ["x", f"{W}{HDR}Traceback (most recent call last):{RAYLET}"])
    assert chunk.split_interleaved([0, 1])
    assert chunk.raws == ["x", f"{W}{HDR}Traceback (most recent call last):", RAYLET]
    assert chunk.offsets[2] - chunk.offsets[1] == len(f"{W}{HDR}Traceback (most recent call "
                                                          "last):".encode())
    assert chunk.end(1) == chunk.offsets[2], "a record ends where the next one on its line starts"


def test_a_relay_prefix_after_a_wrapper_s_space_is_the_wrapper_s_line_not_a_split() -> None:
    stamped = f"2026-12-07T19:04:27.123Z {W}{HDR}Traceback (most recent call last):"
    chunk = LineChunk([0], [stamped])
    assert not chunk.split_interleaved([0])
    assert chunk.raws == [stamped]


def test_the_relay_s_repeat_count_is_not_part_of_the_line() -> None:
    line = parse_line(f"{CYAN}(RayWorkerWrapper pid=17774){RESET} {HDR}  File \"/a.py\", line 56, "
                      f"in _run{GREEN} [repeated 7x across cluster]{RESET}")
    assert line.message == '  File "/a.py", line 56, in _run'
    assert line.proc == "RayWorkerWrapper" and line.pid == 17774


def test_a_list_of_common_causes_names_no_class() -> None:
    notice = RAYLET.split(f"{RESET} ", 1)[1]
    found = classify(notice)
    assert found is not None and found.id == "ray_worker", found
    assert classify("torch.OutOfMemoryError: CUDA out of memory. This may be caused by "
                    "fragmentation").id == "oom"  # what it states before the hedge still counts
    assert classify("RuntimeError: worker failed. Possible causes: the OOM killer") is None
