"""`[server.speculative]`: speculative decoding, each engine's methods and keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tui.core.profile.checks import _bounded, _describe, _int, _Invalid, _one_of, _str

SPECULATIVE_METHODS = ("eagle3", "eagle", "ngram", "medusa", "mtp", "draft_model", "suffix")
DRAFTER_METHODS = ("eagle3", "eagle", "medusa", "draft_model")
SGLANG_METHODS = ("eagle3", "eagle")  # --speculative-algorithm EAGLE3 / EAGLE
# SGLang's own speculative knobs: --speculative-num-steps, -eagle-topk, -num-draft-tokens
SGLANG_SPECULATIVE_KEYS = ("num_steps", "eagle_topk", "num_draft_tokens")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    model: str | None = None
    num_speculative_tokens: int | None = None  # vLLM
    num_steps: int | None = None  # SGLang (SGLANG_SPECULATIVE_KEYS)
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # further keys, passed through verbatim



def _check_engine_speculative(engine: str, spec: SpeculativeConfig) -> None:
    """Each engine's speculative keys: vLLM's methods and token count are not SGLang's, and
    SGLang's steps, top-k and draft tokens are not vLLM's; SGLang's pass-through keys become
    `--speculative-<key>` flags, so they must be plain values."""
    if engine == "sglang":
        if spec.method not in SGLANG_METHODS:
            raise _Invalid(f"method {spec.method!r} is vLLM's; with engine = \"sglang\" use one "
                           f"of: {', '.join(SGLANG_METHODS)}", ".speculative.method")
        if spec.num_speculative_tokens is not None:
            raise _Invalid("num_speculative_tokens is vLLM's; with engine = \"sglang\" use "
                           f"{', '.join(SGLANG_SPECULATIVE_KEYS)}",
                           ".speculative.num_speculative_tokens")
        for key, value in spec.extra.items():
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise _Invalid(f"expected a string or a number (passed as --speculative-"
                               f"{key.replace('_', '-')}), got {_describe(value)}",
                               f".speculative.{key}")
        return
    for key in SGLANG_SPECULATIVE_KEYS:
        if getattr(spec, key) is not None:
            raise _Invalid(f"{key} is SGLang's (--speculative-{key.replace('_', '-')}); with "
                           f"engine = \"{engine}\" use num_speculative_tokens",
                           f".speculative.{key}")


def _check_speculative(values: dict[str, Any]) -> None:
    if values["method"] in DRAFTER_METHODS and values.get("model") is None:
        raise _Invalid(f"method {values['method']!r} needs the drafter's `model` "
                       "(a path or Hugging Face id)", ".model")


_SPECULATIVE = {
    "method": _one_of(SPECULATIVE_METHODS), "model": _str,
    "num_speculative_tokens": _bounded(_int, 1),
} | {key: _bounded(_int, 1) for key in SGLANG_SPECULATIVE_KEYS}
