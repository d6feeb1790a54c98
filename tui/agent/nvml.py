"""GPU sampling through pynvml, every failure absorbed into None (nvitop's NA habit)."""

from __future__ import annotations


class Gpus:
    """NVML, absorbing every failure into None (nvitop's NA habit): a missing function, a lost
    device or a driver error makes a field None, never an exception."""

    def __init__(self) -> None:
        self.ok = False
        self.error: str | None = None
        self.version: str | None = None
        self.nv = None
        self.handles: list = []  # None for a device whose handle NVML refused
        self.names: list[str | None] = []
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
            self.error = f"NVML unavailable: {exc}"
            return False
        count = self._call("nvmlDeviceGetCount")
        if not isinstance(count, int):
            self.error = "NVML unavailable: no device count"
            self._call("nvmlShutdown")  # nvmlInit counts references: balance this one
            return False
        self.handles = [self._call("nvmlDeviceGetHandleByIndex", i) for i in range(count)]
        names = [self._call("nvmlDeviceGetName", h) for h in self.handles]
        self.names = [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names]
        self.ok = True
        return True

    def _call(self, name: str, *args):
        """nv.<name>(*args), or None when pynvml lacks it, the handle is None, or it fails."""
        if None in args:
            return None
        try:
            return getattr(self.nv, name)(*args)
        except Exception:
            return None

    def holders(self, index: int) -> list[dict]:
        """The processes holding memory on a device: [{"pid", "mem"}], each pid once."""
        h = self.handles[index]
        seen: dict[int, dict] = {}
        for fn in ("nvmlDeviceGetComputeRunningProcesses",
                   "nvmlDeviceGetGraphicsRunningProcesses"):
            for item in self._call(fn, h) or []:
                pid = getattr(item, "pid", None)
                if isinstance(pid, int) and pid not in seen:
                    mem = getattr(item, "usedGpuMemory", None)
                    seen[pid] = {"pid": pid, "mem": mem if isinstance(mem, int) else None}
        return list(seen.values())

    def sample(self) -> list[dict]:
        out = []
        for i, h in enumerate(self.handles):
            mem = self._call("nvmlDeviceGetMemoryInfo", h)
            util = self._call("nvmlDeviceGetUtilizationRates", h)
            out.append({
                "index": i, "name": self.names[i],
                "mem_used": _int_attr(mem, "used"), "mem_total": _int_attr(mem, "total"),
                "util": _int_attr(util, "gpu"), "procs": self.holders(i),
            })
        return out

    def all_holders(self) -> list[dict]:
        return [dict(h, gpu=i) for i in range(len(self.handles)) for h in self.holders(i)]


def _int_attr(obj: object, name: str) -> int | None:
    value = getattr(obj, name, None)
    return value if isinstance(value, int) else None


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None
