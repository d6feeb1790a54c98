"""A log's wrapper learnt from its own lines (tui/core/logwrap.py): wrappers no list names are
peeled, the engines' own formats never are, and the reading does not depend on the chunks."""

from __future__ import annotations

import pytest

from tui.core.logchunk import ChunkReader, LineChunk
from tui.core.logline import LogLine, parse_line
from tui.core.logwrap import WrapLearner
from tui.core.noise import NoiseFilter, builtin_rules

# a vLLM start-up that fails: a process prefix and header, uvicorn, a traceback (indented)
VLLM = [
    "(APIServer pid=7) INFO 03-18 11:23:40 [api_server.py:1] vLLM API server version 0.9.1",
    "INFO:     Started server process [7]",
    "(EngineCore_DP0 pid=9) ERROR 03-18 11:23:46 [core.py:700] EngineCore failed to start.",
    "Traceback (most recent call last):",
    '  File "/v/vllm/v1/engine/core.py", line 492, in __init__',
    "    self.model_executor = executor_class(vllm_config)",
    "",
    'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB "x"',
]
SGLANG = [
    "[2025-03-18 11:23:40] server_args=ServerArgs(model_path='m')",
    "[2025-03-18 11:23:41 TP0] Load weight begin. avail mem=78.00 GB",
    "[2025-03-18 11:23:42 TP1] Load weight begin. avail mem=78.00 GB",
    "[2025-03-18 11:23:43 DP0 TP3 EP3] Scheduler hit an exception: Traceback (most recent "
    "call last):",
]


def _stamp(i: int) -> str:
    return f"11:{23 + i // 60:02d}:{i % 60:02d}"


# wrappers none of the reader's named fast paths knew (the first three), and ones it did
WRAPPERS = {
    "journald-no-host": lambda i: f"Mar 18 {_stamp(i)} vllm-serve[931930]: ",
    "user-logging": lambda i: (f"[2025-03-18 {_stamp(i)},{i:03d}] [{('INFO', 'ERROR')[i % 2]}] "
                               "[MainThread] [vllm.serve] >>> "),
    "viewer-margin": lambda i: f"  | 2025-03-18T{_stamp(i)}Z | ",
    "loguru": lambda i: f"2025-03-18 {_stamp(i)}.{i:03d} | INFO     | relay:pump:42 - ",
    "short-iso": lambda i: f"2025-03-18T{_stamp(i)}+0000 gpu-node-3 vllm-serve[931930]: ",
    "box-margin": lambda i: f"│ {_stamp(i)} │ ",
    "python-default": lambda i: f"2025-03-18 {_stamp(i)},{i:03d} - relay - INFO - ",
    "zone-name": lambda i: f"2025-03-18 {_stamp(i)}.{i:03d} UTC ",
    "epoch": lambda i: f"{1742296000 + i}.{i:03d} worker-3 ",
    "journald": lambda i: f"Mar 18 {_stamp(i)} gpu-node-3 vllm-serve[931930]: ",
    "kubectl": lambda i: f"2025-03-18T{_stamp(i)}.123456789Z ",
}


def _read(raws: list[str], engine: str = "vllm", chunk: int | None = None) -> list[LogLine]:
    """Every line as the reader decodes it, fed in chunks of `chunk` lines (all at once)."""
    reader = ChunkReader(engine, NoiseFilter(builtin_rules(engine)))
    out: list[LogLine] = []
    step = chunk or len(raws)
    for at in range(0, len(raws), step):
        read = LineChunk([at + i for i in range(len(raws[at:at + step]))], raws[at:at + step])
        reader.read_chunk(read, False)
        out += [read.line(i) for i in range(len(read))]
    return out


def _fields(line: LogLine) -> tuple[object, ...]:
    return line.proc, line.pid, line.level, line.message


@pytest.mark.parametrize("name", [n for n in WRAPPERS if n != "epoch"])
def test_an_unlisted_wrapper_is_learnt_and_peeled(name: str) -> None:
    wrap = WRAPPERS[name]
    lines = _read([wrap(i) + raw for i, raw in enumerate(VLLM)])
    assert [_fields(line) for line in lines] == [_fields(parse_line(raw)) for raw in VLLM]


