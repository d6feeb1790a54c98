"""What a serving server is doing: requests running and waiting, prompt and generation
throughput, KV-cache usage, prefix-cache hit rate, preemptions, speculative acceptance.

From the server's `/metrics` (Prometheus text, read with prometheus_client's parser) when it
exposes them, else from the line it logs every few seconds: vLLM's `Engine 000: Avg prompt
throughput: … Running: … Waiting: … GPU KV cache usage: …` (vllm/v1/metrics/loggers.py), SGLang's
`Decode batch. #running-req: … token usage: … gen throughput (token/s): … #queue-req: …`
(scheduler). Counters become rates between two scrapes. The names are the engines' own:
vLLM 0.8+ (`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_*`; older `vllm:gpu_*`), SGLang's
SchedulerMetricsCollector (`sglang:num_running_reqs`, `sglang:token_usage`, …).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, fields

KEEP = 30  # samples kept for the sparklines: five minutes at the default 10 s
LOG_AFTER_METRICS_S = 30.0  # the log line stands in only when /metrics has been quiet this long


@dataclass(frozen=True, slots=True)
class ServingSample:
    """One reading; None: the source does not say. Fractions are 0..1."""

    at: float
    source: str  # "metrics" or "log"
    running: float | None = None
    waiting: float | None = None
    prompt_tps: float | None = None
    gen_tps: float | None = None
    kv_usage: float | None = None
    prefix_hit: float | None = None
    preemptions: float | None = None  # since the server started
    spec_acceptance: float | None = None

    def figures(self) -> dict[str, float]:
        """The figures it has, by name (for `status` and `wait --json`)."""
        return {f.name: v for f in fields(self)
                if f.name not in ("at", "source") and (v := getattr(self, f.name)) is not None}


# -- /metrics ------------------------------------------------------------------------------------

_GAUGES = {  # field: the engines' gauge names, first found wins
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "gen_tps": ("sglang:gen_throughput",),
    "prefix_hit": ("sglang:cache_hit_rate",),
    "spec_acceptance": ("sglang:spec_accept_rate",),
    "preemptions": ("sglang:num_retracted_reqs",),
}
_COUNTERS = {  # rate or ratio of counters between two scrapes
    "prompt": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    "generation": ("vllm:generation_tokens_total", "sglang:generation_tokens_total"),
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "drafted": ("vllm:spec_decode_num_draft_tokens_total",),
    "accepted": ("vllm:spec_decode_num_accepted_tokens_total",),
}


def _sums(text: str) -> dict[str, float]:
    """Each sample name's value summed over its label sets (engines, models)."""
    # imported on the first scrape, not with the module: every CLI command imports this module
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, float] = {}
    peak: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
            peak[sample.name] = max(peak.get(sample.name, sample.value), sample.value)
    # KV cache usage of several engines (data parallel): the fullest, not the sum
    kv = [n for n in _GAUGES["kv_usage"] if n in peak]
    out.update({n: peak[n] for n in kv})
    return out


def _first(values: dict[str, float], names: Iterable[str]) -> float | None:
    return next((values[n] for n in names if n in values), None)


