"""The wire protocol: every message the agent sends decodes; foreign input is a one-line error."""

from __future__ import annotations

import json

import pytest

from tui.core.errors import AgentError
from tui.core.protocol import (
    PROTOCOL_VERSION,
    DiskSpace,
    GpuInfo,
    GpuProc,
    Gpus,
    Health,
    Hello,
    LogChunk,
    ProcExit,
    Procs,
    RunExit,
    Secrets,
    agent_stdin,
    decode,
)


def _line(**fields: object) -> bytes:
    return json.dumps({"v": PROTOCOL_VERSION, **fields}).encode()


@pytest.mark.parametrize(("fields", "kind", "check"), [
    ({"t": "hello", "agent": "1", "python": "3.11.7", "psutil": "7.2.2", "pynvml": None,
      "nvml": {"ok": False, "error": "NVML Shared Library Not Found"}, "gpu_count": 0,
      "host": "gpu-7", "pidfd": True, "time": 1.0},
     Hello, lambda e: not e.nvml_ok and e.nvml_error.startswith("NVML") and e.host == "gpu-7"),
    ({"t": "procs", "time": 2.0, "procs": [{"pid": 5, "ppid": 1, "name": "Worker_TP3",
                                            "cmd": "VLLM::Worker_TP3", "state": "sleeping",
                                            "cpu": None, "rss": None, "started": None,
                                            "alive": True}]},
     Procs, lambda e: e.procs[0].name == "Worker_TP3" and e.procs[0].cpu is None),
    ({"t": "gpus", "time": 2.0, "gpus": [{"index": 3, "name": "H200", "mem_used": None,
                                          "mem_total": 10, "util": None,
                                          "procs": [{"pid": 9, "mem": 4}]}]},
     Gpus, lambda e: e == Gpus(2.0, (GpuInfo(3, "H200", None, 10, None, (GpuProc(9, 4),)),))),
    ({"t": "log", "off": 10, "end": 20, "lines": ["a", "b"]},
     LogChunk, lambda e: e.lines == ("a", "b") and e.end == 20),
    ({"t": "exit", "pid": 7, "name": "EngineCore_DP0", "code": None, "signal": 9,
      "time": 3.5, "top": False},
     ProcExit, lambda e: e.signal == 9 and e.code is None and not e.top),
    ({"t": "run_exit", "pid": 7, "code": 0, "signal": None, "time": 4.0},
     RunExit, lambda e: e.code == 0),
    ({"t": "secrets", "redact": ["hf_abcdefgh"]},
     Secrets, lambda e: e.redact == ("hf_abcdefgh",)),
    ({"t": "health", "ok": True, "path": "/v1/models", "status": 200, "time": 5.0},
     Health, lambda e: e.ok and e.status == 200),
    ({"t": "disk", "level": "full", "free": 4096, "path": "/r/x", "time": 6.0},
     DiskSpace, lambda e: (e.level, e.free, e.path) == ("full", 4096, "/r/x")),
    ({"t": "disk", "level": "ok", "free": None, "path": "/r/x", "time": 6.0},
     DiskSpace, lambda e: e.level == "ok" and e.free is None),
])
def test_each_message_decodes(fields: dict[str, object], kind: type, check) -> None:
    event = decode(_line(**fields))
    assert isinstance(event, kind)
    assert check(event)


@pytest.mark.parametrize("raw", [
    b"not json", b"[1, 2]", _line(t="nonsense"), _line(t="exit", name="x"),
    json.dumps({"v": 99, "t": "hello"}).encode(), b"Traceback (most recent call last):",
])
def test_foreign_input_is_one_line_agent_error(raw: bytes) -> None:
    with pytest.raises(AgentError) as info:
        decode(raw, host="gpu-7")
    assert str(info.value).startswith("gpu-7: ")
    assert "\n" not in str(info.value)


def test_agent_stdin_frames_code_then_spec() -> None:
    data = agent_stdin(b"print(1)\n", {"secret": "s3cr3t"})
    header, rest = data.split(b"\n", 1)
    assert int(header) == len(b"print(1)\n")
    assert rest[: int(header)] == b"print(1)\n"
    assert json.loads(rest[int(header):]) == {"secret": "s3cr3t"}
