"""Assign every corpus log to a part and record it in split.json: `sealed` for the ids listed in
sealed.txt (batches no rule or feature may be designed from), else `tune` (two thirds) or
`heldout` (one third), once, by a fixed seed. A log already in split.json keeps its part; a new
log's part comes from a hash of the seed and its id, so adding logs never moves the old ones."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
SEED = "specconsole-corpus-2026-12-04"
HELDOUT_SHARE = 1 / 3
PARTS = ("tune", "heldout", "sealed")


def part_of(log_id: str) -> str:
    digest = hashlib.sha256(f"{SEED}:{log_id}".encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") / 2**64 < HELDOUT_SHARE else "tune"


def sealed_batches(path: Path = HERE / "sealed.txt") -> dict[int, list[str]]:
    """The ids sealed.txt lists, one a line, by batch: a comment line `# Sealed batch N ...` starts
    batch N; other text after '#' is a comment. Ids before any header count as batch 0."""
    batches: dict[int, list[str]] = {}
    if not path.exists():
        return batches
    batch = 0
    for line in path.read_text().splitlines():
        body, _, comment = line.partition("#")
        header = re.match(r"\s*sealed batch (\d+)", comment, re.IGNORECASE)
        if header and not body.strip():
            batch = int(header.group(1))
            batches.setdefault(batch, [])
        elif body.strip():
            batches.setdefault(batch, []).append(body.strip())
    return batches


def sealed_ids(path: Path = HERE / "sealed.txt") -> set[str]:
    """The ids sealed.txt lists, whatever their batch."""
    return {i for ids in sealed_batches(path).values() for i in ids}


def main() -> int:
    path = HERE / "split.json"
    split: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    sealed = sealed_ids()
    moved = sorted(i for i in sealed if split.get(i, "sealed") != "sealed")
    if moved:
        print(f"sealed.txt lists ids that already have another part: {' '.join(moved)}",
              file=sys.stderr)
        return 1
    for sidecar in sorted((HERE / "logs").glob("*.json")):
        log_id = sidecar.stem
        split.setdefault(log_id, "sealed" if log_id in sealed else part_of(log_id))
    path.write_text(json.dumps(dict(sorted(split.items())), indent=1) + "\n")
    counts = {p: sum(1 for v in split.values() if v == p) for p in PARTS}
    print(f"{len(split)} logs: {counts['tune']} tune, {counts['heldout']} held out, "
          f"{counts['sealed']} sealed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
