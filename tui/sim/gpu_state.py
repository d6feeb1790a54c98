"""Writer side of the fake NVML's state directory (the reader is `fakenvml/pynvml.py`).

Layout (INTERFACES.md, "Fake NVML"): `devices.json` {"count","name","total"} and one
`holder-<pid>.json` {"pid","gpu","used","util"} per simulated worker. Files are replaced
atomically so the reader never sees half a file; a holder whose process died is ignored and
deleted by the reader, so a SIGKILLed worker "releases" its memory like a real one.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tui.sim.timeline import DEVICE_NAME, DEVICE_TOTAL

STATE_ENV = "SPECCONSOLE_SIM_GPU_STATE"


def state_dir(explicit: str | None = None) -> str:
    """--sim-gpu-state, else $SPECCONSOLE_SIM_GPU_STATE, else ~/.specconsole/sim-gpus."""
    path = explicit or os.environ.get(STATE_ENV) or "~/.specconsole/sim-gpus"
    return os.path.abspath(os.path.expanduser(path))


def ensure_devices(directory: str, count: int) -> None:
    """Create `devices.json` unless present (an existing one, maybe another run's, wins)."""
    os.makedirs(directory, exist_ok=True)
    if not os.path.exists(os.path.join(directory, "devices.json")):
        _write_json(directory, "devices.json",
                    {"count": count, "name": DEVICE_NAME, "total": DEVICE_TOTAL})


def write_holder(directory: str, gpu: int, used: int, util: int) -> None:
    """Record that this process holds `used` bytes on device `gpu` at `util` percent."""
    pid = os.getpid()
    _write_json(directory, f"holder-{pid}.json",
                {"pid": pid, "gpu": gpu, "used": int(used), "util": int(util)})


def remove_holder(directory: str) -> None:
    try:
        os.unlink(os.path.join(directory, f"holder-{os.getpid()}.json"))
    except FileNotFoundError:
        pass


def _write_json(directory: str, name: str, data: dict[str, Any]) -> None:
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(directory, name))
