"""A 1 GB log, through the real sshd: the console attaches to a run whose server.log is ~1 GB,
reads it to the end over SSH in bounded time, and its memory stays bounded.

The run is a real simulated launch on gpu-a (`specconsole launch`, still serving while the test
runs); its server.log then gets ~1 GiB appended by a fast writer: a block of vLLM's serving
lines (tui/sim/flood.py's mix: access lines, request records, stats, warnings) repeated, ending
with a marker line. The console (ConsoleApp, attached in-process as `specconsole console` does)
follows the run from its first byte. Why 300 MB: the console holds at most DEFAULT_CAP (20 000)
lines in its LogWindow, whatever the log's size; at well under 2 KB a classified line that is
tens of MB, plus the agent's 1 MiB chunks in flight and Textual. Holding the log itself would
take more than 1 GB (text as Python str), so a leak of the log fails the bound by far.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from lab.netlab import Lab
from tui.console.app import ConsoleApp
from tui.core.logwindow import DEFAULT_CAP
from tui.core.profile import load_profile
from tui.sim.flood import flood_lines
from tui.supervise.supervisor import Supervisor

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
BLOCK = 4 << 20  # the writer's unit: 4 MiB of whole lines
MARKER = "BIGLOG-END-OF-THE-GIGABYTE"
RSS_GROWTH_MAX = 300 << 20  # see the module's docstring
ATTACH_MAX_S = 240.0  # to read 1 GiB to its end: ~9 M lines through SSH and the log core


WORDS = ("the", "model", "should", "answer", "in", "one", "paragraph", "about", "speculative",
         "decoding", "with", "an", "eagle3", "drafter", "and", "explain", "why", "acceptance",
         "rate", "drops", "on", "long", "code", "prompts", "while", "batch", "grows")


def _request(pid: int, n: int, rng: random.Random) -> str:
    """The record vLLM writes for each request with --enable-log-requests: the prompt and its
    token ids, 2-4 KB a line (what makes a serving log reach gigabytes)."""
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 160)))
    prompt = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
              f"{words}<|im_end|>\n<|im_start|>assistant\n")
    ids = ", ".join(str(rng.randrange(160_000)) for _ in range(rng.randint(200, 420)))
    return (f"(APIServer pid={pid}) INFO 09-04 17:38:34 [logger.py:39] Received request "
            f"chatcmpl-{n:032x}: prompt: {prompt!r}, params: SamplingParams(n=1, "
            "presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
            "temperature=0.7, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], "
            "stop_token_ids=[], max_tokens=512, min_tokens=0, logprobs=None, "
            "skip_special_tokens=True), prompt_token_ids: "
            f"[{ids}], prompt_embeds shape: None, lora_request: None.\n")


def _block(pid: int) -> bytes:
    """BLOCK bytes (about) of whole, realistic serving lines of the run's API server: the
    firehose mix of tui/sim/flood.py, each request's access line preceded by its record."""
    lines = flood_lines({"APIServer": pid, "EngineCore_DP0": pid + 1})
    rng = random.Random(pid)
    out: list[str] = []
    size = 0
    while size < BLOCK:
        line = next(lines)
        if '"POST /v1/chat/completions' in line:
            out.append(_request(pid, len(out), rng))
            size += len(out[-1])
        out.append(line + "\n")
        size += len(out[-1])
    return "".join(out).encode()


def _grow(log: Path, pid: int, target: int) -> int:
    """Append whole blocks to `log` until it holds `target` bytes, then the marker line."""
    block = _block(pid)
    with log.open("ab") as out:
        while log.stat().st_size < target:
            out.write(block)
            out.flush()
        out.write(f"{MARKER}\n".encode())
    return log.stat().st_size


@pytest.mark.timeout(ATTACH_MAX_S + 60)
async def test_console_attaches_to_a_1gb_log_in_bounded_memory(
        lab: Lab, lab_profile: Callable[..., Path], tmp_path: Path, cleanup: list[str],
        lab_figures: dict[str, Any]) -> None:
    profile = lab_profile(name="biglog")
    launched = subprocess.run([sys.executable, "-m", "tui", "launch", str(profile)], cwd=ROOT,
                              text=True, capture_output=True, timeout=60)
    assert launched.returncode == 0, launched.stderr
    found = re.search(r"launched run (\S+) on .* \(pid (\d+)\)", launched.stdout)
    assert found, launched.stdout
    run_id, pid = found[1], int(found[2])
    cleanup.append(run_id)
    log = tmp_path / "runs" / run_id / "server.log"
    try:
        started = time.monotonic()
        size = _grow(log, pid, GIB)
        wrote_s = time.monotonic() - started
        me = psutil.Process()
        rss_before = me.memory_info().rss
        rss_peak = rss_before
        sup = Supervisor(load_profile(profile))
        app = ConsoleApp(sup, launch=False, kill_grace=2.0,
                         env={k: v for k, v in os.environ.items() if not k.startswith("TMUX")})
        started = time.monotonic()
        async with app.run_test(size=(160, 45)) as pilot:
            while sup.log_end < size:
                assert time.monotonic() - started < ATTACH_MAX_S, \
                    f"read {sup.log_end} of {size} bytes in {ATTACH_MAX_S:g} s"
                rss_peak = max(rss_peak, me.memory_info().rss)
                await pilot.pause(0.2)
            attach_s = time.monotonic() - started
            await pilot.pause(0.5)
            rss_peak = max(rss_peak, me.memory_info().rss)
            assert sup.run is not None and sup.run.run_id == run_id
            window = app.window
            shown = [e.line.raw for e in window.view(raw=True)]
            assert 0 < len(shown) <= DEFAULT_CAP
            assert MARKER in shown[-DEFAULT_CAP:], shown[-5:]
            assert "connection lost" not in str(app.query_one("#status").render())
        growth = rss_peak - rss_before
        lab_figures["1 GB log: console attach over SSH"] = {
            "log_bytes": size, "write_s": round(wrote_s, 1), "attach_to_end_s": round(attach_s, 1),
            "mb_per_s": round(size / attach_s / 1e6, 1),
            "rss_before_mb": round(rss_before / 1e6), "rss_growth_mb": round(growth / 1e6),
            "lines_held": len(shown)}
        assert growth < RSS_GROWTH_MAX, f"RSS grew by {growth / 1e6:.0f} MB"
    finally:
        log.unlink(missing_ok=True)  # a GB per kept pytest tmp dir would fill the disk
