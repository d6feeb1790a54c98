"""One rank of a simulated engine, as vLLM's worker (`tui/sim/worker.py`) and SGLang's scheduler
(`tui/sim/sglang/scheduler.py`) share it: its fake GPU (the NVML holder file), its status pipe,
the checkpoint shards' bars and the scenarios that strike while loading them (oom, hang).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from typing import Any, NoReturn

from tui.sim import failures, gpu_state, lines, runtime
from tui.sim import timeline as tl
from tui.sim.runtime import SimClock, Terminated
from tui.sim.simlog import STDERR, SimLog

GIB = tl.GIB
SHARDS_LABEL = "Loading safetensors checkpoint shards"


class Rank:
    """One rank: its config, clock, GPU holder file and status pipe; subclasses set `log` and
    write `_run`."""

    log: SimLog

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.rank: int = cfg["rank"]
        self.tp: int = cfg["tp"]
        self.gpu: int = cfg["gpu"]
        self.scenario: str = cfg["scenario"]
        self.state_dir: str = cfg["gpu_state"]
        self.status_fd: int = cfg["status_fd"]
        self.clock = SimClock(cfg["t0"], cfg["scale"], cfg.get("shift", 0.0))
        self.rt = runtime.Runtime(self.clock, cfg.get("ignore_sigterm", False))
        self.rng = random.Random(cfg["t0"] * 1000 + self.rank)
        self.used = 0.0  # GiB

    def run(self) -> int:
        try:
            return self._run()
        except Terminated:
            return 0
        finally:
            gpu_state.remove_holder(self.state_dir)

    def _run(self) -> int:
        raise NotImplementedError

    def _load_shards(self, start: float) -> None:
        """The target model's shards from `start` on (rank 0 draws the bars); raises the CUDA
        OOM of the oom scenario, never returns in the hang scenario."""
        if self.rank == 0:
            self.rt.at(start)
            self.log.line(lines.shards_bar(SHARDS_LABEL, 0, tl.SHARDS, 0), prefixed=False,
                          fd=STDERR)
        stop = self._hang_shard()
        for shard in range(1, tl.SHARDS + 1):
            self.rt.at(tl.shard_time(shard, start))
            if self.scenario == "oom" and self.rank == self.tp - 1 and shard == tl.OOM_SHARD:
                self._hold(tl.DEVICE_TOTAL / GIB - 1.21, 97)
                raise failures.cuda_oom(self.gpu, int(self.used * GIB), 3.5)
            self._hold(tl.weights_gib(shard), self.rng.randint(2, 9))
            if self.rank == 0:
                elapsed = self.clock.now() - start
                self.log.line(lines.shards_bar(SHARDS_LABEL, shard, tl.SHARDS, elapsed),
                              prefixed=False, fd=STDERR)
            if shard == stop:
                # Hung in a collective: the ranks that got furthest spin at 100 %.
                self._hold(self.used, 0 if shard < tl.HANG_SHARD else 100)
                self.rt.forever()

    def _hang_shard(self) -> int | None:
        if self.scenario != "hang":
            return None
        early = self.tp > 1 and self.rank == self.tp - 1
        return tl.HANG_SHARD - (tl.HANG_EARLY_SHARDS if early else 0)

    def _hold(self, used_gib: float, util: int) -> None:
        self.used = used_gib
        gpu_state.write_holder(self.state_dir, self.gpu, int(used_gib * GIB), util)

    def _report(self, message: bytes) -> None:
        with contextlib.suppress(OSError):  # the parent is gone; PDEATHSIG comes next
            os.write(self.status_fd, message)

    def die(self, code: int, name: str) -> NoReturn:
        """Exit at once after stamping the moment as `name`'s death, so that latency is
        measured from the death."""
        sys.stdout.flush()
        sys.stderr.flush()
        gpu_state.record_death(self.state_dir, name)
        os._exit(code)
