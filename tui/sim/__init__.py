"""Simulated vLLM server on GPUs (processes, logs, GPU memory) for `specconsole demo` and tests.

`python -m tui.sim.engine serve ...` is the simulated `vllm serve` (with `--sim-engine sglang`,
SGLang's launcher: `tui.sim.sglang`). The GPUs the simulated workers "allocate" are read
through a stand-in of NVML: `tui/sim/nvml/` builds a C `libnvidia-ml.so.1` that the agent's real
nvidia-ml-py loads (the tests, the lab, the demo where a C compiler exists); FAKENVML_DIR holds
a fake `pynvml` module for hosts without a compiler (the demo's fallback). This module stays
import-free beyond os: every simulated process imports it.
"""

import os

FAKENVML_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakenvml")
