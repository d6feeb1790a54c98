"""The simulated engine's firehose (`--sim-flood LINES_PER_S`): its lines and its process."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import free_port, wait_for

from tui.core.logline import parse_line
from tui.core.noise import NoiseFilter, builtin_rules
from tui.sim import api_server
from tui.sim.flood import flood_lines, pour

ROOT = Path(__file__).resolve().parent.parent


def test_the_mix_is_vllm_shaped_and_meets_the_noise_rules() -> None:
    noise = NoiseFilter(builtin_rules("vllm"))
    lines = [parse_line(raw) for raw in itertools.islice(
        flood_lines({"APIServer": 11, "EngineCore_DP0": 12}), 2000)]
    procs = Counter(line.proc for line in lines)
    assert procs == {"APIServer": 1700, "EngineCore_DP0": 100, None: 200}
    assert {line.pid for line in lines if line.proc} == {11, 12}
    assert Counter(line.level for line in lines) == {"INFO": 1600, "WARNING": 200, None: 200}
    hidden = Counter(rule.id for line in lines if (rule := noise.classify(line)))
    assert hidden == {"future-warning": 100, "warnings-warn-source": 100, "deprecated": 100}
    assert len({line.message for line in lines}) > 1000  # ports and request ids vary


def test_pour_writes_whole_lines_and_stops_when_told() -> None:
    chunks: list[str] = []
    rounds = iter(range(20))
    written = pour(50_000, iter(f"line {i}" for i in itertools.count()), chunks.append,
                   lambda: next(rounds, None) is not None, tick=0.005)
    text = "".join(chunks)
    assert written == text.count("\n") > 0
    assert all(chunk.endswith("\n") for chunk in chunks)
    assert text.splitlines() == [f"line {i}" for i in range(written)]


def test_the_option_is_checked_and_not_shown_as_vllms() -> None:
    args, extra = api_server.parse_args(["serve", "m", "--sim-flood", "2000"])
    assert args.sim_flood == 2000
    assert "sim_flood" not in api_server.non_default_args(args, extra)
    with pytest.raises(SystemExit):
        api_server.parse_args(["serve", "m", "--sim-flood", "0"])


def test_a_serving_engine_floods_until_it_is_stopped(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    argv = [sys.executable, "-m", "tui.sim.engine", "serve", "/models/m", "--port",
            str(free_port()), "-tp", "1", "--sim-scenario", "ready", "--sim-time-scale", "1000",
            "--sim-gpus", "1", "--sim-gpu-state", str(tmp_path / "gpus"), "--sim-flood", "5000"]
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_for(lambda: log_path.read_text().count("POST /v1/chat/completions") > 1000, 60,
                 "the firehose")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log_path.read_text()
    assert text.index("Application startup complete.") < text.index("POST /v1/chat/completions")
    assert f"(EngineCore_DP0 pid={proc.pid}) " not in text  # the engine core's own pid
    assert "(EngineCore_DP0 pid=" in text and "Sequence group" in text