def test_a_wrapper_without_a_closing_mark_is_peeled_after_its_stamp() -> None:
    """`<epoch> worker-3 ` ends in a word: only its stamp is a wrapper's end; what follows
    stays (the reader never takes a word for a wrapper by itself)."""
    lines = _read([WRAPPERS["epoch"](i) + raw for i, raw in enumerate(VLLM)])
    assert lines[3].message == "worker-3 Traceback (most recent call last):"
    assert lines[4].message == 'worker-3   File "/v/vllm/v1/engine/core.py", line 492, in __init__'
    assert (lines[2].proc, lines[2].level) == ("EngineCore_DP0", "ERROR")


def test_a_csv_export_is_unquoted() -> None:
    raws = [f'"2025-03-18T{_stamp(i)}.123Z","' + raw.replace('"', '""') + '"'
            for i, raw in enumerate(VLLM)]
    assert [_fields(line) for line in _read(raws)] == [_fields(parse_line(r)) for r in VLLM]


def test_the_engines_own_formats_are_never_peeled() -> None:
    """vLLM's prefix and header, uvicorn's level, a traceback: no wrapper is learnt. SGLang's
    rank-tagged stamp is never peeled (the launcher's untagged `[date time] ` is a stamp as
    the named wrappers always read it)."""
    assert WrapLearner().follow(VLLM * 20) == [(0, None)]
    assert [_fields(line) for line in _read(VLLM)] == [_fields(parse_line(raw)) for raw in VLLM]
    lines = _read(SGLANG, "sglang")
    assert [_fields(line) for line in lines] == [_fields(parse_line(raw)) for raw in SGLANG]
    assert [line.proc for line in lines] == [None, "scheduler_TP0", "scheduler_TP1",
                                             "scheduler_DP0_TP3_EP3"]


def test_only_the_outer_wrapper_of_sglangs_own_stamp_is_peeled() -> None:
    wrap = WRAPPERS["journald-no-host"]
    lines = _read([wrap(i) + raw for i, raw in enumerate(SGLANG)], "sglang")
    assert [_fields(line) for line in lines] == [_fields(parse_line(raw)) for raw in SGLANG]
    assert lines[3].proc == "scheduler_DP0_TP3_EP3"


def test_the_first_line_alone_is_peeled_only_with_a_stamp() -> None:
    """Before a second line can agree, a line's own start is its wrapper only when it holds a
    time: a C++ abort's `what():  [PG ID 2 ...] ` is the message, not a wrapper."""
    bare = "  what():  [PG ID 2 PG GUID 3 Rank 1] Process group watchdog thread terminated"
    assert _fields(_read([bare])[0]) == _fields(parse_line(bare))
    wrapped = "Mar 18 11:23:46 vllm-serve[931930]: " + bare
    assert _fields(_read([wrapped])[0]) == _fields(parse_line(bare))


@pytest.mark.parametrize("chunk", [1, 2, 7, 64])
def test_the_reading_does_not_depend_on_the_chunks(chunk: int) -> None:
    """Learnt as lines arrive: a wrapper that changes half-way (a relay restarted) is followed,
    and one line at a time reads as the whole file does."""
    raws = [WRAPPERS["journald-no-host"](i) + VLLM[i % len(VLLM)] for i in range(200)]
    raws += [WRAPPERS["user-logging"](i) + VLLM[i % len(VLLM)] for i in range(300)]
    whole = _read(raws)
    assert [_fields(line) for line in _read(raws, chunk=chunk)] == [
        _fields(line) for line in whole]
    assert [_fields(line) for line in whole[-100:]] == [
        _fields(parse_line(VLLM[i % len(VLLM)])) for i in range(200, 300)]


def test_torchs_own_cpp_log_header_is_never_peeled() -> None:
    """c10's `[E1001 16:06:04.537131842 ProcessGroupNCCL.cpp:607] ` repeats on an NCCL
    watchdog's every line, as a wrapper would: it is torch's record, read as written."""
    raws = [f"[rank2]:[E1001 16:06:{i:02d}.537131842 ProcessGroupNCCL.cpp:607] [Rank 2] "
            f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={i})"
            for i in range(12)]
    assert WrapLearner().follow(raws) == [(0, None)]
    assert [_fields(line) for line in _read(raws)] == [_fields(parse_line(raw)) for raw in raws]
