"""GPU sampling through pynvml, every failure absorbed into None (nvitop's NA habit)."""

from __future__ import annotations

# NVML's return codes (nvml.h; part of the C ABI, so fixed across drivers and bindings)
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_LIB_RM_VERSION_MISMATCH = 18

NO_LIBRARY = "no NVML on this host (libnvidia-ml.so.1 not found)"
VERSION_MISMATCH = ("NVML driver/library version mismatch (the loaded kernel driver is not the "
                    "one libnvidia-ml.so.1 belongs to: reboot, or reload the nvidia module)")


class Gpus:
    """NVML, absorbing every failure into None (nvitop's NA habit): a missing function, a lost
    device or a driver error makes a field None, never an exception. A device that fell off
    the bus (NVML_ERROR_GPU_IS_LOST) stays marked lost and is not asked again: a real one only
    comes back after a reset, and a lost device's calls can stall the driver."""

    def __init__(self) -> None:
        self.ok = False
        self.error: str | None = None
        self.version: str | None = None
        self.nv = None
        self.handles: list = []  # None for a device whose handle NVML refused
        self.names: list[str | None] = []
        self.lost: set[int] = set()  # indices of devices NVML answered GPU_IS_LOST for
        try:
            import pynvml
        except Exception as exc:
            self.error = f"pynvml not importable: {exc}"
            return
        self.nv = pynvml
        self.version = getattr(pynvml, "__version__", None) or _dist_version("nvidia-ml-py")
        self.init()

    def init(self) -> bool:
        """nvmlInit; watch retries it now and then (a simulated host creates its GPUs late)."""
        if self.ok or self.nv is None:
            return self.ok
        try:
            self.nv.nvmlInit()
        except Exception as exc:
            self.error = _init_error(exc)
            return False
        count = self._call("nvmlDeviceGetCount")
        if not isinstance(count, int):
            self.error = "NVML unavailable: no device count"
            self._call("nvmlShutdown")  # nvmlInit counts references: balance this one
            return False
        self.lost = set()
        self.handles = [self._device(i, "nvmlDeviceGetHandleByIndex", i) for i in range(count)]
        names = [self._device(i, "nvmlDeviceGetName", h) for i, h in enumerate(self.handles)]
        self.names = [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names]
        self.ok = True
        self.error = None
        return True

    def _call(self, name: str, *args):
        """nv.<name>(*args), or None when pynvml lacks it, the handle is None, or it fails."""
        if None in args:
            return None
        try:
            return getattr(self.nv, name)(*args)
        except Exception:
            return None

    def _device(self, index: int, name: str, *args):
        """nv.<name>(*args) for device `index`, as _call; a GPU_IS_LOST answer marks it lost,
        and a lost device is not asked again."""
        if index in self.lost or None in args:
            return None
        try:
            return getattr(self.nv, name)(*args)
        except Exception as exc:
            if _code(exc) == _GPU_IS_LOST:
                self.lost.add(index)
            return None

    def _processes(self, index: int, kind: str) -> list:
        """nvmlDevice<kind>RunningProcesses, falling back to its _v2 when the driver lacks the
        newer function (nvidia-ml-py then raises FunctionNotFound or its LibraryMismatchError)."""
        h = self.handles[index]
        for name in (f"nvmlDeviceGet{kind}RunningProcesses",
                     f"nvmlDeviceGet{kind}RunningProcesses_v2"):
            if index in self.lost or h is None:
                return []
            try:
                return list(getattr(self.nv, name)(h) or [])
            except Exception as exc:
                if _code(exc) == _GPU_IS_LOST:
                    self.lost.add(index)
                    return []
                if not _missing(exc, self.nv):
                    return []
        return []

    def holders(self, index: int) -> list[dict]:
        """The processes holding memory on a device: [{"pid", "mem"}], each pid once."""
        seen: dict[int, dict] = {}
        for kind in ("Compute", "Graphics"):
            for item in self._processes(index, kind):
                pid = getattr(item, "pid", None)
                if isinstance(pid, int) and pid not in seen:
                    mem = getattr(item, "usedGpuMemory", None)
                    seen[pid] = {"pid": pid, "mem": mem if isinstance(mem, int) else None}
        return [] if index in self.lost else list(seen.values())

    def sample(self) -> list[dict]:
        """One row per device; a lost one has "lost": True and no numbers, the others go on."""
        out = []
        for i, h in enumerate(self.handles):
            mem = self._device(i, "nvmlDeviceGetMemoryInfo", h)
            util = self._device(i, "nvmlDeviceGetUtilizationRates", h)
            procs = self.holders(i)
            row = {"index": i, "name": self.names[i],
                   "mem_used": _int_attr(mem, "used"), "mem_total": _int_attr(mem, "total"),
                   "util": _int_attr(util, "gpu"), "procs": procs}
            if i in self.lost:  # numbers read before it fell off are not to be trusted
                row |= {"mem_used": None, "mem_total": None, "util": None, "procs": [],
                        "lost": True}
            out.append(row)
        return out

    def all_holders(self) -> list[dict]:
        return [dict(h, gpu=i) for i in range(len(self.handles)) for h in self.holders(i)]


def _code(exc: BaseException) -> int | None:
    """The NVML return code an NVMLError carries (its `value`), else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _missing(exc: BaseException, nv: object) -> bool:
    """The function is not there: absent from pynvml, or from the driver's library."""
    mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
    return (isinstance(exc, AttributeError) or _code(exc) == _FUNCTION_NOT_FOUND
            or (isinstance(mismatch, type) and isinstance(exc, mismatch)))


def _init_error(exc: BaseException) -> str:
    """Why nvmlInit failed, in words a person acts on."""
    code = _code(exc)
    if code == _LIBRARY_NOT_FOUND:
        return NO_LIBRARY
    if code == _LIB_RM_VERSION_MISMATCH:
        return VERSION_MISMATCH
    try:
        text = str(exc)
    except Exception:
        text = f"NVML error {code}"
    return f"NVML unavailable: {text}"


def _int_attr(obj: object, name: str) -> int | None:
    value = getattr(obj, name, None)
    return value if isinstance(value, int) else None


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None
