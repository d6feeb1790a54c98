"""Decoding raw log lines: escapes, wrappers, process prefixes across vLLM versions, headers."""

from __future__ import annotations

import dataclasses

import pytest

from tui.core.logline import LogLine, keep_colours, parse_line, parse_lines, strip_escapes

CYAN, RESET = "\x1b[1;36m", "\x1b[0;0m"


@pytest.mark.parametrize(("raw", "expected"), [
    ("plain text", "plain text"),
    (f"{CYAN}(APIServer pid=1){RESET} INFO", "(APIServer pid=1) INFO"),
    ("a\x1b[38;5;196mb\x1b[38:2::255:0:0mc\x1b[0m", "abc"),
    ("\x1b]0;pwned title\x07after", "after"),  # OSC title, BEL-terminated
    ("\x1b]2;title\x1b\\after", "after"),  # OSC title, ST-terminated
    ("x\x1b]52;c;Y3VybCBldmlsLnNo\x07y", "xy"),  # OSC 52 clipboard write
    ("x\x1b]8;;http://e.vil\x1b\\link\x1b]8;;\x1b\\y", "xlinky"),  # hyperlink
    ("\x1b[2J\x1b[Hclear", "clear"),  # screen clear + cursor home
    ("up\x1b[2A\x1b[10Cright\x1b[K", "upright"),  # cursor moves, erase line
    ("\x1b(Bcharset\x1b7saved\x1b8", "charsetsaved"),  # charset select, DECSC/DECRC
    ("\x1bPq#0;2;0;0;0\x1b\\sixel", "sixel"),  # DCS string
    ("nul\x00bel\x07bs\x08del\x7fend", "nulbelbsdelend"),
    ("tab\tkept", "tab\tkept"),
    ("c1\x85next\x9b31mcsi", "c1nextcsi"),  # C1 NEL, 8-bit CSI
    ("x\x9d0;title\x9cy", "xy"),  # 8-bit OSC
    ("unterminated osc \x1b]0;title", "unterminated osc "),
    ("lone escape at end\x1b", "lone escape at end"),
    ("half csi \x1b[31", "half csi "),
    ("bar 10%\rbar 50%\rbar 100%", "bar 100%"),  # tqdm redraw: last segment
    ("done\r", "done"),  # CRLF leftover
    ("text\r\x1b[K\r", "text"),  # a redraw that only erased: last visible segment
])
def test_strip_escapes(raw: str, expected: str) -> None:
    assert strip_escapes(raw) == expected


@pytest.mark.parametrize(("raw", "expected"), [
    (f"{CYAN}(APIServer pid=1){RESET} INFO", f"{CYAN}(APIServer pid=1){RESET} INFO"),
    ("\x1b[38;5;196m256\x1b[38:2::1:2:3mtrue\x1b[m",
     "\x1b[38;5;196m256\x1b[38:2::1:2:3mtrue\x1b[m"),
    ("\x1b]0;title\x07\x1b[31mred", "\x1b[31mred"),
    ("\x1b]52;c;ZXZpbA==\x07x", "x"),
    ("\x1b[2J\x1b[1;1Hx\x1b[?25l", "x"),
    ("bell\x07 nul\x00 del\x7f c1\x85", "bell nul del c1"),
    ("\x1b[31", ""),  # an incomplete SGR is not kept
    ("\x1b[31mold\r\x1b[32mnew", "\x1b[32mnew"),
])
def test_keep_colours(raw: str, expected: str) -> None:
    assert keep_colours(raw) == expected


