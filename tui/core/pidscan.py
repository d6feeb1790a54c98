"""The pids of a chunk's process prefixes (` pid=N`) that the log has not shown before.

A busy log names a handful of processes on nearly every line, so a chunk is searched only for
the others: with Hyperscan, by one pattern that matches ` pid=` followed by any digit run that
is not a known pid (the complement of the known ones, spelt as a trie), which is silent on
nearly every chunk; only when it fires is the chunk read with `re`, which says exactly which
(the same answer as `re` alone: any doubt, such as a digit outside ASCII, makes it fire). Past
`KNOWN_MAX` pids, or without Hyperscan, `re` skips the known ones by a lookahead.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

try:
    import hyperscan
except ImportError:  # pragma: no cover - platforms without the wheel
    hyperscan = None

PID_RE = re.compile(r" pid=(\d+)")
KNOWN_MAX = 256
# what may follow a digit run for Hyperscan to judge it (an ASCII non-digit, or the end);
# a byte outside ASCII may be a digit to `re`, so it makes the pattern fire
_END = r"(?:[\x00-\x2f\x3a-\x7f]|$)"
_DIGITS = frozenset("0123456789")


def _not_known(node: dict[str, Any], depth: int) -> str:
    """A pattern for the digit runs that start with this trie node's path and are no word of
    the trie (each run taken whole: it ends where a non-digit follows)."""
    alts = [_END] if depth and "" not in node else []
    others = "".join(sorted(_DIGITS - set(node)))
    if others:
        alts.append(f"[{others}][0-9]*{_END}")
    alts += [c + _not_known(child, depth + 1) for c, child in sorted(node.items()) if c]
    return "(?:" + "|".join(alts) + ")" if alts else "(?!)"


def not_known_pattern(pids: set[str]) -> bytes:
    """` pid=` and a digit run that is none of `pids` (ASCII digits), or anything outside ASCII
    after ` pid=` and digits."""
    trie: dict[str, Any] = {}
    for pid in pids:
        node = trie
        for c in pid:
            node = node.setdefault(c, {})
        node[""] = {}
    return (r" pid=(?:[0-9]*[\x80-\xff]|" + _not_known(trie, 0)[3:]).encode()


class NewPids:
    """The pids seen so far, and the search for the others."""

    def __init__(self, backend: str = "hyperscan") -> None:
        self.pids: set[str] = set()
        self._fast = backend == "hyperscan" and hyperscan is not None
        self._db: Any = None
        self._scratch: Any = None
        self._re = PID_RE

    def find(self, text: str) -> set[str]:
        """The pids `text` names that were not seen before; they are seen from now on."""
        if self._db is not None and not self._fires(text):
            return set()
        new = set(self._re.findall(text)) - self.pids
        if new:
            self.pids |= new
            self._learn()
        return new

    def _fires(self, text: str) -> bool:
        fired: list[bool] = []

        def hit(*_: object) -> bool:
            fired.append(True)
            return True  # one is enough: stop

        with contextlib.suppress(hyperscan.ScanTerminated):
            self._db.scan(text.encode("utf-8", "surrogatepass"), match_event_handler=hit,
                          scratch=self._scratch)
        return bool(fired)

    def _learn(self) -> None:
        if len(self.pids) > KNOWN_MAX:
            self._db, self._re = None, PID_RE
            return
        self._re = re.compile(rf" pid=(?!(?:{'|'.join(sorted(self.pids))})\b)(\d+)")
        if self._fast:
            db = hyperscan.Database()
            db.compile(expressions=[not_known_pattern(self.pids)], ids=[0], elements=1,
                       flags=[hyperscan.HS_FLAG_SINGLEMATCH])
            self._db, self._scratch = db, hyperscan.Scratch(db)
