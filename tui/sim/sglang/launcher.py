"""Simulated `python -m sglang.launch_server` (simulation only), the top of tui.sim.sglang.

    python -m tui.sim.engine --sim-engine sglang --model-path M [--host H] [--port P]
        [--tp-size N] [--speculative-algorithm EAGLE3|EAGLE --speculative-draft-model-path D
        --speculative-num-steps S --speculative-eagle-topk K --speculative-num-draft-tokens T]
        [other SGLang args: ignored] --sim-scenario ready|syntax-error|oom|hang|engine-killed
        --sim-time-scale X [--sim-gpus 8] [--sim-gpu-state DIR]

It prints `server_args=ServerArgs(...)`, spawns the schedulers and the detokenizer, waits for
every scheduler's "ready", starts HTTP (uvicorn's lines), sends its warmup `POST /generate`,
then says "The server is fired up and ready to roll!" (/health answers 503 until then).

Deaths, as SGLang's launcher meets them: a scheduler's SIGQUIT -> "Received sigquit from a child
process ...", then, once a child is gone, SIGKILL of every child and of itself (SGLang's
kill_process_tree); a scheduler gone without a word (engine-killed: SIGKILL) -> "Child process
unexpectedly failed with exitcode=9. pid=N", /health 503, and the launcher stays up, wedged.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import time
import urllib.request
from typing import Any

from tui.sim import failures, gpu_state, runtime
from tui.sim import lines as vllm_lines
from tui.sim import timeline as tl
from tui.sim.http_api import ServingState, SimHTTPServer
from tui.sim.runtime import SimClock, Terminated
from tui.sim.scenarios import SCENARIOS, positive
from tui.sim.sglang import lines
from tui.sim.sglang import schedule as S
from tui.sim.sglang.log import SGLangLog


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tui.sim.engine --sim-engine sglang",
                                     allow_abbrev=False,
                                     description="Simulated SGLang server (simulation only).")
    parser.add_argument("--model-path", "--model", required=True)
    parser.add_argument("--host", default=S.DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=S.DEFAULT_PORT)
    parser.add_argument("--tp-size", "--tensor-parallel-size", type=positive(int), default=1)
    parser.add_argument("--served-model-name")
    parser.add_argument("--context-length", type=positive(int))
    parser.add_argument("--mem-fraction-static", type=positive(float),
                        default=S.MEM_FRACTION_STATIC)
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--speculative-algorithm", choices=tuple(lines.DRAFTERS))
    parser.add_argument("--speculative-draft-model-path")
    for knob in ("num-steps", "eagle-topk", "num-draft-tokens"):
        parser.add_argument(f"--speculative-{knob}", type=positive(int))
    parser.add_argument("--sim-scenario", choices=SCENARIOS, default="ready")
    parser.add_argument("--sim-time-scale", type=positive(float), default=1.0)
    parser.add_argument("--sim-gpus", type=positive(int), default=8)
    parser.add_argument("--sim-gpu-state")
    return parser.parse_known_args(argv)[0]


def _spec(args: argparse.Namespace) -> lines.Spec | None:
    if args.speculative_algorithm is None:
        return None
    return lines.Spec.from_json({
        "algorithm": args.speculative_algorithm, "draft_model": args.speculative_draft_model_path,
        "num_steps": args.speculative_num_steps, "eagle_topk": args.speculative_eagle_topk,
        "num_draft_tokens": args.speculative_num_draft_tokens})


class _Scheduler:
    """A spawned scheduler and the read end of its status pipe."""

    def __init__(self, rank: int, proc: subprocess.Popen[bytes], fd: int) -> None:
        self.rank = rank
        self.proc = proc
        self.fd = fd


class Launcher:
    """The top process (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.model: str = args.model_path
        self.arch = vllm_lines.architecture(self.model)
        self.spec = _spec(args)
        self.context_len: int = args.context_length or (
            262_144 if "Kimi" in self.arch else 163_840)
        self.clock = SimClock(time.time(), args.sim_time_scale)
        self.rt = runtime.Runtime(self.clock)
        signal.signal(signal.SIGQUIT, self._on_sigquit)
        self.log = SGLangLog("", self.clock)
        self.state_dir = gpu_state.state_dir(args.sim_gpu_state)
        self.state = ServingState(self.model, args.served_model_name or self.model,
                                  self.context_len, None, self.clock.t0, engine="sglang")
        self.state.starting = True
        self.http = SimHTTPServer(args.host, args.port, self.state, self.log)
        self.schedulers: list[_Scheduler] = []
        self.detokenizer: subprocess.Popen[bytes] | None = None
        self.patched: str | None = None
        self.serving = False

    def _on_sigquit(self, signum: int, _frame: object) -> None:
        self.rt.signal = signum  # raised as Terminated(SIGQUIT) at the next wait

    def run(self) -> int:
        try:
            return self._run()
        except Terminated as exc:
            if exc.args[0] == signal.SIGQUIT:
                self._child_failed()  # ends with SIGKILL of this process
            self._shutdown()
            return 0
        finally:
            self._cleanup()

    def _run(self) -> int:
        gpus = gpu_state.ensure_devices(self.state_dir, self.args.sim_gpus)
        self.rt.at(S.SERVER_ARGS)
        self.log.line(lines.server_args(self._server_args()))
        try:
            self.http.server_bind()
        except OSError as exc:  # e.g. [Errno 98] Address already in use
            self.log.bare_traceback(exc)
            return 1
        if self.args.sim_scenario == "syntax-error":
            self.patched = failures.write_patched_model(self.arch)
        self.rt.at(S.SCHEDULERS_SPAWN)
        self._spawn(gpus)
        lost = self._wait_ready()
        if lost is not None:
            return self._lost_at_startup(lost)
        self._start_http()
        self._warmup()
        self._lost_while_serving(self._wait_lost())
        self.rt.forever()  # wedged, as SGLang's launcher stays, until a signal ends it
        return 0

    def _server_args(self) -> dict[str, Any]:
        """The fields of SGLang's ServerArgs the simulation knows, in its order."""
        a, spec = self.args, self.spec
        return {
            "model_path": self.model, "tokenizer_path": self.model, "tokenizer_mode": "auto",
            "load_format": "auto", "trust_remote_code": a.trust_remote_code, "dtype": "auto",
            "kv_cache_dtype": "auto", "context_length": a.context_length, "device": "cuda",
            "served_model_name": a.served_model_name or self.model, "host": a.host,
            "port": a.port, "mem_fraction_static": a.mem_fraction_static,
            "chunked_prefill_size": 8192, "tp_size": a.tp_size, "dp_size": 1,
            "log_level": "info",
            "speculative_algorithm": spec.algorithm if spec else None,
            "speculative_draft_model_path": spec.draft_model if spec else None,
            "speculative_num_steps": spec.num_steps if spec else None,
            "speculative_eagle_topk": spec.eagle_topk if spec else None,
            "speculative_num_draft_tokens": spec.num_draft_tokens if spec else None,
        }

    def _spawn(self, gpus: int) -> None:
        # SIGUSR1 is a failing scheduler's go-ahead (see _child_failed): blocked here, so every
        # child inherits the mask before its interpreter starts, and none dies of it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        tp = self.args.tp_size
        kv = S.kv_cache_gib(self.args.mem_fraction_static, self.spec is not None)
        base = {
            "t0": self.clock.t0, "scale": self.clock.scale, "scenario": self.args.sim_scenario,
            "arch": self.arch, "tp": tp, "spec": self.spec.as_json() if self.spec else None,
            "gpu_state": self.state_dir, "patched_model": self.patched,
            "python": runtime.this_python(), "kv_gib": kv,
            "kv_tokens": int(kv * tl.GIB / tl.KV_BYTES_PER_TOKEN), "context_len": self.context_len,
        }
        for rank in range(tp):
            read_fd, write_fd = os.pipe()
            title = "sglang::scheduler" + lines.rank_tag(rank, tp).replace(" ", "_")
            proc = runtime.spawn(title, "tui.sim.sglang.scheduler",
                                 {**base, "rank": rank, "gpu": rank % gpus, "status_fd": write_fd},
                                 pass_fds=[write_fd])
            os.close(write_fd)
            self.schedulers.append(_Scheduler(rank, proc, read_fd))
        self.detokenizer = runtime.spawn("sglang::detokenizer", "tui.sim.sglang.detokenizer", base)

    def _wait_ready(self) -> _Scheduler | None:
        """Until every scheduler said "ready"; else the first found gone."""
        pending = {s.fd: s for s in self.schedulers}
        while pending:
            for fd in self.rt.wait(list(pending)):
                data = os.read(fd, 4096)
                if not data:
                    return self._gone(pending[fd])
                if b"ready" in data:
                    del pending[fd]
        return None

    def _wait_lost(self) -> _Scheduler:
        """Serving: until a scheduler is gone."""
        by_fd = {s.fd: s for s in self.schedulers}
        while True:
            for fd in self.rt.wait(list(by_fd)):
                if not os.read(fd, 4096):
                    return self._gone(by_fd[fd])

    def _gone(self, scheduler: _Scheduler) -> _Scheduler:
        """A scheduler that failed sent SIGQUIT before it exited: a moment for it to arrive
        (the wait raises it), so only a silent death is returned."""
        self.rt.sleep_sim(0, min_real=S.QUIT_SIGNAL_REAL)
        return scheduler

    def _status(self, scheduler: _Scheduler) -> str:
        """How SGLang's SIGCHLD handler reports it: waitpid's raw status, and the pid."""
        code = scheduler.proc.wait()
        return f"exitcode={-code if code < 0 else code << 8}. pid={scheduler.proc.pid}"

    def _lost_at_startup(self, scheduler: _Scheduler) -> int:
        self.log.line(f"Child process unexpectedly failed with {self._status(scheduler)}")
        self.log.line(f"Rank {scheduler.rank} scheduler is dead. Please check if there are "
                      "relevant logs.")
        return 1

    def _lost_while_serving(self, scheduler: _Scheduler) -> None:
        self.log.line(f"Child process unexpectedly failed with {self._status(scheduler)}")
        self.state.engine_dead = True

    def _start_http(self) -> None:
        self.rt.sleep_sim(S.HTTP_DELAY)
        self.http.start()
        self.serving = True
        host, port = self.args.host, self.args.port
        for text in (f"Started server process [{os.getpid()}]", "Waiting for application startup.",
                     "Application startup complete.",
                     f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)"):
            self.log.line(f"INFO:     {text}")

    def _warmup(self) -> None:
        """SGLang's warmup request, through its own HTTP server; then it is ready."""
        self.rt.sleep_sim(S.WARMUP_DELAY)
        host = "127.0.0.1" if self.args.host in ("0.0.0.0", "") else self.args.host
        body = {"text": "The capital city of France is",
                "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
        request = urllib.request.Request(f"http://{host}:{self.args.port}/generate",
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()
        self.log.line(lines.READY)  # said before /health answers 200, never after
        self.state.starting = False

    def _child_failed(self) -> None:
        """SIGQUIT: say so, let the failing child speak and exit (see scheduler.py), then
        SGLang's kill_process_tree: SIGKILL every child, then itself."""
        self.log.line(lines.SIGQUIT)
        for scheduler in self.schedulers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(scheduler.proc.pid, signal.SIGUSR1)
        self._until_one_exits(S.QUIT_ACK_REAL + 1.0)
        time.sleep(S.KILL_TREE_REAL)
        for proc in self._children():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        self._cleanup()
        os.kill(os.getpid(), signal.SIGKILL)

    def _until_one_exits(self, timeout: float) -> None:
        fds = [s.fd for s in self.schedulers]
        deadline = time.time() + timeout
        while (left := deadline - time.time()) > 0:
            readable, _, _ = select.select(fds, [], [], left)
            if any(not os.read(fd, 4096) for fd in readable):
                return

    def _children(self) -> list[subprocess.Popen[bytes]]:
        tree = [s.proc for s in self.schedulers]
        return [*tree, self.detokenizer] if self.detokenizer is not None else tree

    def _shutdown(self) -> None:
        """SIGTERM/SIGINT: stop serving, TERM the children, KILL them after 0.3 s; exit 0."""
        if self.serving:
            self.serving = False
            self.log.line("INFO:     Shutting down")
            self.http.shutdown()
            for text in ("Waiting for application shutdown.", "Application shutdown complete.",
                         f"Finished server process [{os.getpid()}]"):
                self.log.line(f"INFO:     {text}")
        children = [p for p in self._children() if p.poll() is None]
        for proc in children:
            proc.terminate()
        deadline = time.time() + 0.3
        for proc in children:
            try:
                proc.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _cleanup(self) -> None:
        self.http.server_close()
        if self.patched:
            failures.remove_patched_model(self.patched)


def main(argv: list[str]) -> int:
    return Launcher(parse_args(argv)).run()
