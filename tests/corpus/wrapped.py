"""Wrapper invariance: every corpus log, wrapped line by line as a real relay wraps it, must get
the verdict the bare log gets (the outcome, and the same line, or none, as the root cause).

    python tests/corpus/wrapped.py [--ids N] [--seed S] [--show] [--check]

The wrappers are real shapes, none of them chosen by what the reader knows: journald with and
without its host field, docker compose, `kubectl logs --timestamps`, a cloud log viewer's CSV
export, a Python logging format of a user's own, a log viewer's `|` margin. Each line gets its
own timestamp (increasing, seeded), so no wrapper is the same text on every line. The share of
(log, wrapper) pairs whose verdict holds is a figure; `FLOOR` (wrapped_floor.txt) is the share
the build keeps: with `--check` (run by `python3 -m tui.bootstrap score`, so by `.ci/run`) the
exit is 1 below it; without, 0 whatever the share.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from tui.core.explain import Explanation, explain  # noqa: E402

LOGS = sorted((HERE / "logs").glob("*.log"))
FLOOR_FILE = HERE / "wrapped_floor.txt"
_START = datetime(2025, 3, 18, 11, 23, 46, 123456, tzinfo=timezone.utc)
_LEVELS = ("INFO", "INFO", "INFO", "WARNING", "ERROR")


def _journald(t: datetime, _rng: random.Random) -> str:
    return f"{t:%b} {t.day:2d} {t:%H:%M:%S} gpu-node-3 vllm-serve[931930]: "


def _journald_no_host(t: datetime, _rng: random.Random) -> str:
    return f"{t:%b} {t.day:2d} {t:%H:%M:%S} vllm-serve[931930]: "


def _compose(_t: datetime, _rng: random.Random) -> str:
    return "vllm-1  | "


def _kubectl(t: datetime, _rng: random.Random) -> str:
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond:06d}{_rng.randrange(1000):03d}Z "


def _user_logging(t: datetime, rng: random.Random) -> str:
    return (f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}] [{rng.choice(_LEVELS)}] "
            "[MainThread] [vllm.serve] >>> ")


def _viewer_margin(t: datetime, _rng: random.Random) -> str:
    return f"  | {t:%Y-%m-%dT%H:%M:%S}Z | "


def _csv(line: str, t: datetime) -> str:
    """A cloud log viewer's CSV export: the timestamp, then the line quoted (quotes doubled)."""
    stamp = f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"
    return f'"{stamp}","' + line.replace('"', '""') + '"'


Prefix = Callable[[datetime, random.Random], str]
PREFIXES: dict[str, Prefix] = {
    "journald": _journald, "journald-no-host": _journald_no_host, "compose": _compose,
    "kubectl": _kubectl, "user-logging": _user_logging, "viewer-margin": _viewer_margin,
}
WRAPPERS = (*PREFIXES, "csv")


def bare_lines(log: Path) -> list[str]:
    """The log's lines as explain reads a file (split at `\\n` only; no empty last line)."""
    text = log.read_bytes().decode("utf-8", "replace")
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


def wrap(lines: list[str], wrapper: str, seed: int) -> list[str]:
    """`lines` as `wrapper` relays them: one wrapped line per line, stamps increasing."""
    rng = random.Random(seed)
    t = _START + timedelta(days=rng.randrange(300), seconds=rng.randrange(86400))
    out = []
    for line in lines:
        t += timedelta(microseconds=rng.randrange(2_500_000))
        if wrapper == "csv":
            out.append(_csv(line, t))
        else:
            out.append(PREFIXES[wrapper](t, rng) + line)
    return out


def _offsets(lines: list[str]) -> dict[int, int]:
    """Line index by the byte offset explain gives a line."""
    out, offset = {}, 0
    for i, line in enumerate(lines):
        out[offset] = i
        offset += len(line.encode("utf-8", "replace")) + 1
    return out


def verdict(lines: list[str], engine: str) -> tuple[str, int | None, bool]:
    """(outcome, the root cause's line index or None, whether the cause is missing)."""
    ex: Explanation = explain(lines, engine)
    cause = ex.root_cause
    if cause is None:
        return ex.outcome, None, False
    return ex.outcome, _offsets(lines).get(cause.offset, -1), cause.missing


@dataclass(frozen=True)
class Result:
    log_id: str
    wrapper: str
    bare: tuple[str, int | None, bool]
    wrapped: tuple[str, int | None, bool]

    @property
    def holds(self) -> bool:
        return self.bare == self.wrapped


def results(logs: list[Path], wrappers: tuple[str, ...] = WRAPPERS,
            seed: int = 0) -> Iterator[Result]:
    for log in logs:
        engine = json.loads(log.with_suffix(".json").read_text())["engine"]
        lines = bare_lines(log)
        bare = verdict(lines, engine)
        for k, wrapper in enumerate(wrappers):
            wrapped = verdict(wrap(lines, wrapper, seed * 7919 + k), engine)
            yield Result(log.stem, wrapper, bare, wrapped)


def floor() -> float:
    """The share the build keeps (wrapped_floor.txt: a percentage, comments after '#')."""
    text = FLOOR_FILE.read_text().split("#", 1)[0]
    return float(text.strip())


def shares(found: list[Result]) -> dict[str, tuple[int, int]]:
    """(holds, pairs) per wrapper, and "all"."""
    out: dict[str, tuple[int, int]] = {}
    for name in (*WRAPPERS, "all"):
        mine = [r for r in found if name in ("all", r.wrapper)]
        if mine:
            out[name] = (sum(r.holds for r in mine), len(mine))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", type=int, help="only N logs, drawn with --seed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", action="store_true", help="list every pair whose verdict moved")
    ap.add_argument("--check", action="store_true", help="exit 1 when the share is below the "
                    "floor (wrapped_floor.txt)")
    args = ap.parse_args(argv)
    logs = LOGS if args.ids is None else sorted(random.Random(args.seed).sample(LOGS, args.ids))
    start = time.monotonic()
    found = list(results(logs, seed=args.seed))
    took = time.monotonic() - start
    print("== wrapper invariance: the bare verdict kept under each wrapper")
    found_shares = shares(found)
    for name, (hits, n) in found_shares.items():
        print(f"  {name:<17} {100 * hits / n:5.1f} % ({hits}/{n})")
    print(f"  floor             {floor():5.1f} %   ({len(logs)} logs, {took:.0f} s)")
    hits, n = found_shares["all"]
    below = 100 * hits / n < floor()
    if args.show or (args.check and below):
        for r in found:
            if not r.holds:
                print(f"  MOVED {r.log_id} [{r.wrapper}] bare {r.bare} wrapped {r.wrapped}")
    if args.check and below:
        print(f"wrapper invariance {100 * hits / n:.1f} % is below the floor {floor():.1f} %",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
