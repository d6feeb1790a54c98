"""Spec-decode acceptance, from vLLM's own text: the `SpecDecoding metrics:` log line and
the `vllm:spec_decode_*` counters of /metrics (vllm-reference.md, section 4), and from SGLang's
`Decode batch. ... accept len: X, accept rate: Y, ...` line (section 5).

The log line is per logging interval; the counters are totals since start. Both are parsed
tolerantly: newer builds insert `Current speculative depth: N,` in the line, and Prometheus
lines carry labels in any order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: (?P<mean>[\d.]+),"
    r"(?: Current speculative depth: (?P<depth>\d+),)?"
    r" Accepted throughput: (?P<acc_tp>[\d.]+) tokens/s,"
    r" Drafted throughput: (?P<draft_tp>[\d.]+) tokens/s,"
    r" Accepted: (?P<accepted>\d+) tokens,"
    r" Drafted: (?P<drafted>\d+) tokens,"
    r" Per-position acceptance rate: (?P<per_pos>[\d., ]+?),"
    r" Avg Draft acceptance rate: (?P<rate>[\d.]+)%")
# SGLang's rate is a fraction; its line has no counts. Older builds print no rate: too little.
_SGLANG_LINE = re.compile(
    r"accept len: (?P<mean>[\d.]+), accept rate: (?P<rate>[\d.]+),"
    r"(?:.*?gen throughput \(token/s\): (?P<gen_tp>[\d.]+))?")
_COUNTER = re.compile(r"^vllm:spec_decode_(?P<name>num_\w+?)_total(?:\{(?P<labels>[^}]*)\})?"
                      r" (?P<value>\S+)$", re.M)
_POSITION = re.compile(r'position="(\d+)"')


@dataclass(frozen=True, slots=True)
class SpecDecodeInterval:
    """One `SpecDecoding metrics:` line (or SGLang's `Decode batch.` line, which has no counts
    and no per-position rates): one logging interval of one engine."""

    mean_acceptance_length: float
    accepted: int | None
    drafted: int | None
    per_position: tuple[float, ...]
    acceptance_rate: float  # percent
    depth: int | None = None
    gen_throughput: float | None = None  # tokens/s (SGLang)


@dataclass(frozen=True, slots=True)
class SpecDecodeTotals:
    """The /metrics counters since start, summed over engines."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]


def parse_interval(message: str) -> SpecDecodeInterval | None:
    """The figures of a `SpecDecoding metrics:` message or of an SGLang `Decode batch.` message
    with acceptance figures, or None for any other line."""
    if "Decode batch" in message:
        return _sglang_interval(message)
    if "SpecDecoding metrics" not in message:
        return None
    m = _LINE.search(message)
    if m is None:
        return None
    return SpecDecodeInterval(
        float(m["mean"]), int(m["accepted"]), int(m["drafted"]),
        tuple(float(p) for p in m["per_pos"].split(",") if p.strip()),
        float(m["rate"]), int(m["depth"]) if m["depth"] else None)


def _sglang_interval(message: str) -> SpecDecodeInterval | None:
    m = _SGLANG_LINE.search(message)
    if m is None:
        return None
    return SpecDecodeInterval(float(m["mean"]), None, None, (), round(float(m["rate"]) * 100, 4),
                              gen_throughput=float(m["gen_tp"]) if m["gen_tp"] else None)


def parse_totals(metrics_text: str) -> SpecDecodeTotals | None:
    """The spec-decode counters of a Prometheus exposition, or None when it has none."""
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for m in _COUNTER.finditer(metrics_text):
        value = float(m["value"])
        if m["name"] == "num_accepted_tokens_per_pos":
            pos = _POSITION.search(m["labels"] or "")
            if pos is not None:
                per_pos[int(pos.group(1))] = per_pos.get(int(pos.group(1)), 0.0) + value
        else:
            sums[m["name"]] = sums.get(m["name"], 0.0) + value
    if "num_drafts" not in sums:
        return None
    return SpecDecodeTotals(int(sums["num_drafts"]), int(sums.get("num_draft_tokens", 0)),
                            int(sums.get("num_accepted_tokens", 0)),
                            tuple(int(per_pos[p]) for p in sorted(per_pos)))
