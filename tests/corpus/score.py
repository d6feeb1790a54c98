"""Score `specconsole explain` on the real-log corpus: root cause, outcome, symptoms taken as
cause, per failure class, for the tuning part, the held-out part and the sealed batches
(split.json; sealed.txt lists the sealed ids).

    python tests/corpus/score.py [--part tune|heldout|sealed|all] [--batch N] [--show] [--json]

Exit 0 whatever the scores (a score is a measurement, not a gate); exit 1 only when a log makes
explain raise (2 when `--batch N` names no batch). `--show` lists every miss with what was
expected and what explain said.
`--batch N` scores only sealed batch N (sealed.txt's `# Sealed batch N` header), so each sealed
batch keeps its own first score.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))
PARTS = ("tune", "heldout", "sealed")  # split.py's parts, in the order they are reported
PART_NAMES = {"tune": "tuning part", "heldout": "held-out part", "sealed": "sealed part"}

from split import sealed_batches  # noqa: E402  (tests/corpus/split.py)

from tui.core.explain import Explanation, explain_file  # noqa: E402

# Lines that only report a failure elsewhere (vllm-reference.md section 2, SGLang's launcher):
# the score's own list, kept apart from the rules it judges.
SYMPTOM = re.compile(
    r"Engine core initialization failed|EngineCore failed to start|WorkerProc failed to start"
    r"|WorkerProc initialization failed|[Pp]roc(?: rank=)?\s?\S* died unexpectedly|EngineDeadError"
    r"|EngineCore encountered|MQLLMEngine is already dead"
    r"|Received sigquit from a child process|See root cause above|See stack trace"
    r"|Engine process failed to start|Parent process exited|exited unexpectedly"
    r"|Rank \d+ scheduler is dead|Initialization failed\. warmup error")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|#033\[[0-9;]*m|\[\d+(?:;\d+)*m")


@dataclass
class Verdict:
    log_id: str
    part: str
    klass: str
    outcome_ok: bool
    cause_ok: bool | None  # None: the log expects no cause (ready / unknown)
    symptom_as_cause: bool
    raised: str | None = None
    said: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, Any] = field(default_factory=dict)


def _norm(text: str) -> str:
    return " ".join(_ANSI.sub("", text).split())


def _line_offsets(data: bytes, wanted: str) -> set[int]:
    """Byte offsets of the lines of `data` equal to `wanted` (as explain counts offsets)."""
    out, offset = set(), 0
    for raw in data.split(b"\n"):
        if raw.decode("utf-8", "replace").rstrip("\r") == wanted:
            out.add(offset)
        offset += len(raw) + 1
    return out


def cause_matches(ex: Explanation, expected: str | None, data: bytes) -> bool:
    """Expected null: no cause line claimed. Else the claimed line is the expected one (same
    offset), or its text is in it (an exception line assembled across a wrapped message)."""
    cause = ex.root_cause
    if expected is None:
        return cause is None or cause.missing
    if cause is None or cause.missing:
        return False
    return line_matches(cause.offset, cause.line, expected, data)


def line_matches(offset: int, line: str, expected: str, data: bytes) -> bool:
    """A claimed cause line (at `offset` of `data`) is the expected one, or holds its text."""
    if offset in _line_offsets(data, expected):
        return True
    said = _norm(line)[:60]
    return len(said) >= 12 and said in _norm(expected)


def judge(log: Path, part: str) -> Verdict:
    meta = json.loads(log.with_suffix(".json").read_text())
    data = log.read_bytes()
    expected = {k: meta[k] for k in ("outcome", "last_phase", "root_cause")}
    try:
        ex = explain_file(log, meta["engine"])
    except Exception:
        return Verdict(meta["id"], part, meta["class"], False, False, False,
                       raised=traceback.format_exc(), expected=expected)
    wants_cause = meta["outcome"] in ("crashed", "hung")
    cause = ex.root_cause
    said = {"outcome": ex.outcome, "last_phase": ex.to_json()["last_phase"],
            "root_cause": None if cause is None else (
                f"(missing; deepest frame {cause.deepest_frame})" if cause.missing
                else cause.line)}
    return Verdict(
        meta["id"], part, meta["class"], ex.outcome == meta["outcome"],
        cause_matches(ex, meta["root_cause"], data) if wants_cause else None,
        cause is not None and not cause.missing and SYMPTOM.search(cause.line) is not None,
        said=said, expected=expected)


def _pct(hits: int, n: int) -> str:
    return f"{100 * hits / n:5.1f} % ({hits}/{n})" if n else "    — (0/0)"


def summary(verdicts: list[Verdict]) -> dict[str, Any]:
    causes = [v for v in verdicts if v.cause_ok is not None]
    return {
        "logs": len(verdicts),
        "root_cause": [sum(bool(v.cause_ok) for v in causes), len(causes)],
        "outcome": [sum(v.outcome_ok for v in verdicts), len(verdicts)],
        "symptoms_as_cause": sum(v.symptom_as_cause for v in verdicts),
        "raised": [v.log_id for v in verdicts if v.raised],
    }


def report(name: str, verdicts: list[Verdict]) -> None:
    s = summary(verdicts)
    print(f"== {name}: {s['logs']} logs")
    print(f"  root cause        {_pct(*s['root_cause'])}")
    print(f"  outcome           {_pct(*s['outcome'])}")
    print(f"  symptoms as cause {s['symptoms_as_cause']}")
    print(f"  explain raised    {len(s['raised'])} {' '.join(s['raised'])}")
    by_class: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        by_class[v.klass].append(v)
    print("  class          logs  cause         outcome")
    for klass, vs in sorted(by_class.items()):
        c = summary(vs)
        cause = f"{c['root_cause'][0]}/{c['root_cause'][1]}" if c["root_cause"][1] else "—"
        print(f"  {klass:<14} {len(vs):>4}  {cause:<12}  {c['outcome'][0]}/{len(vs)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=(*PARTS, "all"), default="all")
    ap.add_argument("--batch", type=int, help="only sealed batch N (implies --part sealed)")
    ap.add_argument("--show", action="store_true", help="list every miss")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    split = json.loads((HERE / "split.json").read_text())
    parts = PARTS if args.part == "all" else (args.part,)
    if args.batch is not None:
        batch = set(sealed_batches().get(args.batch, []))
        if not batch:
            print(f"sealed.txt has no batch {args.batch}", file=sys.stderr)
            return 2
        split = {i: q for i, q in split.items() if i in batch}
        parts = ("sealed",)
    results = {p: [judge(HERE / "logs" / f"{i}.log", p) for i, q in sorted(split.items())
                   if q == p] for p in parts}
    if args.json:
        print(json.dumps({p: summary(v) for p, v in results.items()}, indent=1))
    else:
        for p, verdicts in results.items():
            name = PART_NAMES[p] if args.batch is None else f"sealed batch {args.batch}"
            report(name, verdicts)
            if args.show:
                for v in verdicts:
                    if v.raised or not v.outcome_ok or v.cause_ok is False or v.symptom_as_cause:
                        print(f"  MISS {v.log_id} [{v.klass}] expected {v.expected}\n"
                              f"       said {v.said}" + (f"\n{v.raised}" if v.raised else ""))
    return 1 if any(v.raised for vs in results.values() for v in vs) else 0


if __name__ == "__main__":
    sys.exit(main())
