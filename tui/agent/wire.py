"""The agent's side of the wire: one JSON object per line on stdout, and the spec it reads.

The decoder side is tui/core/protocol.py, which this package cannot import: PROTOCOL must match
its PROTOCOL_VERSION. Human text never goes to stdout.
"""

from __future__ import annotations

import json
import os
import sys
import threading

AGENT_VERSION = "0.1.0"
PROTOCOL = 1
_out_lock = threading.Lock()


class SpecError(Exception):
    """The spec on stdin is unusable (exit 2)."""


class AgentFailure(Exception):
    """A subcommand cannot do its job; reported as an error message (exit 1)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def emit(t: str, **fields: object) -> None:
    """Write one protocol message; a vanished reader ends the agent quietly."""
    msg = {"t": t, "v": PROTOCOL}
    msg.update(fields)
    data = (json.dumps(msg, ensure_ascii=False, separators=(",", ":")) + "\n").encode(
        "utf-8", "replace"
    )
    with _out_lock:
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except (BrokenPipeError, ValueError, OSError):
            os._exit(0)


def spec_value(spec: dict, key: str, kind: type | tuple, default: object = ...):
    """spec[key] checked against kind; null counts as absent."""
    value = spec.get(key)
    if value is None:
        if default is ...:
            raise SpecError(f"spec needs {key!r}")
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise SpecError(f"spec {key!r} must be a number")
    if not isinstance(value, kind):
        raise SpecError(f"spec {key!r} has the wrong type ({type(value).__name__})")
    return value


def spec_strings(spec: dict, key: str) -> list[str]:
    value = spec_value(spec, key, list, [])
    if not all(isinstance(v, str) for v in value):
        raise SpecError(f"spec {key!r} must be a list of strings")
    return value