# (raw, proc, pid, level, message)
PARSE_CASES = [
    # line anatomy across versions
    ("(APIServer pid=1169773) INFO 03-20 02:24:49 [utils.py:302] non-default args: {}",
     "APIServer", 1169773, "INFO", "non-default args: {}"),
    ("(APIServer_0 pid=12) INFO 03-20 02:24:49 [utils.py:302] hello",
     "APIServer_0", 12, "INFO", "hello"),
    ("(EngineCore_0 pid=7) WARNING 08-01 10:00:00 [core.py:74] x", "EngineCore_0", 7, "WARNING",
     "x"),
    ("(EngineCore_DP0 pid=364602) INFO 09-04 17:38:34 [core.py:77] Initializing",
     "EngineCore_DP0", 364602, "INFO", "Initializing"),
    ("(EngineCore pid=32697) ERROR 01-02 10:00:00 [core.py:1510] EngineCore failed to start.",
     "EngineCore", 32697, "ERROR", "EngineCore failed to start."),
    ("(Worker_TP0 pid=5) INFO 01-02 10:00:00 [gpu_worker.py:298] a", "Worker_TP0", 5, "INFO", "a"),
    ("(Worker_TP0_EP0 pid=5) INFO 01-02 10:00:00 [a.py:1] b", "Worker_TP0_EP0", 5, "INFO", "b"),
    ("(Worker_DP1_TP2_EP6 pid=5) DEBUG 01-02 10:00:00 [a.py:1] c",
     "Worker_DP1_TP2_EP6", 5, "DEBUG", "c"),
    ("(VllmWorker rank=3 pid=99) INFO 05-01 10:00:00 [a.py:1] d", "VllmWorker rank=3", 99, "INFO",
     "d"),
    ("(VllmWorker TP2 pid=98) INFO 05-01 10:00:00 [a.py:1] e", "VllmWorker TP2", 98, "INFO", "e"),
    ("(VllmWorker-0 pid=1200) ERROR 01-02 10:00:00 [multiproc_executor.py:953] WorkerProc failed",
     "VllmWorker-0", 1200, "ERROR", "WorkerProc failed"),
    ("(VllmWorkerProcess pid=44) INFO 05-01 10:00:00 [a.py:1] f", "VllmWorkerProcess", 44, "INFO",
     "f"),
    ("(RayWorkerWrapper pid=4242, ip=10.0.0.5) INFO 05-01 10:00:00 [a.py:1] g",
     "RayWorkerWrapper", 4242, "INFO", "g"),
    ("(Worker pid=235952) INFO 05-01 10:00:00 [a.py:1] h", "Worker", 235952, "INFO", "h"),
    # nested: the worker line re-emitted through the engine core's stream
    ("(EngineCore_DP0 pid=235945) (Worker pid=235952) ERROR 05-01 10:00:00 [a.py:1] boom",
     "Worker", 235952, "ERROR", "boom"),
    # the first line of a paste whose "(" was lost
    ("APIServer pid=17) INFO 01-01 00:00:00 [a.py:1] lost paren", "APIServer", 17, "INFO",
     "lost paren"),
    # colour (older builds, or a TTY)
    (f"{CYAN}(EngineCore_DP0 pid=1){RESET} INFO 01-01 00:00:00 [a.py:1] coloured",
     "EngineCore_DP0", 1, "INFO", "coloured"),
    # header variants: no brackets, relative path, millis, no prefix
    ("INFO 09-04 17:38:34 launcher.py:64] Route: /health", None, None, "INFO", "Route: /health"),
    ("(Worker_TP0 pid=1) INFO 01-01 00:00:00 [v1/worker/gpu_model_runner.py:2641] Loading drafter",
     "Worker_TP0", 1, "INFO", "Loading drafter"),
    ("(EngineCore pid=1) INFO 01-01 00:00:00 multiproc_executor.py:944] no bracket",
     "EngineCore", 1, "INFO", "no bracket"),
    ("WARN 01-01 00:00:00.123 [a.py:1] millis", None, None, "WARNING", "millis"),
    # uvicorn, bare and with the APIServer prefix
    ("INFO:     Application startup complete.", None, None, "INFO",
     "Application startup complete."),
    ("(APIServer pid=1) INFO:     Started server process [1]", "APIServer", 1, "INFO",
     "Started server process [1]"),
    ("ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000)", None,
     None, "ERROR", "[Errno 98] error while attempting to bind on address ('0.0.0.0', 8000)"),
    # the banner keeps its art (one separating space removed, not all leading spaces)
    ("(APIServer pid=1) INFO 03-20 02:24:49 [utils.py:302]  ▄▄ ▄█ █  version 0.17.1", "APIServer",
     1, "INFO", " ▄▄ ▄█ █  version 0.17.1"),
    # traceback lines keep their indentation, with and without a logger header
    ('(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:946]   File "/x.py", line 3, in f',
     "EngineCore_DP0", 1, "ERROR", '  File "/x.py", line 3, in f'),
    ('  File "/x.py", line 3, in f', None, None, None, '  File "/x.py", line 3, in f'),
    ("Traceback (most recent call last):", None, None, None, "Traceback (most recent call last):"),
    ("(1, 2) is not a prefix", None, None, None, "(1, 2) is not a prefix"),
    # an empty tqdm leftover that carries only a prefix
    ("(EngineCore_DP0 pid=132) ", "EngineCore_DP0", 132, None, ""),
    ("(EngineCore_DP0 pid=132)", "EngineCore_DP0", 132, None, ""),
]


