"""Simulated vLLM worker (`VLLM::Worker_TP<r>`): holds one fake GPU and loads the model.

Started by the engine core as `python -m tui.sim.worker` with argv[0] = its title. It follows
the shared schedule (`timeline.py`), grows its GPU memory through the fake NVML's holder file,
reports "kv" and "ready" to the engine core on a status pipe (EOF there = this worker died),
and fails as the scenario says: a real SyntaxError from the patched model file, a CUDA OOM
while loading weights, or a hang (no more lines, memory frozen, process alive).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from tui.sim import failures, lines, runtime
from tui.sim import timeline as tl
from tui.sim.rank import SHARDS_LABEL, Rank
from tui.sim.simlog import STDERR, SimLog


class Worker(Rank):
    """One rank: the schedule of timeline.py, its GPU holder file, its status pipe."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.spec = lines.Spec.from_json(cfg["spec"]) if cfg["spec"] else None
        self.born = time.time()
        ray_ip = cfg.get("ray_ip")  # a Ray worker: Ray's prefix on every line, none of vLLM's
        ray = f"(RayWorkerWrapper pid={os.getpid()}, ip={ray_ip}) " if ray_ip else ""
        self.log = SimLog(f"Worker_TP{self.rank}", self.clock, "" if ray else None, ray)

    def _run(self) -> int:
        self.log.line(lines.FUTURE_WARNINGS[0], fd=STDERR)
        self._rendezvous()
        self.rt.at(tl.WORKER_INIT)
        self._hold(tl.CONTEXT_GIB, 0)
        self.log.info(lines.SRC_PARALLEL,
                      f"world_size={self.tp} rank={self.rank} "
                      f"local_rank={self.cfg.get('local_rank', self.rank)} "
                      "distributed_init_method=tcp://"
                      f"{self.cfg.get('dist_host', '127.0.0.1')}:{self.cfg['dist_port']} "
                      "backend=nccl")
        self.log.info(lines.SRC_RANKS,
                      f"rank {self.rank} in world size {self.tp} is assigned as DP rank 0, "
                      f"PP rank 0, TP rank {self.rank}, EP rank {self.rank}")
        self.rt.at(tl.TRITON_IMPORT)
        self.log.error(lines.SRC_TRITON, lines.TRITON_ERROR)
        if self.scenario == "syntax-error":
            self.rt.at(tl.MODEL_IMPORT + self.rank * tl.WORKER_IMPORT_STAGGER)
            # a real worker imports torch for seconds before the model file; however fast the
            # simulated clock, never die before a watcher could have started
            self.rt.wait(until=self.born + tl.MIN_IMPORT_REAL)
            try:
                self._init_model_runner()
            except SyntaxError as exc:
                self.log.exception(lines.SRC_EXECUTOR, "WorkerProc failed to start.", exc)
                return 1
        self.rt.at(tl.LOAD_START)
        self.log.info(lines.SRC_RUNNER, f"Starting to load model {self.cfg['model']}...")
        try:
            self._load_weights()
        except failures.OutOfMemoryError as exc:
            self.log.exception(lines.SRC_EXECUTOR, "WorkerProc failed to start.", exc)
            return 1
        self._load_drafter()
        self._compile()
        self._kv_cache()
        self._capture_graphs()
        self._report(b"ready\n")
        self._serve()
        return 0

    def _rendezvous(self) -> None:
        """On a node that joined a multi-node launch, wait for the whole world (torch's
        rendezvous): the head sends the schedule's shift once every node has joined."""
        go_fd = self.cfg.get("go_fd")
        if go_fd is not None:
            self.rt.wait([go_fd])
            shift = os.read(go_fd, 64)
            if not shift:  # the node is gone, and PR_SET_PDEATHSIG with it
                self.rt.forever()
            self.clock.shift = float(shift)

    def _init_model_runner(self) -> None:
        """Import the model file, as the model runner does (a real SyntaxError if it is broken)."""
        failures.import_model_file(self.cfg["patched_model"])

    def _load_weights(self) -> None:
        self._load_shards(tl.WEIGHTS_START)
        took = self.clock.now() - tl.WEIGHTS_START
        self.log.info(lines.SRC_LOADER, f"Loading weights took {took:.2f} seconds")

    def _load_drafter(self) -> None:
        if self.spec is not None and self.spec.has_drafter:
            self.rt.at(tl.DRAFTER_START)
            self.log.info(lines.SRC_RUNNER, "Loading drafter model...")
            if self.rank == 0:
                self.log.line(lines.shards_bar(SHARDS_LABEL, 0, 1, 0), prefixed=False,
                              fd=STDERR)
            self.rt.at(tl.DRAFTER_START + tl.DRAFTER_SECONDS - 2)
            self._hold(self.used + tl.DRAFTER_GIB, 4)
            took = self.clock.now() - tl.DRAFTER_START
            if self.rank == 0:
                self.log.line(lines.shards_bar(SHARDS_LABEL, 1, 1, took), prefixed=False,
                              fd=STDERR)
            self.log.info(lines.SRC_LOADER, f"Loading weights took {took:.2f} seconds")
            if self.spec.method.startswith("eagle"):
                self.log.info(lines.SRC_EAGLE, "Using Eagle3 auxiliary layers from model: "
                              "(2, 30, 58)")
                self.log.info(lines.SRC_EAGLE, "Assuming the EAGLE head shares the same vocab "
                              "embedding with the target model.")
        took = self.clock.now() - tl.LOAD_START
        self.log.info(lines.SRC_LOADED,
                      f"Model loading took {self.used - tl.CONTEXT_GIB:.4f} GiB memory and "
                      f"{took:.6f} seconds")

    def _compile(self) -> None:
        self.rt.at(tl.COMPILE_START)
        self.log.info(lines.SRC_BACKENDS,
                      "Using cache directory: /root/.cache/vllm/torch_compile_cache/3f1c0e8a5b/"
                      f"rank_{self.rank}_0/backbone for vLLM's torch.compile")
        base = self.used
        self._hold(base + tl.PROFILE_PEAK_GIB, 100)
        self.rt.at(tl.COMPILE_START + tl.DYNAMO_SECONDS)
        self.log.info(lines.SRC_BACKENDS,
                      f"Dynamo bytecode transform time: {tl.DYNAMO_SECONDS:.2f} s")
        self.rt.at(tl.KV_CACHE_START - 0.5)
        graph = tl.COMPILE_SECONDS - tl.DYNAMO_SECONDS - 25.0
        self.log.info(lines.SRC_BACKENDS,
                      f"Compiling a graph for compile range (1, 8192) takes {graph:.2f} s")
        took = self.clock.now() - tl.COMPILE_START
        self.log.info(lines.SRC_MONITOR,
                      f"torch.compile and initial profiling run took {took:.2f} s in total")
        self._hold(base, 0)

    def _kv_cache(self) -> None:
        self.rt.at(tl.KV_CACHE_START + 2)
        kv = tl.kv_cache_gib(self.cfg["gpu_util"], self.spec is not None and self.spec.has_drafter)
        self.log.info(lines.SRC_WORKER, f"Available KV cache memory: {kv:.2f} GiB")
        self._hold(self.used + kv, 0)
        self._report(b"kv\n")

    def _capture_graphs(self) -> None:
        self.rt.at(tl.GRAPHS_START)
        phases = (("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", 67, 0.6),
                  ("Capturing CUDA graphs (decode, FULL)", 35, 0.4))
        start = tl.GRAPHS_START
        for desc, total, share in phases:
            seconds = tl.GRAPHS_SECONDS * share
            for step in range(0, total, 8 if total > 40 else 5):
                self.rt.at(start + seconds * step / total)
                if self.rank == 0:
                    elapsed = seconds * step / total
                    self.log.line(lines.tqdm_bar(desc, step, total, elapsed), prefixed=False,
                                  fd=STDERR)
            self.rt.at(start + seconds)
            if self.rank == 0:
                self.log.line(lines.tqdm_bar(desc, total, total, seconds), prefixed=False,
                              fd=STDERR)
            start += seconds
        self._hold(self.used + tl.GRAPHS_GIB, 0)
        self.log.info(lines.SRC_GRAPHS, f"Graph capturing finished in {tl.GRAPHS_SECONDS:.0f} "
                      f"secs, took {tl.GRAPHS_GIB:.2f} GiB")

    def _serve(self) -> None:
        """Busy GPUs while serving: the utilisation moves, the memory stays."""
        interval = tl.STATS_INTERVAL
        while True:
            self._hold(self.used, self.rng.randint(35, 95))
            self.rt.sleep_sim(interval, min_real=tl.MIN_STATS_REAL)


def main() -> int:
    cfg = runtime.child_config()
    runtime.become(cfg["title"], cfg["parent_pid"], cfg.get("orphans", False))
    worker = Worker(cfg)
    code = worker.run()
    if code:
        worker.die(code, f"Worker_TP{worker.rank}")
    return code


if __name__ == "__main__":
    sys.exit(main())
