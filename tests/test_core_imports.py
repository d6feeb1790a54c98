"""The core stays pure (checked in fresh interpreters); the agent stands alone (from source)."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tui.core.profile.loader import tomllib

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("textual", "asyncssh", "psutil", "pynvml", "tui.remote", "tui.supervise",
             "tui.console", "tui.cli", "tui.sim")


def _modules_after(import_stmt: str) -> set[str]:
    code = f"import sys, json; {import_stmt}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return set(json.loads(out))


def test_core_imports_nothing_heavy() -> None:
    core = sorted(".".join(p.relative_to(ROOT / "tui" / "core").with_suffix("").parts)
                  for p in (ROOT / "tui" / "core").rglob("*.py") if p.stem != "__init__")
    assert "state" in core and "profile.loader" in core
    loaded = _modules_after("; ".join(f"import tui.core.{m}" for m in core))
    bad = {m for m in loaded for f in FORBIDDEN if m == f or m.startswith(f + ".")}
    assert not bad, f"tui.core pulled in {sorted(bad)}"


# What the agent may import on the GPU host: it ships alone (tui/agent zipped as its own package),
# so anything else, `tui` itself included, is missing there. import-linter's contract lists
# forbidden packages; this allow-list also catches a new third-party import or `tui.bootstrap`.
AGENT = "tui.agent"
AGENT_MAY_IMPORT = frozenset(sys.stdlib_module_names) | {"psutil", "pynvml"}
_DYNAMIC = {"import_module", "__import__"}


def _imports(source: str, module: str, package: str) -> Iterator[tuple[int, str, bool]]:
    """(line, module, relative?) for every import in `source`, at any depth: relative ones
    resolved against `package` (one that climbs above the top level keeps its dotted text), and
    the literal names given to importlib.import_module or __import__."""
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, False) for alias in node.names)
            continue
        if isinstance(node, ast.ImportFrom):
            name = "." * node.level + (node.module or "")
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in _DYNAMIC):
            name = node.args[0].value
        else:
            continue
        try:
            yield node.lineno, importlib.util.resolve_name(name, package), name.startswith(".")
        except ImportError:
            yield node.lineno, name, True


def _agent_leaks(source: str, module: str, package: str) -> list[str]:
    """'module:line: name' for each import of `source` that will not exist on the GPU host:
    a relative one must stay inside tui.agent, an absolute one must be the standard library,
    psutil or pynvml (an absolute `tui.agent.x` too is missing: there it is specconsole_agent)."""
    return [f"{module}:{line}: {name}" for line, name, relative in _imports(source, module, package)
            if not (name == AGENT or name.startswith(AGENT + ".") if relative
                    else name.split(".")[0] in AGENT_MAY_IMPORT)]


def test_agent_stands_alone() -> None:
    sources = sorted((ROOT / "tui" / "agent").rglob("*.py"))
    assert len(sources) > 10
    leaks = []
    for path in sources:
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module if parts[-1] == "__init__" else module.rpartition(".")[0]
        leaks += _agent_leaks(path.read_text(), module, package)
    assert not leaks, leaks


@pytest.mark.parametrize(("source", "leak"), [
    ("from ..core.state import RunState", "tui.core.state"),
    ("from .. import core", "tui"),
    ("from ... import x", "..."),
    ("import tui.core.state", "tui.core.state"),
    ("from tui.agent import wire", "tui.agent"),
    ("import textual", "textual"),
    ("import requests", "requests"),
    ("def f():\n    from ..bootstrap import agent\n", "tui.bootstrap"),
    ("import importlib\nimportlib.import_module('tui.remote')", "tui.remote"),
    ("from importlib import import_module\nimport_module('..sim')", "tui.sim"),
    ("__import__('asyncssh')", "asyncssh"),
])
def test_the_agent_check_reports_each_kind_of_leak(source: str, leak: str) -> None:
    assert [r.split(": ", 1)[1] for r in _agent_leaks(source, "tui.agent.x", "tui.agent")] == [leak]


def test_the_agent_check_passes_what_ships() -> None:
    source = ("from __future__ import annotations\nimport os, json\nfrom .wire import emit\n"
              "from . import procfs\nimport psutil\nimport pynvml\n"
              "import importlib.util\nimportlib.util.find_spec('vllm')\n")
    assert _agent_leaks(source, "tui.agent.x", "tui.agent") == []


def test_import_linter_contracts_hold() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:]


def test_every_core_module_stands_in_a_layer_of_the_core() -> None:
    """A module of tui/core that no layers contract of the core names is bound by none of
    them: it could import anything above it unseen."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"]
    named = {name.strip() for c in contracts if c.get("containers") == ["tui.core"]
             for layer in c["layers"] for name in layer.split("|")}
    modules = {p.stem if p.is_file() else p.name for p in (ROOT / "tui" / "core").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__")
               or (p.is_dir() and (p / "__init__.py").exists())}
    assert "state" in modules and "profile" in modules
    assert modules - named == set(), "in no layer of the core's contracts"
