"""vLLM's speculative-decoding text, both wordings of the log line and the /metrics counters."""

from __future__ import annotations

import pytest

from tui.core.acceptance import SpecDecodeInterval, SpecDecodeTotals, parse_interval, parse_totals
from tui.sim import lines

V016 = ("SpecDecoding metrics: Mean acceptance length: 2.71, Accepted throughput: 38.20 tokens/s, "
        "Drafted throughput: 96.10 tokens/s, Accepted: 382 tokens, Drafted: 961 tokens, "
        "Per-position acceptance rate: 0.780, 0.590, 0.340, Avg Draft acceptance rate: 39.8%")
NEWER = V016.replace("Mean acceptance length: 2.71, ",
                     "Mean acceptance length: 2.71, Current speculative depth: 3, ")


@pytest.mark.parametrize(("message", "depth"), [(V016, None), (NEWER, 3)])
def test_both_wordings_of_the_log_line(message: str, depth: int | None) -> None:
    assert parse_interval(message) == SpecDecodeInterval(2.71, 382, 961, (0.78, 0.59, 0.34),
                                                         39.8, depth)


def test_other_lines_are_not_spec_decoding() -> None:
    assert parse_interval("Engine 000: Avg prompt throughput: 1.0 tokens/s") is None
    assert parse_interval("SpecDecoding metrics: something else entirely") is None


def test_the_simulated_engine_writes_both_wordings() -> None:
    old = parse_interval(lines.spec_line(100, [80, 60, 40], 10.0))
    new = parse_interval(lines.spec_line(100, [80, 60, 40], 10.0, depth=3))
    assert old is not None and new is not None
    assert (old.depth, new.depth) == (None, 3)
    assert old.per_position == new.per_position == (0.8, 0.6, 0.4)


def test_metrics_counters_sum_over_engines_and_positions() -> None:
    text = "\n".join([
        '# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 45.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1",engine="0"} 7.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 13.0',
    ])
    assert parse_totals(text) == SpecDecodeTotals(15, 45, 20, (13, 7))
    assert parse_totals("vllm:num_requests_running 1.0") is None
