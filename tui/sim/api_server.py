"""Simulated `vllm serve` (simulation only: powers `specconsole demo` and the tests).

    python -m tui.sim.engine serve MODEL --port P --tensor-parallel-size N
        [--speculative-config JSON] [other vllm args, shown in "non-default args", else ignored]
        --sim-scenario ready|syntax-error|oom|hang|engine-killed --sim-time-scale X
        [--sim-gpus 8] [--sim-gpu-state DIR] [--sim-flood LINES_PER_S]
        [--sim-orphans] [--sim-ignore-sigterm] [--sim-escapee]
        [--nnodes N --node-rank R --master-addr A --master-port M [--headless]]
        [--distributed-executor-backend ray]  (with RAY_ADDRESS=A:P, a `tui.sim.ray` cluster)

This process is the API server (`(APIServer pid=N)`). It spawns the engine core
(`VLLM::EngineCore_DP0`, `tui/sim/engine_core.py`), which spawns N workers (`VLLM::Worker_TP<r>`,
`tui/sim/worker.py`); all of them write vLLM-shaped lines to the inherited stdout/stderr on the
schedule of `timeline.py`, scaled by --sim-time-scale. Stdlib only: it runs wherever the
agent's Python runs, psutil or not.

Over several hosts (`tui/sim/cluster.py`): with --nnodes N, node 0 is this server, whose engine
core listens on the master port until the N-1 others join and then runs ranks [0, TP/N) itself;
node R runs with --headless (no API server, no engine core: only its ranks [R*TP/N, (R+1)*TP/N),
spawned at the head's request; its --sim-scenario overrides the head's for them). With
--distributed-executor-backend ray the engine core has the Ray head place all the ranks.

Faults for the kill and leftover tests (simulation only): --sim-orphans (the engine core and
workers outlive a killed API server, as real vLLM's do), --sim-ignore-sigterm (every process
ignores SIGTERM: only SIGKILL ends the run), --sim-escapee (one more process of the run that
left its session and group and holds GPU memory: `tui/sim/escapee.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
from typing import Any

from tui.sim import cluster, failures, flood, gpu_state, lines, node, runtime
from tui.sim import timeline as tl
from tui.sim.http_api import ServingState, SimHTTPServer
from tui.sim.runtime import SimClock, Terminated
from tui.sim.scenarios import SCENARIOS, positive
from tui.sim.simlog import SimLog

VLLM_DEFAULT_PORT = 8000


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m tui.sim.engine", allow_abbrev=False,
                                     description="Simulated vLLM server (simulation only).")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", allow_abbrev=False, help="behave like `vllm serve`")
    serve.add_argument("model_tag", nargs="?")
    serve.add_argument("--model")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int, default=VLLM_DEFAULT_PORT)
    serve.add_argument("--tensor-parallel-size", "-tp", type=positive(int), default=1)
    serve.add_argument("--speculative-config", type=_json_object)
    serve.add_argument("--served-model-name", nargs="+")
    serve.add_argument("--max-model-len", type=positive(int))
    serve.add_argument("--gpu-memory-utilization", type=positive(float),
                       default=tl.DEFAULT_GPU_UTIL)
    serve.add_argument("--sim-scenario", choices=SCENARIOS, default="ready")
    serve.add_argument("--sim-time-scale", type=positive(float), default=1.0)
    serve.add_argument("--sim-gpus", type=positive(int), default=8)
    serve.add_argument("--sim-flood", type=positive(float), metavar="LINES_PER_S",
                       help="once serving, also write a firehose of vLLM-shaped serving lines "
                       "(access log, request records, stats, warnings) at this rate")
    serve.add_argument("--sim-gpu-state", help="fake NVML state dir (default: "
                       f"${gpu_state.STATE_ENV} or ~/.specconsole/sim-gpus)")
    serve.add_argument("--sim-orphans", action="store_true",
                       help="the engine core and workers outlive a killed API server")
    serve.add_argument("--sim-ignore-sigterm", action="store_true",
                       help="every process of the server ignores SIGTERM")
    serve.add_argument("--sim-escapee", action="store_true",
                       help="start a process that leaves the session and holds GPU memory")
    serve.add_argument("--sim-harmless-error", metavar="TEXT",
                       help="also log this ERROR record at startup, one the launch survives "
                       "(a plugin that fails to import, as real servers log)")
    args, extra = parser.parse_known_args(argv)
    if not (args.model_tag or args.model):
        serve.error("the model is required (positional MODEL or --model)")
    return args, extra


def non_default_args(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """What vLLM prints as `non-default args: {...}`; --sim-* options are not vLLM's."""
    model = args.model_tag or args.model
    shown: dict[str, Any] = {"model_tag": model} if args.model_tag else {}
    if args.host is not None:
        shown["host"] = args.host
    if args.port != VLLM_DEFAULT_PORT:
        shown["port"] = args.port
    shown["model"] = model
    if args.tensor_parallel_size != 1:
        shown["tensor_parallel_size"] = args.tensor_parallel_size
    if args.speculative_config:
        shown["speculative_config"] = args.speculative_config
    for name in ("served_model_name", "max_model_len"):
        if getattr(args, name) is not None:
            shown[name] = getattr(args, name)
    if args.gpu_memory_utilization != tl.DEFAULT_GPU_UTIL:
        shown["gpu_memory_utilization"] = args.gpu_memory_utilization
    return {**shown, **_options(extra)}


