"""Check the corpus's files against its format (README.md): every log has a sidecar with the
keys and values the score expects, and every root-cause line occurs verbatim in its log."""

from __future__ import annotations

import json
import sys
from pathlib import Path

LOGS = Path(__file__).parent / "logs"
OUTCOMES = {"ready", "crashed", "hung", "stopped", "unknown"}
PHASES = {None, "launch", "config", "weights", "drafter", "compile", "kv_cache", "cuda_graphs",
          "api_server", "ready_log", "serving"}
CLASSES = {"oom", "kv_cache", "config", "model_code", "weights", "quant", "nccl", "ray", "port",
           "cuda_env", "tokenizer", "spec_decode", "serving_death", "hang", "disk", "platform",
           "ready", "other"}
KEYS = {"id", "engine", "source", "version", "class", "outcome", "outcome_note", "last_phase",
        "root_cause", "root_cause_note", "truncated", "services"}


def problems(sidecar: Path) -> list[str]:
    """What is wrong with one sidecar and its log, in words."""
    out: list[str] = []
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
    except ValueError as e:
        return [f"not JSON: {e}"]
    log = sidecar.with_suffix(".log")
    if not log.exists():
        return ["no .log beside it"]
    # lines as the agent reads them (split on newlines); a CR before the newline is no part
    lines = [ln.removesuffix("\r") for ln in log.read_bytes().decode("utf-8", "replace")
             .split("\n")]
    if set(meta) != KEYS:
        out.append(f"keys: missing {sorted(KEYS - set(meta))}, extra {sorted(set(meta) - KEYS)}")
    if meta.get("id") != sidecar.stem:
        out.append("id is not the file name")
    if meta.get("engine") not in ("vllm", "sglang"):
        out.append("engine")
    if not str(meta.get("source", "")).startswith("https://"):
        out.append("source is not a URL")
    if meta.get("outcome") not in OUTCOMES:
        out.append("outcome")
    if meta.get("outcome") == "unknown" and not meta.get("outcome_note"):
        out.append("unknown outcome without outcome_note")
    if meta.get("last_phase") not in PHASES:
        out.append("last_phase")
    if meta.get("class") not in CLASSES:
        out.append("class")
    cause = meta.get("root_cause")
    if cause is not None and cause not in lines:
        out.append("root_cause is not a whole line of the log")
    if cause is None and meta.get("outcome") in ("crashed", "hung") and not meta.get(
            "root_cause_note"):
        out.append("no root_cause and no root_cause_note")
    if not isinstance(meta.get("truncated"), bool):
        out.append("truncated is not a bool")
    for name, verdict in (meta.get("services") or {}).items():
        if verdict.get("outcome") not in OUTCOMES:
            out.append(f"services.{name}.outcome")
        c = verdict.get("root_cause")
        if c is not None and c not in lines:
            out.append(f"services.{name}.root_cause is not a whole line of the log")
    return out


def main() -> int:
    bad = 0
    sidecars = sorted(LOGS.glob("*.json"))
    for sidecar in sidecars:
        for p in problems(sidecar):
            bad += 1
            print(f"{sidecar.name}: {p}")
    for log in sorted(LOGS.glob("*.log")):
        if not log.with_suffix(".json").exists():
            bad += 1
            print(f"{log.name}: no sidecar")
    print(f"{len(sidecars)} sidecars, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
