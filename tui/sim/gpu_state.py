"""Writer side of the simulated GPUs' state directory (the readers: the NVML stand-in
`nvml/libnvidia_ml.c`, and the Python fake `fakenvml/pynvml.py`).

Layout, as the reader `tui/sim/fakenvml/pynvml.py` documents it: `devices.json`
{"count","name","total"} and one `holder-<pid>.json` {"pid","gpu","used","util","pidns"} per
simulated worker. `pidns` is the inode of the worker's pid namespace: a worker in a container
knows only its pid there, and the readers (on the host, like a real driver) turn it into the
host's pid, which is what NVML reports. Files are replaced atomically so the reader never sees
half a file; a holder whose process died is ignored and deleted by the reader, so a SIGKILLed
worker "releases" its memory like a real one.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from tui.sim.timeline import DEVICE_NAME, DEVICE_TOTAL

STATE_ENV = "SPECCONSOLE_SIM_GPU_STATE"  # as tui.core.command.SIM_GPU_STATE_ENV


def state_dir(explicit: str | None = None) -> str:
    """--sim-gpu-state, else $SPECCONSOLE_SIM_GPU_STATE, else ~/.specconsole/sim-gpus."""
    path = explicit or os.environ.get(STATE_ENV) or "~/.specconsole/sim-gpus"
    return os.path.abspath(os.path.expanduser(path))


def ensure_devices(directory: str, count: int) -> int:
    """Create `devices.json` unless present (an existing one, maybe another run's, wins);
    returns the device count in effect, so ranks map onto devices that exist."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "devices.json")
    if not os.path.exists(path):
        _write_json(directory, "devices.json",
                    {"count": count, "name": DEVICE_NAME, "total": DEVICE_TOTAL})
    try:
        with open(path) as f:
            return max(1, int(json.load(f)["count"]))
    except (OSError, ValueError, KeyError, TypeError):
        return count


def write_holder(directory: str, gpu: int, used: int, util: int) -> None:
    """Record that this process holds `used` bytes on device `gpu` at `util` percent."""
    pid = os.getpid()
    _write_json(directory, f"holder-{pid}.json",
                {"pid": pid, "gpu": gpu, "used": int(used), "util": int(util),
                 "pidns": os.stat("/proc/self/ns/pid").st_ino})


def remove_holder(directory: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, f"holder-{os.getpid()}.json"))


def record_death(directory: str, name: str) -> None:
    """Append this process's name and the moment it dies to deaths.jsonl, just before exiting,
    so tests and benchmarks measure detection latency from the death itself."""
    line = json.dumps({"pid": os.getpid(), "name": name, "time": time.time()}) + "\n"
    fd = os.open(os.path.join(directory, "deaths.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _write_json(directory: str, name: str, data: dict[str, Any]) -> None:
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(directory, name))
