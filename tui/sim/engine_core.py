"""Simulated vLLM engine core (`VLLM::EngineCore_DP0`): spawns the workers and waits for them.

Started by the API server as `python -m tui.sim.engine_core`. It prints the engine config, spawns
one `VLLM::Worker_TP<r>` per rank, and follows their status pipes: all "kv" -> the KV cache
size lines, all "ready" -> "init engine ... took" and "ready" to the API server. Over several
hosts (`tui/sim/executor.py`) it first joins the other nodes or has the Ray head place the ranks,
and then treats a remote worker as a local one. A worker's EOF means it died: the engine core
logs the worker's exit code, stops the others and fails like vLLM ("EngineCore failed to
start." + traceback, then the bare multiprocessing traceback, exit 1). In engine-killed it
SIGKILLs itself a while after becoming ready.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from tui.sim import executor, failures, lines, runtime
from tui.sim import timeline as tl
from tui.sim.remote_rank import RemoteRank
from tui.sim.runtime import SimClock, Terminated
from tui.sim.simlog import STDERR, SimLog


class _Worker:
    """A spawned worker and what it has said on its status pipe."""

    def __init__(self, rank: int, proc: subprocess.Popen[bytes] | RemoteRank,
                 fd: int) -> None:
        self.rank = rank
        self.proc = proc
        self.fd = fd
        self.buffer = b""
        self.said: set[bytes] = set()
        self.alive = True


class EngineCore:
    """The engine core's side of the schedule (see the module docstring)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.spec = lines.Spec.from_json(cfg["spec"]) if cfg["spec"] else None
        self.clock = SimClock(cfg["t0"], cfg["scale"])
        self.rt = runtime.Runtime(self.clock, cfg.get("ignore_sigterm", False))
        self.log = SimLog("EngineCore_DP0", self.clock)
        self.workers: list[_Worker] = []
        self.cluster = executor.Executor.open(cfg, self.rt, self.log, self.clock)

    def run(self) -> int:
        try:
            return self._run()
        except Terminated:
            self._stop_workers(grace=0.0)
            return 0
        finally:
            if self.cluster is not None:
                self.cluster.close()

    def _run(self) -> int:
        for warning in lines.FUTURE_WARNINGS:
            self.log.line(warning, fd=STDERR)
        self.rt.at(tl.ENGINE_CONFIG)
        cfg = self.cfg
        self.log.info(lines.SRC_ENGINE, lines.engine_config(
            tl.VERSION, cfg["model"], self.spec, cfg["tp"], cfg["max_model_len"]))
        self.rt.at(tl.WORKERS_SPAWN)
        try:
            self._spawn_workers()
        except (executor.DistNetworkError, ConnectionError, ValueError) as exc:
            self._start_failed(exc, self.clock.now())
            return 1
        dead = self._wait_all(b"kv")
        if dead is not None:
            return self._fail(dead)
        drafter = self.spec is not None and self.spec.has_drafter
        kv_gib = tl.kv_cache_gib(cfg["gpu_util"], drafter)
        tokens = int(kv_gib * tl.GIB / tl.KV_BYTES_PER_TOKEN) // 16 * 16
        self.log.info(lines.SRC_KV, f"GPU KV cache size: {tokens:,} tokens")
        self.log.info(lines.SRC_KV, f"Maximum concurrency for {cfg['max_model_len']:,} tokens "
                      f"per request: {tokens / cfg['max_model_len']:.2f}x")
        dead = self._wait_all(b"ready")
        if dead is not None:
            return self._fail(dead)
        self.rt.at(tl.ENGINE_READY)
        took = self.clock.now() - tl.COMPILE_START
        self.log.info(lines.SRC_CORE_READY,
                      f"init engine (profile, create kv cache, warmup model) took {took:.2f} "
                      "seconds")
        os.write(cfg["status_fd"], b"ready\n")
        if cfg["scenario"] == "engine-killed":
            self.rt.sleep_sim(tl.ENGINE_KILL_AFTER,
                              min_real=tl.MIN_SERVE_REAL + tl.API_READY_DELAY / self.clock.scale)
            os.kill(os.getpid(), signal.SIGKILL)
        dead = self._wait_all(None)  # serving: returns only when a worker dies
        if dead is not None:
            self._log_death(dead)
            self._stop_workers(grace=0.0)
        return 1

    def _spawn_workers(self) -> None:
        cfg = self.cfg
        ranks, remote = range(cfg["tp"]), list[RemoteRank]()
        if self.cluster is not None:
            ranks, remote = self.cluster.start(cfg)
        for rank in ranks:
            read_fd, write_fd = os.pipe()
            local = rank - ranks.start
            child = {**cfg, "rank": rank, "gpu": local % cfg["gpus"], "local_rank": local,
                     "status_fd": write_fd}
            proc = runtime.spawn(f"VLLM::Worker_TP{rank}", "tui.sim.worker", child,
                                 pass_fds=[write_fd])
            os.close(write_fd)
            self.workers.append(_Worker(rank, proc, read_fd))
        self.workers += [_Worker(r.rank, r, r.fd) for r in remote]

    def _wait_all(self, message: bytes | None) -> _Worker | None:
        """Until every worker said `message` (None: forever); returns a worker found dead."""
        while message is None or not all(message in w.said for w in self.workers):
            by_fd = {w.fd: w for w in self.workers if w.alive}
            for fd in self.rt.wait(list(by_fd)):
                worker = by_fd[fd]
                data = os.read(fd, 4096)
                if not data:
                    worker.alive = False
                    return worker
                worker.buffer += data
                *said, worker.buffer = worker.buffer.split(b"\n")
                worker.said.update(said)
        return None

    def _log_death(self, worker: _Worker) -> None:
        """Reap the worker and say how it ended (no one else can know a grandchild's code)."""
        code = worker.proc.wait()
        self.log.error(lines.SRC_EXECUTOR_MONITOR, f"Worker proc Worker_TP{worker.rank} died "
                       f"unexpectedly (exit code: {code}), shutting down executor.")

    def _fail(self, first: _Worker) -> int:
        self._log_death(first)
        died = self.clock.now()
        self._stop_workers(grace=tl.ENGINE_FAIL_GRACE / self.clock.scale)
        self.rt.at(died + tl.ENGINE_FAIL_LOG)
        try:
            self._wait_for_ready()
        except Exception as exc:
            self._start_failed(exc, died + tl.ENGINE_FAIL_EXIT)
        return 1

    def _start_failed(self, exc: BaseException, exit_at: float) -> None:
        self.log.exception(lines.SRC_CORE_FAIL, "EngineCore failed to start.", exc)
        self.rt.at(exit_at)
        self.log.bare_traceback(exc, first="Process EngineCore_DP0:")

    def _wait_for_ready(self) -> None:
        """Where vLLM's executor notices a worker that failed to start."""
        raise Exception(failures.WORKER_INIT_FAILED)

    def _stop_workers(self, grace: float) -> None:
        """Let the workers exit by themselves for `grace` seconds, then TERM, then KILL."""
        deadline = time.time() + grace
        for worker in self.workers:
            try:
                worker.proc.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                worker.proc.terminate()
        deadline = time.time() + 0.2
        for worker in self.workers:
            try:
                worker.proc.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()


def main() -> int:
    cfg = runtime.child_config()
    runtime.become(cfg["title"], cfg["parent_pid"], cfg.get("orphans", False))
    return EngineCore(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
