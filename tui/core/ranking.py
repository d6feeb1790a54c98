"""Which of a log's candidate causes is the root cause: a linear score over features of each
candidate, its weights learned from the real-log corpus (tests/corpus/train.py, scikit-learn,
dev-only) and kept as text beside this module (ranking.txt). Inference is plain Python: a dot
product per candidate, deterministic and cheap enough to run on every question the live
console asks.

One rule stays above the score: a candidate that reports a failure elsewhere (a subprocess's
CalledProcessError, a dead Ray actor, a wrapper's or a library's words, an EOFError or a broken
pipe to a peer that died), or whose shape (numbers masked) a launch of the same profile also
logged and survived to READY (`survived`: the launch history's), is chosen only when no other
is known; so is what this launch itself logged before its own READY (`before_ready`: a
plugin that failed to import, an optional kernel that failed), when it went on to READY and
died later: a death after READY is explained from what happened after READY, from the first
launch on. The story's case lives
there: the model inspection's CalledProcessError comes first, the patched file's SyntaxError
last, and the corpus's few ranked pairs cannot outweigh that by themselves. The score orders
the candidates within each tier; across the two tiers it learned "the earliest, unless a
generic wrapper", nearly the hand rule it replaced (the README's Diagnosis section has the
cross-validated figures of both).

The features describe a candidate by its class, never by one log's words: what kind of line
it is (a traceback's exception, an ERROR record, a library's stderr, a generic exception type, a
message over several lines), whether it reports a failure elsewhere, where it stands among the
others. Tried and dropped, their learned weight 0 on the corpus (no ranked pair tells them
apart): a WARNING record, a known failure class's words, the same text recurring, a message
raised again later or wrapping an earlier one, a line before the server was ready.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

WEIGHTS_PATH = Path(__file__).with_name("ranking.txt")

# Exceptions a process gets when its peer died (the pipe or socket to it broke): consequences.
_PEER_GONE_RE = re.compile(
    r"\b(?:EOFError|BrokenPipeError|ConnectionResetError|ConnectionAbortedError"
    r"|ConnectionRefusedError|IncompleteRead|RemoteDisconnected)\b"
    r"|Connection (?:reset|closed) by peer|\[Errno 32\]|\[Errno 104\]")
# An exception type that says nothing of its own: the message must carry the reason.
_GENERIC_RE = re.compile(r"(?:[\w.]+\.)?(?:RuntimeError|Exception|AssertionError)\b:?")
_NUMBER_RE = re.compile(r"0x[0-9a-fA-F]+|\d+")
SHAPE_CHARS = 240  # a shape's length: enough to tell two errors apart, bounded in the history

FEATURES = (
    "first",           # the earliest candidate
    "last",            # the latest candidate
    "order",           # 0 for the first .. 1 for the last
    "traceback_end",   # the exception line that ends a traceback
    "error_record",    # an ERROR/CRITICAL record that states a failure, no traceback
    "bare_line",       # a line without a log level: an exception or a library's stderr
    "weak",            # a wrapper's words, a library's stderr, a record heading a traceback
    "elsewhere",       # reports a failure in another process (CalledProcessError, Ray actor)
    "generic",         # RuntimeError/Exception/AssertionError: the type says nothing
    "multiline",       # its message spans lines (pydantic's header and reason)
)


@dataclass(frozen=True, slots=True)
class Facts:
    """What the tracker knows of one candidate, in its terms."""

    text: str
    level: str | None
    traceback_end: bool
    weak: bool
    elsewhere: bool
    multiline: bool
    survived: bool = False  # a launch of this profile that reached READY logged it too
    before_ready: bool = False  # this launch logged it before its own READY, and went on


def features(cands: Sequence[Facts]) -> list[dict[str, float]]:
    """The feature vector of each candidate, in the order given (the log's)."""
    n = len(cands)
    return [{
        "first": float(i == 0),
        "last": float(i == n - 1),
        "order": i / (n - 1) if n > 1 else 0.0,
        "traceback_end": float(c.traceback_end),
        "error_record": float(not c.traceback_end and c.level in ("ERROR", "CRITICAL")),
        "bare_line": float(not c.traceback_end and c.level is None),
        "weak": float(c.weak),
        "elsewhere": float(c.elsewhere),
        "generic": float(_GENERIC_RE.match(c.text) is not None),
        "multiline": float(c.multiline),
    } for i, c in enumerate(cands)]


@dataclass(frozen=True, slots=True)
class Ranker:
    """A weight per feature; a candidate's score is their dot product with its features."""

    weights: Mapping[str, float]

    def score(self, feats: Mapping[str, float]) -> float:
        w = self.weights
        return sum(w.get(name, 0.0) * value for name, value in feats.items() if value)

    def order(self, cands: Sequence[Facts]) -> list[tuple[float, int, dict[str, float]]]:
        """(score, index, features) best first: the first tier before the second (see the
        module's docstring), by score within each; ties go to the earlier candidate."""
        scored = [(self.score(f), i, f) for i, f in enumerate(features(cands))]
        return sorted(scored, key=lambda s: (tier(cands[s[1]]), -s[0], s[1]))


def tier(c: Facts) -> int:
    """0: a cause in its own right; 1: a report of a failure elsewhere or a pipe to a peer that
    broke (the peer's death is the cause); 2 and 3: the same two kinds among what a good
    launch survived (this one before its own READY, or an earlier one of the profile). A tier
    is chosen only when none before it has a candidate."""
    survived = c.survived or c.before_ready
    return 2 * survived + int(c.weak or c.elsewhere
                              or _PEER_GONE_RE.search(c.text[:512]) is not None)


def shape(text: str) -> str:
    """A line with its numbers masked (pids, times, addresses, sizes): what a later launch's
    line is compared by."""
    return _NUMBER_RE.sub("#", " ".join(text.split()))[:SHAPE_CHARS]


def parse_weights(text: str, source: str = "ranking.txt") -> dict[str, float]:
    """`name weight` a line; `#` comments. An unknown name or a bad number raises ValueError
    naming the line: a weights file that does not match FEATURES is a build error."""
    weights: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, value = line.partition(" ")
        if name not in FEATURES:
            raise ValueError(f"{source}:{number}: unknown feature {name!r}")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ValueError(f"{source}:{number}: {name}: not a number: {value.strip()!r}") \
                from None
    return weights


@cache
def shipped() -> Ranker:
    """The ranker trained on the corpus, as shipped beside this module."""
    return Ranker(parse_weights(WEIGHTS_PATH.read_text(encoding="utf-8")))


# Words for a candidate's strongest reasons (`explain` shows why each was considered).
REASONS = {
    "first": "the earliest error", "last": "the last error", "order": "its place in the log",
    "traceback_end": "ends a traceback", "error_record": "an ERROR record that states a failure",
    "bare_line": "a line the process wrote itself", "weak": "a wrapper's or a library's words",
    "elsewhere": "reports a failure elsewhere", "generic": "a generic exception type",
    "multiline": "a message over several lines",
}
SURVIVED_WORDS = "also logged by a launch of this profile that reached READY"
BEFORE_READY_WORDS = "logged before this launch's READY, which it survived"


def reasons(ranker: Ranker, feats: Mapping[str, float], count: int = 2) -> list[str]:
    """Up to `count` words for why a candidate was considered: the features that raised its
    score most, else (none did) what kind of line it is."""
    present = [n for n, v in feats.items() if v and n != "order"]
    raised = sorted((n for n in present if ranker.weights.get(n, 0.0) > 0),
                    key=lambda n: -ranker.weights[n] * feats[n])
    kinds = [n for n in ("traceback_end", "error_record", "bare_line", "elsewhere", "weak")
             if n in present and n not in raised]
    return [REASONS[n] for n in (raised + kinds)[:count]]
