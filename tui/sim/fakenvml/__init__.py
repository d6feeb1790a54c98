"""Directory of the fake `pynvml` (simulation only).

The demo and the tests put this directory first on the agent's PYTHONPATH, so `import pynvml`
finds `pynvml.py` here instead of nvidia-ml-py. This file only makes the directory ship with
the package; nothing imports `tui.sim.fakenvml` as a package.
"""
