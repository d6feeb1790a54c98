"""The demo's profile: the simulated engine on this machine, on a free port, no setup.

Built from the same TOML schema as a user's profile, so the demo exercises the real loader.
"""

from __future__ import annotations

import socket

from tui.core.profile import Profile, loads_profile
from tui.sim import FAKENVML_DIR
from tui.sim.nvml.build import BuildError, build

DEMO_TEMPLATE = """
[host]
target = "local"

[server]
engine = "{engine}"
model = "/models/moonshotai/Kimi-K2.5 (simulated)"
port = {port}
tensor_parallel_size = 8

[server.speculative]
method = "eagle3"
model = "/models/Kimi-K2.5-eagle3 (simulated)"
{draft_sizes}

[preflight]
compile = false
paths_exist = false

[logs]
harmless = [{{ pattern = "Failed to import Triton kernels", label = "Triton SparseMatrix import" }}]

[expect]
load_time = "{load}s"
stall_timeout = "{stall}s"
serving_probe_interval = "2s"  # the demo's readout moves within seconds (a real server: 10s)

[smoke]
enabled = true

[simulate]
scenario = "{scenario}"
time_scale = {time_scale}
gpus = 8
nvml = "{nvml}"
"""


# How many tokens the drafter proposes, in each engine's terms.
DRAFT_SIZES = {"vllm": "num_speculative_tokens = 5",
               "sglang": "num_steps = 3\neagle_topk = 1\nnum_draft_tokens = 4"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nvml_dir() -> str:
    """The NVML stand-in the demo's agent reads its GPUs through: the C library under the real
    nvidia-ml-py when this machine can build it, else the Python fake (no compiler)."""
    try:
        return str(build())
    except BuildError:
        return FAKENVML_DIR


def demo_profile(scenario: str, time_scale: float, engine: str = "vllm") -> Profile:
    """A profile for `specconsole demo`: a 25-minute load shown in 25 min / time_scale, by
    the simulated vLLM or SGLang."""
    stall = max(3.0, 600.0 / time_scale)
    text = DEMO_TEMPLATE.format(port=free_port(), scenario=scenario, time_scale=time_scale,
                                stall=f"{stall:g}", load=f"{25 * 60 / time_scale:g}",
                                engine=engine, draft_sizes=DRAFT_SIZES[engine],
                                nvml=nvml_dir())
    return loads_profile(text, f"demo-{scenario}.toml")
