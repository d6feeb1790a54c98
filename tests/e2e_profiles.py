"""Profiles for end-to-end tests: the simulated engine, private dirs, a free port."""

from __future__ import annotations

import socket
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sim_profile(tmp: Path, scenario: str, *, target: str = "local", time_scale: float = 300.0,
                name: str | None = None, stall: str = "30s", extra: str = "") -> Path:
    """Write a simulated-engine profile whose runs and fake GPUs live under `tmp`."""
    path = tmp / f"{name or scenario}.toml"
    path.write_text(f"""
[host]
target = "{target}"
python = "{sys.executable}"
runs_dir = "{tmp / 'runs'}"

[server]
engine = "vllm"
model = "/models/Kimi-K2.5"
port = {free_port()}
tensor_parallel_size = 8

[server.speculative]
method = "eagle3"
model = "/models/Kimi-K2.5-eagle3"
num_speculative_tokens = 5

[preflight]
compile = false
paths_exist = false

[expect]
load_time = "25m"
stall_timeout = "{stall}"

[simulate]
scenario = "{scenario}"
time_scale = {time_scale}
gpus = 8
gpu_state = "{tmp / 'gpus'}"
{extra}
""")
    return path
