"""A serving server's log firehose (simulation only: `--sim-flood` and the benchmarks).

A vLLM under load writes mostly uvicorn access lines and per-request INFO records, with the
periodic stats lines, the odd warning repeated by every worker, a Python FutureWarning and its
source line, and a deprecation notice: the mix the console's log pipeline meets at its busiest.
`flood_lines` yields that mix, deterministically, so a benchmark run is repeatable and the
`grep` it is compared with meets the same noise.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

from tui.sim import lines

# One cycle of the mix, as (process or None for an unprefixed line, level or None, message).
# The shares: 60 % access lines, 10 % request records, 10 % stats, 20 % noise and warnings.
_ACCESS = 'INFO:     127.0.0.1:{port} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
_CYCLE: tuple[tuple[str | None, str | None, str], ...] = (
    ("APIServer", None, _ACCESS),
    ("APIServer", "INFO", "[logger.py:71] Received request chatcmpl-{n:032x}: "
                          "prompt_token_ids: None, params: SamplingParams(n=1, temperature=0.7, "
                          "max_tokens=512), lora_request: None."),
    ("APIServer", None, _ACCESS),
    ("APIServer", None, _ACCESS),
    ("APIServer", "INFO",
     f"[{lines.SRC_STATS}] " + lines.stats_line(1843.2, 912.7, 37, 41.3, 62.5)),
    ("APIServer", None, _ACCESS),
    (None, None, lines.FUTURE_WARNINGS[0]),
    (None, None, "  warnings.warn("),
    ("APIServer", None, _ACCESS),
    ("APIServer", "INFO", "[async_llm.py:352] Added request chatcmpl-{n:032x}."),
    ("APIServer", None, _ACCESS),
    ("EngineCore_DP0", "WARNING", "[scheduler.py:1560] Sequence group {n} is preempted by "
                                  "PreemptionMode.RECOMPUTE mode because there is not enough KV "
                                  "cache space."),
    ("APIServer", None, _ACCESS),
    ("APIServer", "WARNING", f"[{lines.SRC_ARGS}] {lines.DEPRECATED}"),
    ("APIServer", None, _ACCESS),
    ("APIServer", None, _ACCESS),
    ("APIServer", None, _ACCESS),
    ("APIServer", "INFO", f"[{lines.SRC_SPEC}] "
                          + lines.spec_line(412, [330, 251, 190, 141, 102], 10.0)),
    ("APIServer", None, _ACCESS),
    ("APIServer", None, _ACCESS),
)


def flood_lines(pids: dict[str, int], stamp: Callable[[], str] = lambda: "09-04 17:38:34",
                ) -> Iterator[str]:
    """Endless vLLM-shaped serving lines (no newline); `pids` maps `APIServer` and
    `EngineCore_DP0` to their pids, `stamp()` is the `MM-DD HH:MM:SS` of the next records."""
    for n in itertools.count():
        when = stamp()
        for i, (proc, level, text) in enumerate(_CYCLE):
            message = text.format(port=40_000 + (n * len(_CYCLE) + i) % 20_000, n=n)
            if proc is None:
                yield message
            else:
                head = f"{level} {when} " if level else ""
                yield f"({proc} pid={pids.get(proc, 1)}) {head}{message}"


def pour(rate: float, lines: Iterator[str], write: Callable[[str], None],
         going: Callable[[], bool], tick: float = 0.01) -> int:
    """Write `rate` lines per second from `lines`, a batch every `tick` seconds (as a busy
    server's logger flushes), while `going()`; returns how many were written."""
    start = time.monotonic()
    written = 0
    while going():
        due = int(rate * (time.monotonic() - start)) - written
        if due > 0:
            write("".join(f"{line}\n" for line in itertools.islice(lines, due)))
            written += due
        time.sleep(tick)
    return written
