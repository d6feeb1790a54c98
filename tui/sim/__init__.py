"""Simulated vLLM server on GPUs (processes, logs, GPU memory) for `specconsole demo` and tests.

`python -m tui.sim.engine serve ...` is the simulated `vllm serve` (with `--sim-engine sglang`,
SGLang's launcher: `tui.sim.sglang`); FAKENVML_DIR holds the fake
`pynvml` that the agent imports when that directory comes first on its PYTHONPATH. This module
stays import-free beyond os: every simulated process imports it.
"""

import os

FAKENVML_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakenvml")
