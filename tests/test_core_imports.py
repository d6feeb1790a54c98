"""The core stays pure and the agent stands alone: checked in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("textual", "asyncssh", "psutil", "pynvml", "tui.remote", "tui.supervise",
             "tui.console", "tui.cli", "tui.sim")


def _modules_after(import_stmt: str) -> set[str]:
    code = f"import sys, json; {import_stmt}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return set(json.loads(out))


def test_core_imports_nothing_heavy() -> None:
    core = sorted(p.stem for p in (ROOT / "tui" / "core").glob("*.py") if p.stem != "__init__")
    assert "state" in core and "profile" in core
    loaded = _modules_after("; ".join(f"import tui.core.{m}" for m in core))
    bad = {m for m in loaded for f in FORBIDDEN if m == f or m.startswith(f + ".")}
    assert not bad, f"tui.core pulled in {sorted(bad)}"


@pytest.mark.parametrize("forbidden", ["tui", "textual", "asyncssh"])
def test_agent_stands_alone(forbidden: str) -> None:
    for path in (ROOT / "tui" / "agent").glob("*.py"):
        tree_imports = [line.strip() for line in path.read_text().splitlines()
                        if line.strip().startswith(("import ", "from "))]
        assert not [i for i in tree_imports if i.split()[1].split(".")[0] == forbidden], path


def test_import_linter_contracts_hold() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:]
