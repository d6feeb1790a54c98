"""A process of the simulated run that escaped it (`--sim-escapee`; simulation only).

Started by the API server, it forks, leaves the session and process group (setsid) and forks
again, so its parent is init, as a daemonising helper's is: only its SPECCONSOLE_RUN_ID, kept
in its environment, ties it to the run. It holds 1 GiB on fake GPU 0 until it is killed, so a
kill's sweep by run id must find it, and the fake NVML shows whether its memory was released.
"""

from __future__ import annotations

import os
import signal
import sys

from tui.sim import gpu_state, runtime
from tui.sim.timeline import GIB

NAME = "sim-escapee"


def main() -> int:
    cfg = runtime.child_config()
    if os.fork():
        os._exit(0)  # the API server reaps this first child at once
    os.setsid()
    if os.fork():
        os._exit(0)
    runtime.set_name(NAME)
    gpu_state.write_holder(cfg["gpu_state"], 0, GIB, 0)
    while True:
        signal.pause()  # until a signal ends it (the default action of TERM and KILL)


if __name__ == "__main__":
    sys.exit(main())
