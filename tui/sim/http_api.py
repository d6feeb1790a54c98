"""The simulated API server's HTTP side: /health, /v1/models, /v1/completions, /metrics, and
SGLang's /generate.

The socket is bound early and listens only once the engine is ready, as vLLM does (a port in
use fails at once; before readiness a connection is refused). Traffic is simulated per stats
interval so the periodic `Engine 000:` and `SpecDecoding metrics:` lines and the Prometheus
`vllm:spec_decode_*` counters move like a busy server's.
"""

from __future__ import annotations

import json
import random
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tui.sim import lines
from tui.sim.simlog import SimLog
from tui.sim.timeline import VERSION

REPLY = "Hello from the simulated engine: no GPU was harmed in making this completion."


class ServingState:
    """Counters shared by the HTTP threads and the stats logger."""

    def __init__(self, model: str, served_name: str, max_model_len: int,
                 spec: lines.Spec | None, seed: float, engine: str = "vllm") -> None:
        self.model = model
        self.served_name = served_name
        self.max_model_len = max_model_len
        self.spec = spec
        self.engine = engine  # names the /metrics counters: `vllm:...`, `sglang:...`
        self.engine_dead = False
        self.starting = False  # SGLang's /health answers 503 until its warmup request is done
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._requests = 0
        self._drafts = 0
        self._accepted = [0] * (spec.num_tokens if spec else 0)
        # the scheduler's state of the last stats interval (gauges), and the prefix cache's
        # and preemptions' counters
        self._running = self._waiting = 0
        self._kv_usage = self._gen_tps = self._prefix_hit = 0.0
        self._prefix_queries = self._prefix_hits = self._preemptions = 0

    def simulate(self, seconds: float) -> tuple[str, str | None]:
        """Traffic for one stats interval of `seconds`: the stats line and the spec line."""
        rng = self._rng
        with self._lock:
            prompt_tps, gen_tps = rng.uniform(800, 2400), rng.uniform(250, 600)
            self._prompt_tokens += int(prompt_tps * seconds)
            self._generation_tokens += int(gen_tps * seconds)
            self._running, self._waiting = rng.randint(4, 24), rng.choice((0, 0, 0, 1, 3))
            self._kv_usage, self._gen_tps = rng.uniform(3, 18) / 100, gen_tps
            self._prefix_hit = rng.uniform(20, 60) / 100
            queries = int(prompt_tps * seconds)
            self._prefix_queries += queries
            self._prefix_hits += int(queries * self._prefix_hit)
            self._preemptions += int(self._waiting > 1)
            stats = lines.stats_line(prompt_tps, gen_tps, self._running,
                                     self._kv_usage * 100, self._prefix_hit * 100,
                                     self._waiting)
            if self.spec is None:
                return stats, None
            rates = [min(1.0, 0.88 * 0.78**i * rng.uniform(0.95, 1.05))
                     for i in range(self.spec.num_tokens)]
            drafts = int(gen_tps * seconds / (1 + sum(rates)))
            accepted = [round(drafts * r) for r in rates]
            self._drafts += drafts
            self._accepted = [a + b for a, b in zip(self._accepted, accepted, strict=True)]
            # newer vLLMs add "Current speculative depth": the sim alternates both wordings
            depth = self.spec.num_tokens if self._requests % 2 else None
            return stats, lines.spec_line(drafts, accepted, seconds, depth)

    def complete(self, body: dict[str, Any], chat: bool = False) -> dict[str, Any]:
        """An OpenAI-shaped answer: a completion, or a chat completion."""
        messages = body.get("messages") if chat else None
        prompt = " ".join(str(m.get("content", "")) for m in messages
                          if isinstance(m, dict)) if isinstance(messages, list) \
            else str(body.get("prompt", ""))
        words = REPLY.split()[: max(1, int(body.get("max_tokens", 16)))]
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(words)}
        number = self._count(usage)
        text = " ".join(words)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text},
             "finish_reason": "length"} if chat else
            {"index": 0, "text": " " + text, "logprobs": None, "finish_reason": "length",
             "stop_reason": None})
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-sim-{number}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model", self.served_name),
            "choices": [choice],
            "usage": {**usage, "total_tokens": sum(usage.values())},
            "system_fingerprint": f"vllm-{VERSION}",
        }

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """SGLang's native answer to `{"text": ..., "sampling_params": {...}}`."""
        params = body.get("sampling_params")
        limit = params.get("max_new_tokens", 16) if isinstance(params, dict) else 16
        words = REPLY.split()[: max(1, int(limit))]
        usage = {"prompt_tokens": len(str(body.get("text", "")).split()),
                 "completion_tokens": len(words)}
        number = self._count(usage)
        return {"text": " ".join(words), "meta_info": {
            "id": f"sim-{number}", **usage,
            "finish_reason": {"type": "length", "length": len(words)}}}

    def _count(self, usage: dict[str, int]) -> int:
        """Count one answered request; its number."""
        with self._lock:
            self._requests += 1
            self._prompt_tokens += usage["prompt_tokens"]
            self._generation_tokens += usage["completion_tokens"]
            return self._requests

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": self.served_name, "object": "model", "created": int(time.time()),
            "owned_by": self.engine, "root": self.model, "parent": None,
            "max_model_len": self.max_model_len}]}

    def metrics(self) -> str:
        labels = f'engine="0",model_name="{self.served_name}"'
        with self._lock:
            prefix = f"{self.engine}:"
            out = [*_counter(f"{prefix}prompt_tokens_total", "Number of prefill tokens processed.",
                             labels, self._prompt_tokens),
                   *_counter(f"{prefix}generation_tokens_total",
                             "Number of generation tokens processed.", labels,
                             self._generation_tokens),
                   *_counter(f"{prefix}request_success_total", "Count of successfully processed "
                             "requests.", labels, self._requests)]
            if self.engine == "sglang":  # SchedulerMetricsCollector's gauges
                gauges = (("num_running_reqs", self._running), ("num_queue_reqs", self._waiting),
                          ("token_usage", self._kv_usage), ("gen_throughput", self._gen_tps),
                          ("cache_hit_rate", self._prefix_hit))
            else:  # vllm/v1/metrics/loggers.py
                gauges = (("num_requests_running", self._running),
                          ("num_requests_waiting", self._waiting),
                          ("kv_cache_usage_perc", self._kv_usage))
                out += _counter("vllm:prefix_cache_queries_total", "Prefix cache queries.",
                                labels, self._prefix_queries)
                out += _counter("vllm:prefix_cache_hits_total", "Prefix cache hits.", labels,
                                self._prefix_hits)
                out += _counter("vllm:num_preemptions_total", "Cumulative preemptions.",
                                labels, self._preemptions)
            for name, value in gauges:
                out += [f"# HELP {prefix}{name} {name}.", f"# TYPE {prefix}{name} gauge",
                        f"{prefix}{name}{{{labels}}} {float(value)}"]
            if self.spec is not None:
                k = self.spec.num_tokens
                out += _counter("vllm:spec_decode_num_drafts_total",
                                "Number of spec decoding drafts.", labels, self._drafts)
                out += _counter("vllm:spec_decode_num_draft_tokens_total",
                                "Number of draft tokens.", labels, self._drafts * k)
                out += _counter("vllm:spec_decode_num_accepted_tokens_total",
                                "Number of accepted tokens.", labels, sum(self._accepted))
                name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
                out += [f"# HELP {name} Accepted tokens per draft position.",
                        f"# TYPE {name} counter"]
                out += [f'{name}{{{labels},position="{i}"}} {float(a)}'
                        for i, a in enumerate(self._accepted)]
        return "\n".join(out) + "\n"


