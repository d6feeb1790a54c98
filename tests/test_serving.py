"""The serving readout (issue 19): the figures from /metrics (vLLM's and SGLang's own metric
names, parsed with prometheus_client), rates between scrapes, the periodic stats line as the
fallback; specconsole's own probes hidden from the filtered log; the agent's gentle pace once
the server is healthy."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tui.agent import health as agent_health
from tui.core.logline import parse_line
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.serving import ServingReadout, parse_log_line

# lines real servers wrote: the vLLM lane (0.32, CPU), a vLLM 0.6-era issue log, SGLang's
VLLM_032 = ("(APIServer pid=25527) INFO 12-03 08:25:57 [loggers.py:335] Engine 000: Avg prompt "
            "throughput: 4.0 tokens/s, Avg generation throughput: 7.2 tokens/s, Running: 1 reqs, "
            "Waiting: 2 reqs, CPU KV cache usage: 12.5%, Prefix cache hit rate: 40.0%")
VLLM_OLD = ("INFO 09-05 10:00:00 metrics.py:351] Avg prompt throughput: 2082.8 tokens/s, Avg "
            "generation throughput: 194.4 tokens/s, Running: 3 reqs, Swapped: 0 reqs, Pending: "
            "0 reqs, GPU KV cache usage: 4.8%, CPU KV cache usage: 0.0%.")
SGLANG = ("[2025-09-03 18:33:19 TP0] Decode batch. #running-req: 1, #token: 186, token usage: "
          "0.02, accept len: 1.95, accept rate: 0.49, cuda graph: True, gen throughput "
          "(token/s): 178.86, #queue-req: 3, ")


def test_the_stats_lines_of_both_engines_read_as_figures() -> None:
    new = parse_log_line(VLLM_032, 1.0)
    assert new is not None and new.source == "log"
    assert (new.prompt_tps, new.gen_tps, new.running, new.waiting) == (4.0, 7.2, 1, 2)
    assert new.kv_usage == pytest.approx(0.125) and new.prefix_hit == pytest.approx(0.4)
    old = parse_log_line(VLLM_OLD, 1.0)
    assert old is not None and (old.running, old.waiting) == (3, 0)
    assert old.kv_usage == pytest.approx(0.048)  # the GPU's, not the CPU swap space's
    sg = parse_log_line(SGLANG, 1.0)
    assert sg is not None and (sg.running, sg.waiting, sg.gen_tps) == (1, 3, 178.86)
    assert sg.kv_usage == pytest.approx(0.02) and sg.spec_acceptance == pytest.approx(0.49)
    assert parse_log_line("INFO 09-05 10:00:00 [x.py:1] Loading weights took 3 s", 1.0) is None


def _vllm_metrics(prompt: float, gen: float, queries: float, hits: float, drafted: float,
                  accepted: float) -> str:
    """vLLM 0.32's exposition, two data-parallel engines: TYPE lines, labels, _total."""
    out = []
    for engine in ("0", "1"):
        labels = f'engine="{engine}",model_name="m"'
        out += [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} 2.0",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} 1.0",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} {0.25 if engine == '0' else 0.5}",
            "# TYPE vllm:prompt_tokens counter",
            f"vllm:prompt_tokens_total{{{labels}}} {prompt / 2}",
            f"vllm:prompt_tokens_created{{{labels}}} 1.7e9",
            "# TYPE vllm:generation_tokens counter",
            f"vllm:generation_tokens_total{{{labels}}} {gen / 2}",
            "# TYPE vllm:prefix_cache_queries counter",
            f"vllm:prefix_cache_queries_total{{{labels}}} {queries / 2}",
            "# TYPE vllm:prefix_cache_hits counter",
            f"vllm:prefix_cache_hits_total{{{labels}}} {hits / 2}",
            "# TYPE vllm:num_preemptions counter",
            f"vllm:num_preemptions_total{{{labels}}} 3.0",
            "# TYPE vllm:spec_decode_num_draft_tokens counter",
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {drafted / 2}",
            "# TYPE vllm:spec_decode_num_accepted_tokens counter",
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted / 2}",
        ]
    return "\n".join(out) + "\n"


