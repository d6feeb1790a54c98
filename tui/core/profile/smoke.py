"""`[smoke]`: one request after READY."""

from __future__ import annotations

from dataclasses import dataclass

from tui.core.profile.checks import Table, _bool, _bounded, _duration, _int, _one_of, _section, _str


@dataclass(frozen=True, slots=True)
class SmokeConfig:
    """One request after READY, to tell "up" from "serving"."""

    enabled: bool = False
    kind: str = "completion"  # or "chat"
    prompt: str = "Say hello in one short sentence."
    max_tokens: int = 16
    timeout: float = 60.0



_SMOKE = {"enabled": _bool, "kind": _one_of(("completion", "chat")), "prompt": _str,
          "max_tokens": _bounded(_int, 1, 4096), "timeout": _duration}

SMOKE_TABLE = Table("smoke", _section(SmokeConfig, _SMOKE))
