"""Speculative-config consistency at preflight: errors vLLM would report only after loading."""

from __future__ import annotations

import pytest

from tui.core.profile import loads_profile
from tui.core.specconfig import speculative_checks

BASE = """
[host]
target = "local"
[server]
engine = "vllm"
model = "/models/target"
[server.speculative]
{spec}
[preflight]
spec_consistent = {on}
"""


@pytest.mark.parametrize(("spec", "ok", "severity", "fragment"), [
    ('method = "eagle3"\nmodel = "/models/d"\nnum_speculative_tokens = 5', True, "error",
     "eagle3, 5 tokens, drafter /models/d"),
    ('method = "eagle3"\nmodel = "/models/d"', False, "error", "needs server.speculative."
     "num_speculative_tokens"),
    ('method = "ngram"\nnum_speculative_tokens = 3', True, "error", "ngram, 3 tokens"),
    ('method = "eagle"\nmodel = "/models/target"\nnum_speculative_tokens = 2', False,
     "warning", "the drafter is the target model itself"),
    ('method = "ngram"\nmodel = "/models/d"\nnum_speculative_tokens = 3', False, "warning",
     "model is ignored"),
])
def test_checks(spec: str, ok: bool, severity: str, fragment: str) -> None:
    checks = speculative_checks(loads_profile(BASE.format(spec=spec, on="true"), "p.toml"))
    assert len(checks) == 1
    assert (checks[0].ok, checks[0].severity) == (ok, severity)
    assert fragment in checks[0].message


def test_switched_off() -> None:
    profile = loads_profile(BASE.format(spec='method = "eagle3"\nmodel = "/m/d"', on="false"),
                            "p.toml")
    assert speculative_checks(profile) == ()


@pytest.mark.parametrize(("spec", "fragment"), [
    ('method = "eagle3"\nmodel = "/models/d"', "eagle3, drafter /models/d"),
    ('method = "eagle"\nmodel = "/models/d"\nnum_steps = 3\neagle_topk = 1\n'
     "num_draft_tokens = 4", "eagle, 3 steps, top-k 1, 4 draft tokens, drafter /models/d"),
])
def test_sglang_chooses_its_steps_itself(spec: str, fragment: str) -> None:
    text = BASE.format(spec=spec, on="true").replace('"vllm"', '"sglang"')
    (check,) = speculative_checks(loads_profile(text, "p.toml"))
    assert check.ok and check.message == fragment