@pytest.mark.parametrize(("raw", "proc", "pid", "level", "message"), PARSE_CASES)
def test_parse_line(raw: str, proc: str | None, pid: int | None, level: str | None,
                    message: str) -> None:
    line = parse_line(raw, 42)
    assert (line.proc, line.pid, line.level, line.message) == (proc, pid, level, message)
    assert line.offset == 42 and line.raw == raw


INNER = ("(Worker_TP1 pid=530) INFO 09-05 00:38:34 [default_loader.py:267] "
         "Loading weights took 4.2 s")


@pytest.mark.parametrize("raw", [
    f"vllm-1  | {INNER}",  # docker compose
    f"vllm-server-1  | {INNER}",
    f"svc | 2024-09-05T00:38:34.123456789Z {INNER}",  # docker compose logs -t
    f"07:28:59 [INFO] [inf-job] [INFERENCE LOG] {INNER}",  # a supervisor's own logger
    f"[2024-09-05T00:38:34Z] {INNER}",  # CI
    f"2024-09-05T00:38:34.512343789Z {INNER}",  # RFC3339 container timestamps
    f"2024-09-05T00:38:34+02:00 {INNER}",
    f"Sep  5 00:38:34 gpu-node-3 vllm[4121]: {INNER}",  # syslog header
    f"#033[1;36m(Worker_TP1 pid=530)#033[0;0m {INNER.split(' ', 2)[2]} #015",  # syslog escapes
    f"Sep  5 00:38:34 gpu-node-3 vllm[4121]: #033[1;36m(Worker_TP1 pid=530)#033[0;0m "
    f"{INNER.split(' ', 2)[2]}#015",
    f"\x1b[36mvllm-1  |\x1b[0m {CYAN}(Worker_TP1 pid=530){RESET} {INNER.split(' ', 2)[2]}",
])
def test_wrappers_are_peeled(raw: str) -> None:
    line = parse_line(raw)
    assert (line.proc, line.pid, line.level) == ("Worker_TP1", 530, "INFO")
    assert line.message == "Loading weights took 4.2 s"
    assert "\x1b" not in line.plain and "#033" not in line.plain


@pytest.mark.parametrize(("raw", "level", "message"), [
    # Python logging's `%(asctime)s %(name)s %(levelname)s` around uvicorn's own record
    ("2025-03-14 06:05:36.143 uvicorn.error INFO:     Application startup complete.",
     "INFO", "Application startup complete."),
    ("2025-03-14 06:05:36.143 vllm.engine WARNING: slow", "WARNING", "slow"),
    # rich's RichHandler relaying the server's stderr: time column (blank when it repeats),
    # level column, the server's line, `file.py:N` at the right margin
    ("                    INFO     OSError: [Errno 48] Address already in use" + " " * 40
     + "local_server.py:108", None, "OSError: [Errno 48] Address already in use"),
    ("[05/05/25 16:31:14] INFO     INFO 05-05 16:31:14 [api_server.py:1] vLLM API server "
     "version 0.8.5" + " " * 12 + "local_server.py:108", "INFO", "vLLM API server version 0.8.5"),
    # a log viewer's CSV export (CloudWatch): epoch milliseconds, the line quoted, quotes
    # doubled inside
    ('1756144012376,"(EngineCore_0 pid=75) ERROR 08-25 10:46:52 [core.py:700]   File '
     '""/v/vllm/v1/engine/core.py"", line 492, in __init__"', "ERROR",
     'File "/v/vllm/v1/engine/core.py", line 492, in __init__'),
    # not rich: an indented source line, a message that merely ends in a path
    ("        raise ValueError(x)  # see a.py:12", None, "raise ValueError(x)  # see a.py:12"),
])
def test_a_loggers_name_and_richs_columns_are_peeled(raw: str, level: str | None,
                                                     message: str) -> None:
    line = parse_line(raw)
    assert (line.level, line.message.strip()) == (level, message)
    assert line.plain == raw or raw.startswith("1756")  # shown as written (CSV: unquoted)


@pytest.mark.parametrize("raw", [
    f"{CYAN}(EngineCore_DP0 pid=1){RESET} INFO 01-01 00:00:00 [a.py:1] coloured prefix",
    "\x1b[32m(EngineCore_DP0 pid=1)\x1b[0m INFO 01-01 00:00:00 [a.py:1] \x1b[1mcoloured prefix",
    f"{CYAN}(EngineCore_DP0 pid=1) INFO 01-01 00:00:00 [a.py:1] coloured prefix",  # no reset
])
def test_plain_is_the_visible_text(raw: str) -> None:
    line = parse_line(raw)
    assert line.plain == "(EngineCore_DP0 pid=1) INFO 01-01 00:00:00 [a.py:1] coloured prefix"
    assert (line.proc, line.message) == ("EngineCore_DP0", "coloured prefix")


