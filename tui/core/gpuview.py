"""Per-GPU memory history since launch, and which GPU stopped growing while others grow.

A tensor-parallel load fills every GPU at the same pace; one that stalls while its peers keep
growing points at the rank that is stuck (or died without the others noticing yet).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tui.core.protocol import GpuInfo, Gpus

HISTORY = 120  # samples kept per GPU; older ones are merged pairwise (the sparkline's width)
LAG_WINDOW = 5  # samples: how long a GPU must be flat while another grows


@dataclass(frozen=True, slots=True)
class GpuRow:
    info: GpuInfo
    history: tuple[int, ...]
    holder: int | None  # the pid holding most of its memory
    lagging: bool


class GpuHistory:
    """Memory samples per device; bounded, halving its resolution when full."""

    def __init__(self, keep: int = HISTORY) -> None:
        self.keep = keep
        self._samples: dict[int, deque[int]] = {}
        self._latest: dict[int, GpuInfo] = {}

    def add(self, snap: Gpus) -> None:
        for gpu in snap.gpus:
            self._latest[gpu.index] = gpu
            samples = self._samples.setdefault(gpu.index, deque())
            samples.append(gpu.mem_used or 0)
            if len(samples) > self.keep:
                merged = list(samples)
                samples.clear()
                samples.extend(max(merged[i:i + 2]) for i in range(0, len(merged), 2))

    def lagging(self, window: int = LAG_WINDOW) -> set[int]:
        """GPUs of the run (holding one of its processes) flat over the last `window` samples
        while at least one other grew; a GPU the run does not use is never flagged."""
        growth: dict[int, int] = {}
        for index, samples in self._samples.items():
            if len(samples) > window and self._latest[index].procs:
                growth[index] = samples[-1] - samples[-1 - window]
        if not any(g > 0 for g in growth.values()):
            return set()
        return {i for i, g in growth.items() if g <= 0}

    def rows(self) -> tuple[GpuRow, ...]:
        lagging = self.lagging()
        out = []
        for index in sorted(self._latest):
            gpu = self._latest[index]
            holders = [p for p in gpu.procs if p.mem]
            holder = max(holders, key=lambda p: p.mem or 0).pid if holders else None
            out.append(GpuRow(gpu, tuple(self._samples[index]), holder, index in lagging))
        return tuple(out)
