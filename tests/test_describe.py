"""What `wait` and the banner say about a death, in words."""

from __future__ import annotations

import pytest

from tui.core.describe import death_lines, describe, disk_words
from tui.core.phases import Phase
from tui.core.protocol import DiskSpace
from tui.core.rootcause import RootCause
from tui.core.state import Death, ReadyLimit, ReadyTimedOut, State
from tui.core.status import RunView, timed_out_text
from tui.core.units import duration


@pytest.mark.parametrize(("seconds", "text"), [
    (9.54, "9.5s"), (59.9, "59.9s"), (724, "12m04s"), (3720, "1h02m")])
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(("code", "sig", "expect"), [
    (1, None, ["exit code 1", "SyntaxError: '(' was never closed (/m/kimi_k25.py, line 12)"]),
    (None, 9, ["signal 9", "killed by SIGKILL from outside", "dmesg"]),
    (None, 11, ["signal 11", "native crash (SIGSEGV)"]),
    (None, None, ["exit code unknown", "not found in the log"]),
])
def test_death_lines(code: int | None, sig: int | None, expect: list[str]) -> None:
    cause = (RootCause("SyntaxError: '(' was never closed (/m/kimi_k25.py, line 12)",
                       "Worker_TP3", 303, 10) if code == 1 else None)
    lines = death_lines(Death(303, "Worker_TP3", code, sig, 23.0, 23.0, Phase.WEIGHTS, cause))
    assert lines[0].startswith("DEAD: Worker_TP3 (pid 303) died")
    assert "23.0s after launch while loading weights" in lines[0]
    text = "\n".join(lines)
    for fragment in expect:
        assert fragment in text


@pytest.mark.parametrize(("level", "free", "text", "loud"), [
    ("full", 12 << 10, "gpu-a: disk full where the run's log is written (12 KiB free in /r): "
     "the server's output is being lost; free space there", "warning"),
    ("low", 200 << 20, "gpu-a: disk almost full where the run's log is written (200.0 MiB free "
     "in /r)", "warning"),
    ("ok", 3 << 30, "gpu-a: the run's log disk has room again (3.0 GiB free)", "info"),
    ("low", None, "gpu-a: disk almost full where the run's log is written (? free in /r)",
     "warning"),
])
def test_disk_words(level: str, free: int | None, text: str, loud: str) -> None:
    assert disk_words("gpu-a", DiskSpace(level, free, "/r", 0.0)) == (text, loud)


@pytest.mark.parametrize(("limit", "outcome"), [
    (ReadyLimit(2400.0), 'the run keeps running (on_ready_timeout = "keep")'),
    (ReadyLimit(2400.0, kill=True), 'killing the run (on_ready_timeout = "kill")'),
])
def test_a_launch_given_up_on_in_words(limit: ReadyLimit, outcome: str) -> None:
    event = ReadyTimedOut(limit, State.LOADING, 2400.0)
    assert describe(event) == [
        f"TIMEOUT: not READY after 40m00s (ready_timeout), still loading; {outcome}"]
    view = RunView(State.LOADING, timed_out=event)
    assert timed_out_text(view) == "⚠ not READY after 40m00s (ready_timeout)"
    assert timed_out_text(RunView(State.READY, timed_out=event)) == ""  # READY after all