def _ratio(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else max(0.0, min(1.0, part / whole))


# -- the log line ----------------------------------------------------------------------------------

_NUM = r"([\d.]+)"
_VLLM = {
    "prompt_tps": re.compile(rf"Avg prompt throughput: {_NUM} tokens/s"),
    "gen_tps": re.compile(rf"Avg generation throughput: {_NUM} tokens/s"),
    "running": re.compile(rf"Running: {_NUM} reqs"),
    "waiting": re.compile(rf"(?:Waiting|Pending): {_NUM} reqs"),
    "kv_usage": re.compile(rf"(?:GPU|XPU|CPU|TPU|NPU|HPU)? ?KV cache usage: {_NUM}%"),
    "prefix_hit": re.compile(rf"(?<!External )Prefix cache hit rate: {_NUM}%"),
    "preemptions": re.compile(rf"Preemptions: {_NUM}"),
}
_SGLANG = {
    "running": re.compile(rf"#running-req: {_NUM}"),
    "waiting": re.compile(rf"#queue-req: {_NUM}"),
    "kv_usage": re.compile(rf"token usage: {_NUM}"),
    "gen_tps": re.compile(rf"gen throughput \(token/s\): {_NUM}"),
    "spec_acceptance": re.compile(rf"accept rate: {_NUM}"),
}
_PERCENT = frozenset({"kv_usage", "prefix_hit"})  # vLLM's line says them in percent


def parse_log_line(message: str, at: float) -> ServingSample | None:
    """The periodic stats line of either engine as a sample (None: not one)."""
    if "Avg prompt throughput" in message:
        found = {k: float(m.group(1)) for k, p in _VLLM.items() if (m := p.search(message))}
        for k in _PERCENT & found.keys():
            found[k] /= 100
    elif "Decode batch" in message:
        found = {k: float(m.group(1)) for k, p in _SGLANG.items() if (m := p.search(message))}
    else:
        return None
    return ServingSample(at, "log", **found) if found else None


# -- the readout ---------------------------------------------------------------------------------

class ServingReadout:
    """The samples of the last minutes, newest last; /metrics first, the log line else."""

    def __init__(self, keep: int = KEEP) -> None:
        self.samples: deque[ServingSample] = deque(maxlen=keep)
        self._last: tuple[float, dict[str, float]] | None = None  # the previous scrape
        self._metrics_at: float | None = None

    @property
    def latest(self) -> ServingSample | None:
        return self.samples[-1] if self.samples else None

    def feed_metrics(self, text: str, at: float) -> ServingSample | None:
        """A scrape of /metrics; None when it holds none of the serving figures."""
        try:
            values = _sums(text)
        except ValueError:  # not Prometheus text
            return None
        totals = {k: v for k, names in _COUNTERS.items() if (v := _first(values, names))
                  is not None}
        found = {k: v for k, names in _GAUGES.items() if (v := _first(values, names))
                 is not None}
        if not found and not totals:
            return None
        if "preemptions" in totals:
            found["preemptions"] = totals["preemptions"]
        found.setdefault("prefix_hit", _ratio(totals.get("prefix_hits"),
                                              totals.get("prefix_queries")))
        last = self._last
        if last is not None and at > last[0]:
            span, before = at - last[0], last[1]

            def delta(key: str) -> float | None:
                if key not in totals or key not in before:
                    return None
                return max(0.0, totals[key] - before[key])  # a restart resets counters

            for key, name in (("prompt", "prompt_tps"), ("generation", "gen_tps")):
                if (d := delta(key)) is not None:
                    found.setdefault(name, d / span)
            if (q := delta("prefix_queries")) and (h := delta("prefix_hits")) is not None:
                found["prefix_hit"] = _ratio(h, q)
            if (drafted := delta("drafted")) and (accepted := delta("accepted")) is not None:
                found["spec_acceptance"] = _ratio(accepted, drafted)
        self._last = (at, totals)
        self._metrics_at = at
        sample = ServingSample(at, "metrics", **{k: v for k, v in found.items()
                                                 if v is not None})
        self.samples.append(sample)
        return sample

    def feed_log(self, message: str, at: float) -> ServingSample | None:
        """The engine's periodic line: a sample only while /metrics says nothing."""
        if self._metrics_at is not None and at - self._metrics_at < LOG_AFTER_METRICS_S:
            return None
        sample = parse_log_line(message, at)
        if sample is not None:
            self.samples.append(sample)
        return sample

    def series(self, name: str) -> tuple[float, ...]:
        """One figure over the samples that have it, oldest first (for a sparkline)."""
        return tuple(v for s in self.samples if (v := getattr(s, name)) is not None)