def test_vllm_metrics_become_figures_and_counters_become_rates_between_scrapes() -> None:
    readout = ServingReadout()
    first = readout.feed_metrics(_vllm_metrics(1000, 500, 800, 200, 300, 150), 100.0)
    assert first is not None and first.source == "metrics"
    assert (first.running, first.waiting) == (4.0, 2.0)  # summed over the engines
    assert first.kv_usage == 0.5  # the fullest engine's cache
    assert first.prefix_hit == pytest.approx(0.25)  # cumulative until a second scrape
    assert first.preemptions == 6.0 and first.prompt_tps is None  # a rate needs two
    second = readout.feed_metrics(_vllm_metrics(3000, 1500, 1800, 700, 900, 600), 110.0)
    assert second is not None
    assert (second.prompt_tps, second.gen_tps) == (200.0, 100.0)
    assert second.prefix_hit == pytest.approx(0.5)  # 500 hits of 1000 queries since
    assert second.spec_acceptance == pytest.approx(0.75)  # 450 accepted of 600 drafted
    assert readout.series("gen_tps") == (100.0,) and readout.series("running") == (4.0, 4.0)
    # a restarted server's counters start again: no negative rate
    third = readout.feed_metrics(_vllm_metrics(10, 5, 8, 2, 3, 1), 120.0)
    assert third is not None and third.prompt_tps == 0.0 and third.gen_tps == 0.0


def test_sglang_metrics_and_the_log_line_only_when_metrics_are_quiet() -> None:
    text = ("# TYPE sglang:num_running_reqs gauge\n"
            'sglang:num_running_reqs{model_name="m"} 8\n'
            'sglang:num_queue_reqs{model_name="m"} 4\n'
            'sglang:token_usage{model_name="m"} 0.52\n'
            'sglang:gen_throughput{model_name="m"} 1234.5\n'
            'sglang:cache_hit_rate{model_name="m"} 0.28\n'
            'sglang:spec_accept_rate{model_name="m"} 0.61\n')
    readout = ServingReadout()
    sample = readout.feed_metrics(text, 50.0)
    assert sample is not None and sample.figures() == {
        "running": 8.0, "waiting": 4.0, "gen_tps": 1234.5, "kv_usage": 0.52,
        "prefix_hit": 0.28, "spec_acceptance": 0.61}
    assert readout.feed_log(SGLANG, 55.0) is None  # /metrics spoke a moment ago
    later = readout.feed_log(SGLANG, 50.0 + 31)
    assert later is not None and later.source == "log" and readout.latest is later
    assert ServingReadout().feed_metrics("<html>not metrics</html>", 1.0) is None
    assert ServingReadout().feed_metrics("# TYPE other counter\nother_total 3\n", 1.0) is None


@pytest.mark.parametrize(("line", "hidden"), [
    ('INFO:     127.0.0.1:38432 - "GET /health HTTP/1.1" 200 OK', True),
    ('INFO:     127.0.0.1:38440 - "GET /metrics HTTP/1.1" 200 OK', True),
    ('INFO:     127.0.0.1:38444 - "GET /v1/models HTTP/1.1" 200 OK', True),
    ('(APIServer pid=7) INFO:     127.0.0.1:38432 - "GET /health HTTP/1.1" 503', True),
    ('INFO:     10.0.3.7:51234 - "GET /health HTTP/1.1" 200 OK', False),  # someone else's
    ('INFO:     127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 200 OK', False),
    ('INFO:     127.0.0.1:51234 - "GET /v1/models/extra HTTP/1.1" 404 Not Found', False),
])
def test_the_tools_own_probes_are_hidden_under_their_own_name(line: str, hidden: bool) -> None:
    for engine in ("vllm", "sglang"):
        noise = NoiseFilter(builtin_rules(engine))
        rule = noise.classify(parse_line(line, 0))
        assert (rule is not None and rule.id == "specconsole-probe") is hidden, (engine, rule)
        assert noise.hidden.get("specconsole-probe", 0) == int(hidden)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    asked: Counter[str]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.asked[self.path] += 1
        body = b"vllm:num_requests_running 1\nvllm:x_bucket{le=\"1\"} 2\nother 3\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Ticks(threading.Event):
    """The health thread's stop event: each wait is recorded (its timeout and what the server
    had been asked by then) and returns at once, so the schedule is read from the waits, not
    from a clock; set after `ticks` waits."""

    def __init__(self, server: _Server, ticks: int) -> None:
        super().__init__()
        self.server, self.ticks = server, ticks
        self.waits: list[tuple[float | None, Counter[str]]] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append((timeout, self.server.asked.copy()))
        if len(self.waits) >= self.ticks:
            self.set()
        return self.is_set()