def _options(tokens: list[str]) -> dict[str, Any]:
    """Unknown `--name value` / `--name=value` / `--flag` options, typed like vLLM shows them."""
    found: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--"):
            continue
        name, has_value, value = token[2:].partition("=")
        if not has_value and i < len(tokens) and not tokens[i].startswith("--"):
            value, has_value = tokens[i], "="
            i += 1
        found[name.replace("-", "_")] = _typed(value) if has_value else True
    return found


def _typed(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class ApiServer:
    """The top process: banner and config lines, the engine core, HTTP, shutdown."""

    def __init__(self, args: argparse.Namespace, extra: list[str],
                 nodes: cluster.Options) -> None:
        self.args = args
        self.model: str = args.model_tag or args.model
        self.arch = lines.architecture(self.model)
        self.spec = (lines.Spec.from_json(args.speculative_config)
                     if args.speculative_config else None)
        self.max_len: int = args.max_model_len or (262_144 if "Kimi" in self.arch else 163_840)
        self.shown_args = non_default_args(args, extra)
        self.clock = SimClock(time.time(), args.sim_time_scale)
        self.rt = runtime.Runtime(self.clock, args.sim_ignore_sigterm)
        self.log = SimLog("APIServer", self.clock)
        self.state_dir = gpu_state.state_dir(args.sim_gpu_state)
        served = args.served_model_name[0] if args.served_model_name else self.model
        self.state = ServingState(self.model, served, self.max_len, self.spec, self.clock.t0)
        self.http = SimHTTPServer(args.host or "0.0.0.0", args.port, self.state, self.log)
        self.engine: subprocess.Popen[bytes] | None = None
        self.engine_fd = -1
        self.patched: str | None = None
        self.serving = False
        self.gpus = args.sim_gpus
        self.nodes = nodes

    def run(self) -> int:
        try:
            return self._run()
        except Terminated:
            self._shutdown()
            return 0
        finally:
            self.http.server_close()
            if self.patched:
                failures.remove_patched_model(self.patched)

    def _run(self) -> int:
        self.gpus = gpu_state.ensure_devices(self.state_dir, self.args.sim_gpus)
        if self.args.sim_escapee:
            runtime.spawn("sim-escapee", "tui.sim.escapee",
                          {"python": runtime.this_python(), "gpu_state": self.state_dir}).wait()
        self.rt.at(tl.BANNER)
        for text in lines.banner(tl.VERSION, self.model):
            self.log.info(lines.SRC_BANNER, text)
        self.log.info(lines.SRC_ARGS, f"non-default args: {self.shown_args!r}")
        if self.args.sim_harmless_error:
            self.log.error(lines.SRC_PLUGINS, self.args.sim_harmless_error)
        self.log.line(lines.DEPRECATED)
        try:
            self.http.server_bind()
        except OSError as exc:  # e.g. [Errno 98] Address already in use, as vLLM fails
            self.log.bare_traceback(exc)
            return 1
        self.rt.at(tl.RESOLVE_ARCH)
        self.log.info(lines.SRC_ARCH, f"Resolved architecture: {self.arch}")
        self.log.info(lines.SRC_MAX_LEN, f"Using max model len {self.max_len}")
        if self.spec is not None and self.spec.has_drafter:
            self.log.info(lines.SRC_ARCH,
                          f"Resolved architecture: {lines.drafter_architecture(self.spec)}")
            self.log.info(lines.SRC_MAX_LEN, f"Using max model len {self.max_len}")
        self.log.info(lines.SRC_SCHEDULER,
                      "Chunked prefill is enabled with max_num_batched_tokens=8192.")
        if self.args.sim_scenario == "syntax-error":
            self.patched = failures.write_patched_model(self.arch)
        self.rt.at(tl.ENGINE_CORE_SPAWN)
        self._spawn_engine()
        if not self._wait_engine_ready():
            return self._engine_failed()
        self._start_serving()
        self._serve()
        return self._engine_died()

    def _spawn_engine(self) -> None:
        args = self.args
        read_fd, write_fd = os.pipe()
        config = {
            "t0": self.clock.t0, "scale": self.clock.scale, "scenario": args.sim_scenario,
            "model": self.model, "tp": args.tensor_parallel_size, "spec": args.speculative_config,
            "max_model_len": self.max_len, "gpu_util": args.gpu_memory_utilization,
            "gpus": self.gpus, "gpu_state": self.state_dir, "patched_model": self.patched,
            "dist_port": 40_000 + os.getpid() % 20_000, "python": runtime.this_python(),
            "status_fd": write_fd, "orphans": args.sim_orphans,
            "ignore_sigterm": args.sim_ignore_sigterm, "cluster": self.nodes.engine_config(),
        }
        self.engine = runtime.spawn("VLLM::EngineCore_DP0", "tui.sim.engine_core", config,
                                    pass_fds=[write_fd])
        os.close(write_fd)
        self.engine_fd = read_fd

    def _wait_engine_ready(self) -> bool:
        """True once the engine core says "ready"; False when its pipe closes (it died)."""
        received = b""
        while b"ready\n" not in received:
            self.rt.wait([self.engine_fd])
            data = os.read(self.engine_fd, 4096)
            if not data:
                return False
            received += data
        return True

    def _engine_failed(self) -> int:
        assert self.engine is not None
        code = self.engine.wait()
        self.rt.sleep_sim(tl.API_FAIL_EXIT)
        try:
            self._wait_for_engine_startup(code)
        except RuntimeError as exc:
            self.log.bare_traceback(exc)
        return 1

    def _wait_for_engine_startup(self, code: int) -> None:
        """Where vLLM's API server learns that the engine core process exited."""
        raise RuntimeError("Engine core initialization failed. See root cause above. "
                           f"Failed core proc(s): {({'EngineCore_DP0': code})!r}")

    def _start_serving(self) -> None:
        self.rt.sleep_sim(tl.API_READY_DELAY / 2)
        self.log.info(lines.SRC_API, "Supported tasks: ['generate']")
        host = self.args.host or "0.0.0.0"
        self.log.info(lines.SRC_API, f"Starting vLLM server on http://{host}:{self.args.port}")
        self.log.info(lines.SRC_LAUNCHER, "Available routes are:")
        for route in lines.ROUTES:
            methods = "POST" if route.startswith("/v1/") and route != "/v1/models" else "GET"
            self.log.info(lines.SRC_LAUNCHER, f"Route: {route}, Methods: {methods}")
        self.rt.sleep_sim(tl.API_READY_DELAY / 2)
        self.http.start()
        self.serving = True
        for text in (f"Started server process [{os.getpid()}]", "Waiting for application startup.",
                     "Application startup complete."):
            self.log.line(f"INFO:     {text}", prefixed=False)
        if self.args.sim_flood:
            threading.Thread(target=self._flood, args=(self.args.sim_flood,), daemon=True).start()

    def _flood(self, rate: float) -> None:
        """--sim-flood: the firehose, while serving (untagged: the lines are not this process's
        own records but a load generator's, counted by the benchmark from the log)."""
        assert self.engine is not None
        pids = {"APIServer": os.getpid(), "EngineCore_DP0": self.engine.pid}
        flood.pour(rate, flood.flood_lines(pids, self.clock.stamp), self.log.raw,
                   lambda: self.serving)

    def _serve(self) -> None:
        """Log stats every interval until the engine core's pipe closes (it died)."""
        interval = max(tl.STATS_INTERVAL / self.clock.scale, tl.MIN_STATS_REAL)
        next_stats = time.time() + interval
        while True:
            if self.rt.wait([self.engine_fd], until=next_stats):
                if not os.read(self.engine_fd, 4096):
                    return
                continue
            stats, spec = self.state.simulate(interval * self.clock.scale)
            self.log.info(lines.SRC_STATS, stats)
            if spec is not None:
                self.log.info(lines.SRC_SPEC, spec)
            next_stats += interval

    def _engine_died(self) -> int:
        """As vLLM: /health turns 503 at once, then the server shuts itself down with exit 0."""
        assert self.engine is not None
        self.state.engine_dead = True
        self.log.error(lines.SRC_CLIENT,
                       "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.")
        self.engine.wait()
        try:
            self._output_handler()
        except failures.EngineDeadError as exc:
            self.log.exception(lines.SRC_ASYNC, "AsyncLLM output_handler failed.", exc)
        self.rt.sleep_sim(tl.DEAD_SHUTDOWN, min_real=tl.MIN_DEAD_REAL)
        self.log.error(lines.SRC_LAUNCHER, "AsyncLLM has failed, terminating server process")
        self._stop_http()
        return 0

    def _output_handler(self) -> None:
        raise failures.EngineDeadError(failures.ENGINE_DEAD)

    def _stop_http(self) -> None:
        if not self.serving:
            return
        self.serving = False
        self.log.line("INFO:     Shutting down", prefixed=False)
        self.http.shutdown()
        for text in ("Waiting for application shutdown.", "Application shutdown complete.",
                     f"Finished server process [{os.getpid()}]"):
            self.log.line(f"INFO:     {text}", prefixed=False)

    def _shutdown(self) -> None:
        """SIGTERM/SIGINT: stop serving, TERM the engine core, KILL it after 0.3 s; exit 0."""
        self._stop_http()
        if self.engine is not None and self.engine.poll() is None:
            self.engine.terminate()
            try:
                self.engine.wait(timeout=0.3)
            except subprocess.TimeoutExpired:
                self.engine.kill()
                self.engine.wait()


def main(argv: list[str]) -> int:
    """`serve ...`, as `vllm serve` takes it (after engine.py took `--sim-engine` away)."""
    args, extra = parse_args(argv)
    nodes = cluster.parse_options(extra, args.tensor_parallel_size)
    if nodes.headless:
        return node.run_headless(args, nodes, cluster.explicit_scenario(argv))
    return ApiServer(args, extra, nodes).run()
