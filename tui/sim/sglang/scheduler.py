"""Simulated SGLang scheduler (`sglang::scheduler_TP<r>`): one rank, one fake GPU, the model.

Started by the launcher as `python -m tui.sim.sglang.scheduler` with argv[0] = its title. It
follows `schedule.py`, grows its GPU memory through the fake NVML's holder file, says "ready" on
its status pipe (EOF there = this scheduler is gone), logs `Decode batch.` lines while serving
(rank 0, as SGLang does), and fails as SGLang's `run_scheduler_process` does: the traceback as
one `Scheduler hit an exception:` record, SIGQUIT to the launcher, then return (exit code 0).

In syntax-error the SIGQUIT goes first and the record waits for the launcher's SIGUSR1 (sent
once it has logged "Received sigquit ..."): the symptom lands in the log before the cause, the
order that misleads a reader. The oom failure keeps SGLang's own order.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Any

from tui.sim import failures, runtime
from tui.sim import lines as vllm_lines
from tui.sim import timeline as tl
from tui.sim.rank import GIB, SHARDS_LABEL, Rank
from tui.sim.sglang import lines
from tui.sim.sglang import schedule as S
from tui.sim.sglang.log import SGLangLog
from tui.sim.simlog import STDERR


class Scheduler(Rank):
    """One rank: the schedule, its GPU holder file, its status pipe."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.spec = lines.Spec.from_json(cfg["spec"])
        self.log = SGLangLog(lines.rank_tag(self.rank, self.tp), self.clock)
        self.failed = False

    def _run(self) -> int:
        self.rt.at(S.DIST_BEGIN)
        self.log.line("Init torch distributed begin.")
        self._hold(tl.CONTEXT_GIB, 0)
        self.rt.at(S.DIST_END)
        self.log.line(f"Init torch distributed ends. mem usage={tl.CONTEXT_GIB:.2f} GB")
        self.rt.at(S.LOAD_BEGIN)
        self.log.line(f"Load weight begin. avail mem={self._avail():.2f} GB")
        try:
            if self.scenario == "syntax-error":
                self.rt.at(S.MODEL_IMPORT + self.rank * S.IMPORT_STAGGER)
                self.rt.wait(until=self.clock.t0 + S.MIN_FAIL_REAL)
                failures.import_model_file(self.cfg["patched_model"])
            self._load_weights()
        except SyntaxError as exc:
            return self._fail(exc, quit_first=True)
        except failures.OutOfMemoryError as exc:
            return self._fail(exc, quit_first=False)
        self._kv_cache()
        self._capture_graphs()
        self._load_drafter()
        self.log.line(lines.scheduler_info(self.cfg["kv_tokens"], self.cfg["context_len"],
                                           self._avail()))
        self._report(b"ready\n")
        self._serve()
        return 0

    def _load_weights(self) -> None:
        self._load_shards(S.WEIGHTS_START)
        self.rt.at(S.LOAD_END)
        self.log.line(lines.load_end(self.cfg["arch"], self._avail(),
                                     self.used - tl.CONTEXT_GIB))

    def _kv_cache(self) -> None:
        self.rt.at(S.KV_CACHE)
        kv = self.cfg["kv_gib"]
        self._hold(self.used + kv, 0)
        self.log.line(lines.kv_allocated(self.cfg["kv_tokens"], kv))
        self.log.line(f"Memory pool end. avail mem={self._avail():.2f} GB")

    def _capture_graphs(self) -> None:
        self.rt.at(S.GRAPHS_START)
        self.log.line(lines.capture_begin(self._avail()))
        total = len(S.BATCH_SIZES)
        for step, size in enumerate(S.BATCH_SIZES):
            self.rt.at(S.GRAPHS_START + S.GRAPHS_SECONDS * step / total)
            if self.rank == 0 and step % 6 == 0:
                desc = lines.capturing_desc(size, self._avail())
                self.log.line(vllm_lines.tqdm_bar(desc, step, total,
                                                  S.GRAPHS_SECONDS * step / total),
                              prefixed=False, fd=STDERR)
        self.rt.at(S.GRAPHS_START + S.GRAPHS_SECONDS)
        if self.rank == 0:
            desc = lines.capturing_desc(S.BATCH_SIZES[-1], self._avail())
            self.log.line(vllm_lines.tqdm_bar(desc, total, total, S.GRAPHS_SECONDS),
                          prefixed=False, fd=STDERR)
        self._hold(self.used + tl.GRAPHS_GIB, 0)
        self.log.line(lines.capture_end(S.GRAPHS_SECONDS, tl.GRAPHS_GIB, self._avail()))

    def _load_drafter(self) -> None:
        """EAGLE's draft model, after the target's graphs (SGLang builds its worker last)."""
        if self.spec is None:
            return
        self.rt.at(S.DRAFTER_START)
        self.log.line(f"Load weight begin. avail mem={self._avail():.2f} GB")
        if self.rank == 0:
            self.log.line(vllm_lines.shards_bar(SHARDS_LABEL, 0, 1, 0), prefixed=False,
                          fd=STDERR)
        self.rt.at(S.DRAFTER_START + S.DRAFTER_SECONDS - 1)
        self._hold(self.used + tl.DRAFTER_GIB, 4)
        if self.rank == 0:
            self.log.line(vllm_lines.shards_bar(SHARDS_LABEL, 1, 1, S.DRAFTER_SECONDS - 1),
                          prefixed=False, fd=STDERR)
        self.log.line(lines.load_end(lines.DRAFTERS[self.spec.algorithm],
                                     self._avail(), tl.DRAFTER_GIB))
        self.log.line(lines.capture_begin(self._avail(), draft=True))
        self.rt.at(S.DRAFTER_START + S.DRAFTER_SECONDS + S.DRAFT_GRAPHS_SECONDS)
        self._hold(self.used + S.DRAFT_GRAPHS_GIB, 0)
        self.log.line(lines.capture_end(S.DRAFT_GRAPHS_SECONDS, S.DRAFT_GRAPHS_GIB,
                                        self._avail(), draft=True))

    def _serve(self) -> None:
        """Busy GPUs; rank 0 logs decode stats every interval once the server is up. In
        engine-killed rank 0 SIGKILLs itself a while after that."""
        self.rt.sleep_sim(S.FIRST_DECODE, min_real=tl.MIN_STATS_REAL)
        kill_at = time.time() + max(tl.ENGINE_KILL_AFTER / self.clock.scale, tl.MIN_SERVE_REAL)
        while True:
            self._hold(self.used, self.rng.randint(35, 95))
            if self.rank == 0:
                self.log.line(self._decode_stats())
                if self.scenario == "engine-killed" and time.time() >= kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            self.rt.sleep_sim(S.STATS_INTERVAL, min_real=tl.MIN_STATS_REAL)

    def _decode_stats(self) -> str:
        rng = self.rng
        accept = None
        if self.spec is not None:
            rates = [min(1.0, 0.88 * 0.78**i * rng.uniform(0.95, 1.05))
                     for i in range(self.spec.num_steps)]
            length = 1 + sum(rates)
            accept = (length, length / (self.spec.num_steps + 1))
        running = rng.randint(4, 24)
        tokens = running * rng.randint(900, 2600)
        return lines.decode_batch(running, tokens, tokens / self.cfg["kv_tokens"],
                                  rng.uniform(250, 600), accept)

    def _fail(self, exc: BaseException, quit_first: bool) -> int:
        """As `run_scheduler_process`: log the record, SIGQUIT the launcher, return (see the
        module docstring for the order in syntax-error)."""
        self.failed = True
        if quit_first:  # SIGUSR1 is blocked since birth (the launcher's mask): waited for
            self._sigquit()
            signal.sigtimedwait([signal.SIGUSR1], S.QUIT_ACK_REAL)
        self.log.failure(lines.SCHEDULER_FAILED, exc)
        if not quit_first:
            self._sigquit()
        return 0

    def _sigquit(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.cfg["parent_pid"], signal.SIGQUIT)

    def _avail(self) -> float:
        return tl.DEVICE_TOTAL / GIB - self.used


def main() -> int:
    cfg = runtime.child_config()
    runtime.become(cfg["title"], cfg["parent_pid"])
    scheduler = Scheduler(cfg)
    code = scheduler.run()
    if scheduler.failed:
        scheduler.die(code, cfg["title"].removeprefix("sglang::"))
    return code


if __name__ == "__main__":
    sys.exit(main())
