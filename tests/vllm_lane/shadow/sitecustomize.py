"""Shadow one module of the installed vLLM with a patched copy, without touching the install.

The lane puts this directory on PYTHONPATH of the server it launches, so every process of the
run (API server, model inspection, EngineCore, Worker) imports this file at start-up. When
SPECCONSOLE_SHADOW_MODULE names a module, its import loads SPECCONSOLE_SHADOW_FILE instead, in
the processes SPECCONSOLE_SHADOW_SCOPE selects: "all", or "engine" (only the processes that
multiprocessing spawned, EngineCore and Worker), so that the engine, not the API server's model
inspection, is the first to import the broken file. Runs in parallel never see each other's
patch, and the installed vLLM stays clean.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

_MODULE = os.environ.get("SPECCONSOLE_SHADOW_MODULE", "")
_FILE = os.environ.get("SPECCONSOLE_SHADOW_FILE", "")
_SCOPE = os.environ.get("SPECCONSOLE_SHADOW_SCOPE", "all")


def _in_scope() -> bool:
    if _SCOPE == "all":
        return True
    return any("multiprocessing.spawn" in arg for arg in sys.orig_argv)


class _Shadow(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _MODULE or not _in_scope():
            return None
        return importlib.util.spec_from_file_location(fullname, _FILE)


if _MODULE and _FILE:
    sys.meta_path.insert(0, _Shadow())
