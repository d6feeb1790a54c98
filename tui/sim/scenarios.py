"""What both simulated engines share: the scenario table and their argparse helpers.

The vLLM API server (`api_server.py`) and SGLang's launcher (`sglang/launcher.py`) import this
module and never each other; `engine.py` picks one of them. Stdlib only (simulated processes
import it). The profile schema validates `[simulate] scenario` against the same names.
"""

from __future__ import annotations

import argparse
from typing import Any

SCENARIOS = ("ready", "syntax-error", "oom", "hang", "engine-killed")


def positive(kind: type) -> Any:
    """An argparse type: a `kind` above 0."""
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0: {text}")
        return value
    return parse
