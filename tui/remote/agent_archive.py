"""The agent as one archive: tui/agent/ zipped as the package `specconsole_agent`, with a
`__main__.py`, built in memory from the installed package.

Deterministic (sorted names, a fixed timestamp), so its SHA-256 names it: the host keeps it in
~/.specconsole/agent/<hash>.pyz and the console need not send it again while that file is there.
A zip with `__main__.py` at its root is what the standard library's `zipapp` makes; zipfile is
used directly only to pin the timestamps that zipapp would take from the files.
"""

from __future__ import annotations

import functools
import hashlib
import io
import zipfile
from dataclasses import dataclass
from importlib import resources

PACKAGE = "specconsole_agent"
_EPOCH = (1980, 1, 1, 0, 0, 0)
_MAIN = (f"import sys\nfrom {PACKAGE}.main import main\n\nsys.exit(main())\n").encode()


@dataclass(frozen=True, slots=True)
class AgentArchive:
    data: bytes
    digest: str  # hex SHA-256 of data: the archive's name on the host


@functools.cache
def agent_archive() -> AgentArchive:
    """tui/agent/*.py (its own __main__ aside) under `specconsole_agent/`, plus the entry."""
    buf = io.BytesIO()
    sources = sorted((f for f in resources.files("tui.agent").iterdir()
                      if f.name.endswith(".py") and f.name != "__main__.py"),
                     key=lambda f: f.name)
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(zipfile.ZipInfo("__main__.py", _EPOCH), _MAIN)
        for source in sources:
            zf.writestr(zipfile.ZipInfo(f"{PACKAGE}/{source.name}", _EPOCH), source.read_bytes(),
                        zipfile.ZIP_DEFLATED)
    data = buf.getvalue()
    return AgentArchive(data, hashlib.sha256(data).hexdigest())
