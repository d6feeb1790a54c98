"""Preflight's checks of [server.speculative], decided from the profile alone.

The loader already refuses a drafter method without a drafter; these are the mistakes vLLM
would only report minutes into a launch, after the weights were loaded.
"""

from __future__ import annotations

from tui.core.profile import DRAFTER_METHODS, Profile
from tui.core.protocol import Check

CHECK = "speculative config"


def speculative_checks(profile: Profile) -> tuple[Check, ...]:
    spec = profile.server.speculative
    if spec is None or not profile.preflight.spec_consistent:
        return ()
    problems: list[Check] = []
    if (profile.server.engine == "vllm" and spec.method in (*DRAFTER_METHODS, "ngram")
            and spec.num_speculative_tokens is None):  # SGLang chooses its steps itself
        problems.append(Check(CHECK, False, "error",
                              f"method {spec.method} needs server.speculative."
                              "num_speculative_tokens"))
    if spec.model is not None and spec.model == profile.server.model:
        problems.append(Check(CHECK, False, "warning",
                              f"the drafter is the target model itself ({spec.model})"))
    if spec.method == "ngram" and spec.model is not None:
        problems.append(Check(CHECK, False, "warning",
                              "ngram drafts from the prompt; server.speculative.model is ignored"))
    return tuple(problems) or (Check(CHECK, True, "error", _summary(profile)),)


def _summary(profile: Profile) -> str:
    spec = profile.server.speculative
    assert spec is not None
    sizes = ((spec.num_speculative_tokens, "{} tokens"), (spec.num_steps, "{} steps"),
             (spec.eagle_topk, "top-k {}"), (spec.num_draft_tokens, "{} draft tokens"))
    tokens = "".join(", " + what.format(n) for n, what in sizes if n)
    drafter = f", drafter {spec.model}" if spec.model else ""
    return f"{spec.method}{tokens}{drafter}"