def test_tqdm_redraw_keeps_last_segment_and_the_prefix_written_before_it() -> None:
    raw = ("(EngineCore_DP0 pid=132) \rCapturing CUDA graphs:   0%|          | 0/67"
           "\rCapturing CUDA graphs:  50%|█████     | 33/67"
           "\rCapturing CUDA graphs: 100%|██████████| 67/67 [00:05<00:00, 12.6it/s]")
    line = parse_line(raw)
    assert line.message.startswith("Capturing CUDA graphs: 100%")
    assert (line.proc, line.pid) == ("EngineCore_DP0", 132)
    assert line.plain.startswith("(EngineCore_DP0 pid=132) Capturing CUDA graphs: 100%")
    assert "\r" not in line.plain


def test_tqdm_without_prefix_and_all_blank_segments() -> None:
    bare = parse_line("Loading safetensors checkpoint shards:  67% Completed | 2/3\r")
    assert bare.proc is None and bare.message.endswith("2/3")
    assert parse_line("\r\x1b[A\r   ").message == ""


def test_record_sharing_a_physical_line_with_a_tqdm_bar() -> None:
    line = parse_line("Loading safetensors checkpoint shards: 100% Completed | 3/3 [00:02<00:00]"
                      "(EngineCore_DP0 pid=1) INFO 01-01 00:00:00 [core.py:1] after the bar")
    assert (line.proc, line.level, line.message) == ("EngineCore_DP0", "INFO", "after the bar")


def test_newline_formatter_crlf_and_trailing_newline() -> None:
    # vLLM's NewLineFormatter ends the lines of a multi-line record with "\r\n"
    line = parse_line("(Worker pid=3) ERROR 01-01 00:00:00 [a.py:1] Traceback (most recent call"
                      " last):\r\n")
    assert line.message == "Traceback (most recent call last):"
    assert line.proc == "Worker"


def test_logline_is_frozen_and_comparable() -> None:
    a = parse_line("(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] same", 3)
    b = parse_line("(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] same", 3)
    assert type(a) is LogLine and isinstance(a, LogLine)
    assert a == b and hash(a) == hash(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.message = "changed"  # type: ignore[misc]
    assert dataclasses.replace(a, offset=9).offset == 9


def test_non_prefix_parentheses_do_not_pollute_later_lines() -> None:
    # the prefix cache must not turn one line's non-prefix into the next line's prefix
    for _ in range(3):
        assert parse_line("(most recent call) x").proc is None
    assert parse_line("(APIServer pid=5) INFO 01-01 00:00:00 [a.py:1] y").pid == 5


def test_the_chunk_path_reads_every_corpus_line_as_the_line_path_does() -> None:
    """parse_lines' shortcuts (a known prefix and header; a line with nothing to decode) give
    what parse_line gives, on every line of the real-log corpus (all its shapes), twice: the
    second time with the prefix and header caches warm."""
    from pathlib import Path

    raws = [raw for log in sorted((Path(__file__).parent / "corpus" / "logs").glob("*.log"))
            for raw in log.read_bytes().decode("utf-8", "replace").split("\n")]
    pairs = list(enumerate(raws * 2))
    assert parse_lines(pairs) == [parse_line(raw, offset) for offset, raw in pairs]


def test_a_line_seen_again_is_decoded_alike_at_its_own_offset() -> None:
    """A busy log repeats lines word for word: each repeat is its own line (its offset, its
    raw text), decoded as the first was, and the memory of them stays bounded."""
    from tui.core import logline

    raw = "(APIServer pid=5) WARNING 09-04 17:38:34 [utils.py:238] `torch_dtype` is deprecated!"
    lines = parse_lines([(0, raw), (100, raw), (200, "  warnings.warn("), (300, raw)])
    assert [x.offset for x in lines] == [0, 100, 200, 300]
    assert lines == [parse_line(r, o) for o, r in [(0, raw), (100, raw),
                                                     (200, "  warnings.warn("), (300, raw)]]
    assert all(type(x) is LogLine for x in lines)
    parse_lines([(i, f"(APIServer pid=5) INFO 09-04 17:38:34 [a.py:1] {i}")
                 for i in range(2 * logline._DECODED_MAX)])
    assert len(logline._DECODED) <= logline._DECODED_MAX
