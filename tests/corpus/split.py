"""Assign every corpus log to `tune` (two thirds) or `heldout` (one third), once, by a fixed
seed, and record it in split.json. A log already in split.json keeps its part; a new log's part
comes from a hash of the seed and its id, so adding logs never moves the old ones."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

HERE = Path(__file__).parent
SEED = "specconsole-corpus-2026-12-04"
HELDOUT_SHARE = 1 / 3


def part_of(log_id: str) -> str:
    digest = hashlib.sha256(f"{SEED}:{log_id}".encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") / 2**64 < HELDOUT_SHARE else "tune"


def main() -> None:
    path = HERE / "split.json"
    split: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    for sidecar in sorted((HERE / "logs").glob("*.json")):
        split.setdefault(sidecar.stem, part_of(sidecar.stem))
    path.write_text(json.dumps(dict(sorted(split.items())), indent=1) + "\n")
    counts = {p: sum(1 for v in split.values() if v == p) for p in ("tune", "heldout")}
    print(f"{len(split)} logs: {counts['tune']} tune, {counts['heldout']} held out")


if __name__ == "__main__":
    main()