def test_the_agent_asks_every_second_until_healthy_then_once_a_serving_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Scaled: 0.05 s before READY, 0.25 s after. Once healthy, one request a tick (the
    metrics), /health every HEALTH_EVERY ticks, the other paths every CONFIRM_EVERY; the
    metrics lines sent are the asked prefix, histogram buckets left out."""
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(agent_health, "emit", lambda t, **f: sent.append({"t": t, **f}))
    server = _Server(("127.0.0.1", 0), _Handler)
    server.asked = Counter()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                     daemon=True).start()
    thread = agent_health.Health(server.server_address[1], ["/health", "/v1/models"], 0.05,
                                 0.25, ("/metrics", ("vllm:",)))
    serving = agent_health.CONFIRM_EVERY
    thread.stop = ticks = _Ticks(server, 1 + serving)
    try:
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        server.shutdown()
    asked = [now - before for before, now in pairwise([Counter(), *(c for _, c in ticks.waits)])]
    assert [timeout for timeout, _ in ticks.waits] == [0.05] + [0.25] * serving
    assert asked[0] == {"/health": 1, "/v1/models": 1}  # not yet known healthy: every path
    assert asked[1:] == [Counter({"/metrics": 1,
                                  "/health": int(tick % agent_health.HEALTH_EVERY == 0),
                                  "/v1/models": int(tick == serving)}) - Counter()
                         for tick in range(1, serving + 1)]
    metrics = [e for e in sent if e["t"] == "metrics"]
    assert metrics and metrics[-1]["text"] == "vllm:num_requests_running 1"
    assert [e["ok"] for e in sent if e["t"] == "health"] == [True, True]


def _real_stats_lines(marker: str) -> list[tuple[str, str]]:
    """(file, line) of every periodic stats line in the real logs: corpus and lane fixtures."""
    root = Path(__file__).parent
    files = [*sorted((root / "corpus" / "logs").glob("*.log")),
             *sorted((root / "fixtures").glob("vllm-real-*.log"))]
    return [(f.name, line) for f in files
            for line in f.read_text(errors="replace").split("\n") if marker in line]


def test_every_real_stats_line_reads_as_figures() -> None:
    """The periodic lines of real logs (vLLM 0.4 to 0.32, SGLang of several years, as pasted in
    public issue threads): each reads as a sample with the figures its engine's line carries."""
    vllm = _real_stats_lines("Avg prompt throughput")
    sglang = _real_stats_lines("Decode batch. #running-req")
    assert len(vllm) >= 15 and len(sglang) >= 15, (len(vllm), len(sglang))
    for name, line in vllm:
        s = parse_log_line(line, 1.0)
        assert s is not None and None not in (s.prompt_tps, s.gen_tps, s.running, s.waiting), \
            (name, line)
        assert s.kv_usage is not None and 0 <= s.kv_usage <= 1, (name, line)
    for name, line in sglang:
        s = parse_log_line(line, 1.0)
        assert s is not None and s.running is not None and s.kv_usage is not None, (name, line)