def _counter(name: str, help_text: str, labels: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} counter",
            f"{name}{{{labels}}} {float(value)}"]


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, state: ServingState, log: SimLog) -> None:
        super().__init__((host, port), _Handler, bind_and_activate=False)
        self.state = state
        self.log = log

    def server_bind(self) -> None:
        # HTTPServer.server_bind would call socket.getfqdn(), slow on hosts without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def start(self) -> None:
        """Listen and serve in a daemon thread (the socket is already bound)."""
        self.server_activate()
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                         name="http", daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    server: SimHTTPServer

    def do_GET(self) -> None:
        state = self.server.state
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(503 if state.engine_dead or state.starting else 200, b"",
                       "application/json")
        elif path == "/v1/models":
            self._json(200, state.models())
        elif path == "/version":
            self._json(200, {"version": VERSION})
        elif path == "/metrics":
            self._send(200, state.metrics().encode(), "text/plain; version=0.0.4")
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        state = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        if self.path not in ("/v1/completions", "/v1/chat/completions", "/generate"):
            code, reply = 404, {"detail": "Not Found"}
        elif not isinstance(body, dict):
            code, reply = 400, {"error": {"message": "invalid JSON body", "code": 400}}
        elif state.engine_dead:
            code, reply = 500, {"error": {"message": "EngineCore encountered an issue. See "
                                          "stack trace (above) for the root cause.", "code": 500}}
        elif self.path == "/generate":
            code, reply = 200, state.generate(body)
        else:
            code, reply = 200, state.complete(body, chat=self.path.endswith("/chat/completions"))
        self._json(code, reply)
        host, port = self.client_address[:2]
        self.server.log.line(f'INFO:     {host}:{port} - "{self.requestline}" {code} '
                             f"{self.responses[code][0]}")

    def _json(self, code: int, data: dict[str, Any]) -> None:
        self._send(code, json.dumps(data).encode(), "application/json")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: http.server would write to stderr, i.e. into the run's log."""
