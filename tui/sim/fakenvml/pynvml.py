"""A fake `pynvml` (nvidia-ml-py) for the simulation: GPUs that exist only as files.

Imported as plain `pynvml` when this directory comes first on sys.path, so it stands alone:
stdlib only, nothing from `tui`. It is a read-only view of the state directory written by the
simulated workers (`tui/sim/gpu_state.py`); the only thing it changes there is deleting the
holder files of dead processes.

State dir: $SPECCONSOLE_SIM_GPU_STATE (default ~/.specconsole/sim-gpus), read at nvmlInit.
`devices.json` {"count","name","total"}; `holder-<pid>.json` {"pid","gpu","used","util"} and
"pidns" (a holder in a container: its pid there, mapped to the host's pid as NVML reports it).
A holder counts only while its pid is alive and not a zombie (/proc/<pid>/stat), like the
memory of a real process, which the driver frees when the process is reaped.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass

__version__ = "sim"

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_UNKNOWN = 999

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}

_DRIVER_VERSION = "550.54.15"
_NO_INSTANCE = 0xFFFFFFFF


class NVMLError(Exception):
    """Same shape as nvidia-ml-py's: `.value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"Unknown Error {self.value}")


@dataclass(frozen=True)
class _Device:
    index: int


@dataclass(frozen=True)
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class c_nvmlUtilization_t:
    gpu: int
    memory: int


@dataclass(frozen=True)
class c_nvmlProcessInfo_t:
    pid: int
    usedGpuMemory: int
    gpuInstanceId: int = _NO_INSTANCE
    computeInstanceId: int = _NO_INSTANCE


@dataclass(frozen=True)
class _Holder:
    pid: int
    gpu: int
    used: int
    util: int


_state: dict | None = None  # {"dir", "count", "name", "total", "refs"} while initialised


# One sample of all devices reads the state directory once, as one NVML query would.
_SCAN_TTL_S = 0.1


def _create_devices_if_asked(directory: str) -> None:
    """SPECCONSOLE_SIM_GPUS=N makes the simulated machine have N GPUs before any engine ran
    (the agent's preflight asks NVML before the first launch)."""
    count = os.environ.get("SPECCONSOLE_SIM_GPUS")
    path = os.path.join(directory, "devices.json")
    if not count or os.path.exists(path):
        return
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"count": int(count), "name": "NVIDIA H200 (simulated)",
                   "total": 143771 * 1024 * 1024}, f)
    os.replace(tmp, path)


def nvmlInit() -> None:
    global _state
    if _state is not None:
        _state["refs"] += 1
        return
    directory = os.path.abspath(os.path.expanduser(
        os.environ.get("SPECCONSOLE_SIM_GPU_STATE") or "~/.specconsole/sim-gpus"))
    try:
        _create_devices_if_asked(directory)
        with open(os.path.join(directory, "devices.json")) as f:
            devices = json.load(f)
        count, name, total = int(devices["count"]), str(devices["name"]), int(devices["total"])
    except (OSError, ValueError, KeyError, TypeError):
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED) from None
    _state = {"dir": directory, "count": count, "name": name, "total": total, "refs": 1}


def nvmlShutdown() -> None:
    global _state
    state = _initialised()
    state["refs"] -= 1
    if state["refs"] == 0:
        _state = None


def nvmlSystemGetDriverVersion() -> str:
    _initialised()
    return _DRIVER_VERSION


def nvmlDeviceGetCount() -> int:
    return _initialised()["count"]


def nvmlDeviceGetHandleByIndex(index: int) -> _Device:
    if not 0 <= index < _initialised()["count"]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Device(index)


def nvmlDeviceGetName(handle: _Device) -> str:
    _check(handle)
    return _initialised()["name"]


def nvmlDeviceGetMemoryInfo(handle: _Device) -> c_nvmlMemory_t:
    total = _initialised()["total"]
    used = min(total, sum(h.used for h in _holders(handle)))
    return c_nvmlMemory_t(total=total, free=total - used, used=used)


def nvmlDeviceGetUtilizationRates(handle: _Device) -> c_nvmlUtilization_t:
    holders = _holders(handle)
    gpu = max((h.util for h in holders), default=0)
    return c_nvmlUtilization_t(gpu=gpu, memory=gpu // 2)


def nvmlDeviceGetComputeRunningProcesses(handle: _Device) -> list[c_nvmlProcessInfo_t]:
    return [c_nvmlProcessInfo_t(pid=h.pid, usedGpuMemory=h.used) for h in _holders(handle)]


def nvmlDeviceGetGraphicsRunningProcesses(handle: _Device) -> list[c_nvmlProcessInfo_t]:
    _check(handle)
    return []


def _initialised() -> dict:
    if _state is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _state


def _check(handle: object) -> None:
    if not isinstance(handle, _Device) or not 0 <= handle.index < _initialised()["count"]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def _holders(handle: _Device) -> list[_Holder]:
    """Live holders of one device, from a scan shared by all devices for a moment."""
    _check(handle)
    state = _initialised()
    now = time.monotonic()
    cached = state.get("scan")
    if cached is None or now - cached[0] > _SCAN_TTL_S:
        cached = state["scan"] = (now, _scan(state["dir"]))
    return [h for h in cached[1] if h.gpu == handle.index]


def _scan(directory: str) -> list[_Holder]:
    """Every live holder; files of dead processes are deleted on the way."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        if not (name.startswith("holder-") and name.endswith(".json")):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                data = json.load(f)
            pid = _host_pid(int(data["pid"]), data.get("pidns"))
            holder = _Holder(pid, int(data["gpu"]), int(data["used"]), int(data["util"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _alive(holder.pid):
            with contextlib.suppress(OSError):
                os.unlink(path)
        else:
            found.append(holder)
    return sorted(found, key=lambda h: h.pid)


def _host_pid(pid: int, pidns: object) -> int:
    """The pid as this host sees it: a holder in another pid namespace (a container) wrote
    its pid there; the host's process is the one in that namespace whose innermost NSpid it
    is. 0 (dead) when none is."""
    if not isinstance(pidns, int) or pidns == os.stat("/proc/self/ns/pid").st_ino:
        return pid
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}/ns/pid").st_ino != pidns:
                continue
            with open(f"/proc/{name}/status") as f:
                nspid = next(line for line in f if line.startswith("NSpid:")).split()
        except (OSError, StopIteration):
            continue
        if nspid[-1] == str(pid):
            return int(name)
    return 0


def _alive(pid: int) -> bool:
    """Running and not a zombie: a zombie's memory is already freed by the driver."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X", "x")
