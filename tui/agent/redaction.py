"""Secrets: hidden wherever the agent writes them down, recognised in the log by their hashes.

launch.json keeps only a salted hash of each secret; a console attached from a shell that lacks
the secret learns its value from the lines (SecretFinder) and still hides it on screen.
"""

from __future__ import annotations

import hashlib
import os

REDACTED = "«redacted»"


def redact(text: str, secrets: list[str]) -> str:
    """Replace each secret value of 4+ characters, longest first (as tui/core/command.py does:
    shorter ones would blank out ordinary text)."""
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def _digest(salt: str, value: str) -> str:
    return hashlib.sha256((salt + value).encode("utf-8", "replace")).hexdigest()


def secret_hashes(secrets: list[str]) -> list[dict]:
    """What launch.json keeps of each secret instead of its value: length, first two
    characters, salted SHA-256; enough for SecretFinder to recognise it in the log."""
    out = []
    for secret in sorted({s for s in secrets if len(s) >= 4}):
        salt = os.urandom(16).hex()
        out.append({"n": len(secret), "head": secret[:2], "salt": salt,
                    "sha256": _digest(salt, secret)})
    return out


class SecretFinder:
    """Recognises the launch's secrets in log lines by their hashes, so that an agent whose
    console lacks them (another shell, the top process already gone) still learns the values
    and reports them before the lines that hold them; the console then redacts those lines."""

    def __init__(self, hashes: object, known: list[str]) -> None:
        self.known = known  # shared with the watcher: found values are hidden in procs rows too
        wanted = [h for h in hashes if isinstance(h, dict)
                  and isinstance(h.get("n"), int) and h["n"] >= 4
                  and all(isinstance(h.get(k), str) for k in ("head", "salt", "sha256"))
                  ] if isinstance(hashes, list) else []
        self.pending = [h for h in wanted
                        if not any(_digest(h["salt"], k) == h["sha256"] for k in known)]

    def scan(self, lines: list[str]) -> list[str]:
        """The secrets first seen in `lines` (each reported once); [] at once when none is
        left to find, the usual case."""
        found: list[str] = []
        for line in lines if self.pending else ():
            for h in list(self.pending):
                at = line.find(h["head"])
                while at >= 0:
                    candidate = line[at:at + h["n"]]
                    if len(candidate) == h["n"] and _digest(h["salt"], candidate) == h["sha256"]:
                        found.append(candidate)
                        self.pending.remove(h)
                        break
                    at = line.find(h["head"], at + 1)
        self.known.extend(found)
        return found
